"""Owns configuration: gateway and worker settings, their sources and their precedence.

Precedence, highest first, written once here:
  1. the request's own fields (applied by the worker, see ``worker/requests/params.py``)
  2. command-line flags (passed to the settings as init values)
  3. ``TOKENFERRY_*`` environment variables (``__`` separates nested keys)
  4. the YAML file named by ``--config`` / ``TOKENFERRY_CONFIG``
  5. the model's ``generation_config.json``
  6. library defaults (the field defaults below, then transformers')

Nothing is read at import time; entry points build settings and pass them down.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from shared.access.apikeys import configured_hash
from shared.protocol import SamplingSpec

BUNDLED_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]


def _split_commas(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class _YamlFromConfigFile(PydanticBaseSettingsSource):
    """Reads the YAML file whose path came from the init values or the environment."""

    def __init__(self, settings_cls: type[BaseSettings], init: InitSettingsSource) -> None:
        super().__init__(settings_cls)
        self._init = init

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ returns the whole mapping

    def __call__(self) -> dict[str, Any]:
        path = self._init.init_kwargs.get("config_file") or os.environ.get("TOKENFERRY_CONFIG")
        if not path:
            return {}
        if not Path(path).is_file():
            raise ValueError(f"config file {path} does not exist")
        return YamlConfigSettingsSource(self.settings_cls, yaml_file=Path(path))()


class _Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TOKENFERRY_", env_nested_delimiter="__", extra="ignore", frozen=True
    )

    config_file: Path | None = Field(None, description="YAML file with the same keys as the flags.")
    redis_url: str = Field(
        DEFAULT_REDIS_URL, description="redis:// or rediss:// URL shared by all processes."
    )
    log_level: LogLevel = "INFO"
    log_format: Literal["text", "json"] = "text"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        assert isinstance(init_settings, InitSettingsSource)
        return init_settings, env_settings, _YamlFromConfigFile(settings_cls, init_settings)

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, url: str) -> str:
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("redis_url must start with redis://, rediss:// or unix://")
        return url


class GatewaySettings(_Settings):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Bearer keys accepted; empty means no authentication."
    )
    request_timeout_s: float = Field(600.0, gt=0, description="Deadline for queue wait plus generation.")
    max_body_bytes: int = Field(4 * 1024 * 1024, gt=0)
    metrics_require_key: bool = Field(
        False, description="Whether GET /metrics needs an API key (scrapers usually have none)."
    )
    docs_require_key: bool = Field(
        True, description="Whether /openapi.json, /docs and /redoc need an API key, like the API."
    )
    max_queued_requests: int = Field(
        256, gt=0, description="Per model: requests waiting beyond this many get 429 at once."
    )
    redis_timeout_s: float = Field(
        2.0,
        gt=0,
        description="Connect timeout to Redis, and the longest a request waits for a free connection"
        " of the pool: while Redis is down or the pool is exhausted, requests get 503.",
    )
    redis_max_connections: int = Field(
        256, ge=1, description="Per gateway process: Redis connections for requests, at most."
    )
    stream_readers: int = Field(
        4, ge=1, le=64, description="Per gateway process: Redis connections relaying all open streams."
    )
    drain_grace_s: float = Field(
        30.0, ge=0, description="On SIGTERM: how long open streams may run on before the gateway exits."
    )
    admin_api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Bearer keys that may also use /admin endpoints."
    )
    auth_cache_s: float = Field(
        2.0, ge=0, description="How long 'are keys configured?' and a key's record are cached."
    )
    rate_limit_rpm: int | None = Field(None, gt=0, description="Default requests per minute per key.")
    rate_limit_tpm: int | None = Field(None, gt=0, description="Default tokens per minute per key.")
    max_tokens_limit: int | None = Field(None, gt=0, description="Largest max_tokens a request may ask.")
    max_n: int = Field(16, ge=1, le=128, description="Most choices (n) a request may ask for each prompt.")
    cors_allow_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Origins browsers may call from; empty turns CORS off."
    )
    max_file_bytes: int = Field(
        100 * 1024 * 1024, gt=0, le=512 * 1024 * 1024, description="Largest file POST /v1/files takes."
    )
    result_retention_s: int = Field(
        7 * 86_400, gt=0, description="How long files, batches and responses are kept once finished."
    )
    max_files_per_tenant: int = Field(
        1000, gt=0, description="Files one tenant may store at once (uploads past it get 429)."
    )
    max_file_bytes_per_tenant: int = Field(
        1024 * 1024 * 1024, gt=0, description="Bytes of files one tenant may store at once (then 429)."
    )
    max_streams_per_tenant: int = Field(
        64, gt=0, description="SSE streams one tenant may hold open at once, on all gateways (then 429)."
    )
    batch_max_inflight: int = Field(
        256, gt=0, description="Per batch: lines enqueued and not yet finished, at most."
    )

    _split_lists = field_validator("api_keys", "admin_api_keys", "cors_allow_origins", mode="before")(
        _split_commas
    )

    @field_validator("api_keys", "admin_api_keys")
    @classmethod
    def _valid_key_entries(cls, entries: list[str]) -> list[str]:
        """Each entry is a secret or ``sha256:<64 hex>``; refuse malformed hashes at start-up."""
        for entry in entries:
            configured_hash(entry)
        return entries


class ClientSettings(_Settings):
    """Settings of the ``tokenferry chat`` / ``complete`` client commands."""

    base_url: str = "http://127.0.0.1:8000/v1"
    api_key: str = Field("not-needed", description="Bearer key sent to the gateway.")
    model: str | None = Field(None, description="Model to call; defaults to the first one served.")


class StatusSettings(_Settings):
    """Settings of ``tokenferry status``."""

    interval_s: float = Field(1.0, gt=0, description="Seconds between refreshes.")


class CompileOptions(BaseModel):
    """Keyword arguments for ``torch.compile`` (mode, fullgraph, dynamic, backend, options)."""

    model_config = ConfigDict(extra="allow", frozen=True)


class WorkerSettings(_Settings):
    model: str = Field(
        BUNDLED_MODEL, description="Hub id, local directory, .gguf file or the bundled default."
    )
    served_model_name: str | None = Field(None, description="Name clients use; defaults to --model.")
    engine: Literal["transformers", "fake"] = "transformers"
    device: str = Field("auto", description="cpu, cuda, cuda:N or auto.")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    attn_implementation: str | None = Field(None, description="eager, sdpa, flash_attention_2, ...")
    chat_template: Path | None = Field(None, description="Jinja2 file overriding the model's template.")
    stop_sequences: Annotated[list[str] | None, NoDecode] = Field(None, description="Server default stop.")
    ignore_eos: bool | None = Field(None, description="Server default for ignore_eos.")
    default_sampling: SamplingSpec = Field(SamplingSpec(), description="Server defaults for sampling.")
    compile: bool = False
    compile_args: CompileOptions = CompileOptions()
    cache_implementation: str | None = Field(None, description="transformers cache: dynamic, static, ...")
    disable_kv_cache: bool = False
    max_model_len: int | None = Field(None, gt=0, description="Context window; defaults to the model's.")
    max_batch_size: int = Field(32, gt=0, description="Sequences decoding together at most.")
    max_batch_tokens: int = Field(
        131_072, gt=0, description="KV-cache budget: rows x longest final length (prompt + max_tokens)."
    )
    max_prefill_tokens: int = Field(512, gt=0, description="Prompt tokens prefilled per step (chunked).")
    max_num_beams: int = Field(
        8, gt=0, description="Widest beam search a request may ask for (never above max_batch_size)."
    )
    prefix_cache_tokens: int = Field(
        4096, ge=0, description="Prompt tokens whose KV is kept for reuse by later prompts (0: off)."
    )
    onednn_linear: bool = Field(
        True, description="On CPU (float32/bfloat16), run Linear layers as oneDNN ops on pre-packed weights."
    )
    torch_threads: int | None = Field(
        None, gt=0, description="torch intra-op threads; default: torch's (one per core)."
    )
    trust_remote_code: bool = False
    cache_dir: Path = Field(
        default_factory=lambda: Path.home() / ".cache" / "tokenferry", description="Converted-model cache."
    )
    # New jobs and aborts wake workers at once (pub/sub), so the poll is a safety net. Every
    # wake-up takes a core from the model's threads: a 50 ms poll cost ~20 ms of time to first
    # token at concurrency 1 on 2 cores (bench), hence a slow default.
    poll_delay_s: float = Field(0.5, gt=0, description="arq queue poll interval (a safety net).")
    heartbeat_interval_s: float = Field(1.0, gt=0, description="Heartbeat period (its jobs' lease).")
    drain_grace_s: float = Field(
        30.0, ge=0, description="On SIGTERM: how long running sequences may finish before handover."
    )
    reap_interval_s: float = Field(1.0, gt=0, description="How often to look for jobs of dead workers.")
    batch_share: float = Field(
        0.75, gt=0, le=1, description="Most of --max-batch-size batch-lane work may fill (interactive first)."
    )
    batch_hold_s: float = Field(
        1.0,
        ge=0,
        description="Batch-lane tokens are published merged at most this often (interactive: every step).",
    )
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="Port of the worker's /metrics (Prometheus); None: off."
    )
    metrics_host: str = Field("127.0.0.1", description="Address the worker's /metrics listens on.")
    worker_id: str | None = None
    fake_script: str = Field(
        "The quick brown fox jumps over the lazy dog. Voilà, café ☕! ",
        description="Text the fake engine generates (engine=fake only).",
    )
    fake_step_delay_s: float = Field(0.0, ge=0)
    fake_load_delay_s: float = Field(
        0.0,
        ge=0,
        description="Seconds the fake engine takes to load (engine=fake only; slow starts in tests).",
    )

    _split_stops = field_validator("stop_sequences", mode="before")(_split_commas)

    @property
    def model_name(self) -> str:
        """The name clients ask for."""
        return self.served_model_name or self.model

    def server_sampling_defaults(self) -> SamplingSpec:
        """The operator's defaults as a spec (None where the operator set nothing)."""
        return self.default_sampling.model_copy(
            update={"stop": self.stop_sequences, "ignore_eos": self.ignore_eos}
        )

    @model_validator(mode="after")
    def _heartbeat_within_ttl(self) -> WorkerSettings:
        from shared.keys import WORKER_TTL_S

        if self.heartbeat_interval_s * 2 > WORKER_TTL_S:
            raise ValueError(f"heartbeat_interval_s must be at most {WORKER_TTL_S / 2} s")
        return self
