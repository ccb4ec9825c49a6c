"""Resolving --model: the bundled default, .gguf files, directories, hub ids, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.settings import BUNDLED_MODEL
from worker.model.sources import BUNDLED_GGUF, ModelLoadError, ModelSource, resolve_source


def test_bundled_default_resolves_to_the_packaged_gguf() -> None:
    source = resolve_source(BUNDLED_MODEL)
    assert source.gguf_file == BUNDLED_GGUF
    assert (Path(source.location) / BUNDLED_GGUF).is_file()


def test_local_directory_and_hub_id(tmp_path: Path) -> None:
    assert resolve_source(str(tmp_path)) == ModelSource(str(tmp_path))
    assert resolve_source("HuggingFaceTB/SmolLM2-135M-Instruct") == ModelSource(
        "HuggingFaceTB/SmolLM2-135M-Instruct"
    )


def test_gguf_file_splits_into_directory_and_file_name(tmp_path: Path) -> None:
    gguf = tmp_path / "model.Q4.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_source(str(gguf)) == ModelSource(str(tmp_path), "model.Q4.gguf")


@pytest.mark.parametrize("model", ["/nonexistent/model", "./missing", "/tmp/absent.gguf"])
def test_missing_paths_are_clear_errors(model: str) -> None:
    with pytest.raises(ModelLoadError, match=r"model directory|does not exist"):
        resolve_source(model)
