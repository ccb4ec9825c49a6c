"""Owns resolving ``--model`` and loading weights: hub id, local dir, .gguf file or the bundled default.

A GGUF file is dequantized by transformers (about 35 s for the bundled 135M model
on 2 CPU cores), so it is converted once into a safetensors directory under
``cache_dir`` and later starts load that in a few seconds. The conversion writes
to a temporary directory and renames it into place under a file lock, so two
workers starting together neither convert twice nor see a half-written cache.

Slow steps say so: the conversion logs its start and its duration around
transformers' own bar, and a hub download shows huggingface_hub's bars on a
terminal, log lines elsewhere (``worker/model/progress.py``).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from shared.settings import WorkerSettings
from worker.model.progress import download_progress
from worker.model.sources import ModelLoadError, ModelSource, resolve_source

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    generation_config: dict[str, Any]  # only the fields the model's config sets explicitly
    max_model_len: int
    device: torch.device
    # The directory of the files loaded (a hub id's cached snapshot); None where it cannot be told.
    checkpoint: Path | None = None


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {requested} asked for, but CUDA is not available")
    return device


def pick_dtype(requested: str, device: torch.device) -> torch.dtype:
    """``auto``: bf16 (fp16 without it) on CUDA; on CPU bf16 where the cores run it natively, else fp32.

    Measured on a 2-core EPYC with AVX512_BF16, SmolLM2-135M through the batched engine, with
    oneDNN-packed Linears in both: a decode step of 1 row took 26 ms in bf16 against 36 in fp32,
    of 32 rows 69 against 89 ms. vLLM's CPU build chooses the same way. Without those
    instructions bf16 is emulated and slower than fp32.
    """
    if requested != "auto":
        return getattr(torch, requested)  # type: ignore[no-any-return]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_runs_bf16() else torch.float32


def cpu_runs_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU has bf16 instructions (AVX512_BF16 or AMX) and torch's oneDNN uses them."""
    try:
        flags = set(cpuinfo.read_text().split())
    except OSError:  # not Linux: no way to tell here, so the safe choice
        return False
    has_bf16 = bool(flags & {"avx512_bf16", "amx_bf16"})
    return has_bf16 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def converted_gguf_dir(source: ModelSource, cache_dir: Path) -> Path:
    """The safetensors copy of a GGUF file, converting it on first use."""
    assert source.gguf_file is not None
    gguf_path = Path(source.location) / source.gguf_file
    stat = gguf_path.stat()
    fingerprint = hashlib.sha256(
        f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()
    ).hexdigest()
    target = cache_dir / "models" / f"{gguf_path.stem}-{fingerprint[:12]}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").is_file():
            _convert_gguf(source, target)
    return target


def _convert_gguf(source: ModelSource, target: Path) -> None:
    started = time.monotonic()
    # transformers draws its own bar over the tensors; these lines bracket it in the log.
    logger.info("converting %s once into %s (later starts load the copy)...", source.gguf_file, target)
    tokenizer = AutoTokenizer.from_pretrained(source.location, gguf_file=source.gguf_file)
    model = AutoModelForCausalLM.from_pretrained(source.location, gguf_file=source.gguf_file)
    # The weights are already dequantized; the GGUF quantizer only blocks save_pretrained.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("converted %s in %.0f s", source.gguf_file, time.monotonic() - started)


def load_model(settings: WorkerSettings) -> LoadedModel:
    """Load the model and tokenizer named by the settings onto the chosen device and dtype."""
    started = time.monotonic()
    source = resolve_source(settings.model)
    location = str(converted_gguf_dir(source, settings.cache_dir)) if source.gguf_file else source.location
    device = pick_device(settings.device)
    dtype = pick_dtype(settings.dtype, device)
    # A revision names a hub commit: a converted GGUF directory has none.
    hub = {"revision": settings.revision} if settings.revision and not source.gguf_file else {}
    common = {"trust_remote_code": settings.trust_remote_code, **hub}
    options: dict[str, Any] = {"dtype": dtype, **common}
    if settings.attn_implementation:
        options["attn_implementation"] = settings.attn_implementation
    if source.is_hub_id:
        logger.info("loading %s from the Hugging Face Hub or its local cache...", settings.model)
        progress = download_progress()
        if progress is not None:
            options["tqdm_class"] = progress
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, **common)
        model = AutoModelForCausalLM.from_pretrained(location, **options)
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"cannot load model {settings.model!r}: {error}") from error
    model.to(device).eval()  # type: ignore[arg-type]
    logger.info("loaded %s on %s as %s in %.0f s", settings.model, device, dtype, time.monotonic() - started)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        generation_config=model.generation_config.to_diff_dict() if model.generation_config else {},
        max_model_len=settings.max_model_len or _context_window(model, tokenizer),
        device=device,
        checkpoint=_checkpoint_dir(location, source.is_hub_id, settings.revision),
    )


def _checkpoint_dir(location: str, is_hub_id: bool, revision: str | None) -> Path | None:
    """Where the loaded files lie: the directory itself, or a hub id's snapshot in the local cache."""
    if not is_hub_id:
        return Path(location)
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(location, "config.json", revision=revision)
    return Path(config).parent if isinstance(config, str) else None


def _context_window(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> int:
    candidates = [getattr(model.config, "max_position_embeddings", None), tokenizer.model_max_length]
    # Tokenizers without a limit report a huge sentinel (int(1e30)); ignore it.
    sane = [value for value in candidates if isinstance(value, int) and 0 < value < 10_000_000]
    if not sane:
        raise ModelLoadError("cannot tell the model's context window: pass --max-model-len")
    return min(sane)
