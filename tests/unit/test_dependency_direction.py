"""Dependencies point one way: the gateway stays light (no torch, transformers or worker), shared imports
no tier, and gateway routes reach Redis only through their feature's service."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

_PROBE = """
import sys
from gateway.http.app import create_app
from shared.settings import GatewaySettings
create_app(GatewaySettings())
heavy = sorted(name for name in sys.modules if name.split(".")[0] in ("torch", "transformers", "worker"))
print(",".join(heavy))
"""


def test_gateway_app_imports_no_torch_transformers_or_worker() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == ""


def test_shared_never_imports_a_tier() -> None:
    probe = "import sys, shared.protocol, shared.jobs.streams, shared.registry, shared.settings,"
    probe += " shared.jobs.jobqueue;"
    probe += "print([m for m in sys.modules if m.split('.')[0] in ('gateway', 'worker', 'torch', 'fastapi')])"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]"


GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
ROUTE_MODULES = sorted(
    path for path in GATEWAY.rglob("*.py") if path.name == "routes.py" or path.name.endswith("_routes.py")
)
# Redis itself, its key names, and the dependencies handing out the Redis client.
REDIS_IMPORTS = ("redis", "shared.keys", "gateway.http.deps.PoolDep", "gateway.http.deps.get_state")


def imported_names(source: str) -> set[str]:
    """Every module a source imports, and each name imported from one as ``module.name``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_gateway_has_route_modules_to_check() -> None:
    assert len(ROUTE_MODULES) >= 8


@pytest.mark.parametrize("path", ROUTE_MODULES, ids=lambda path: str(path.relative_to(GATEWAY)))
def test_routes_call_their_feature_service_never_redis_or_key_names(path: Path) -> None:
    """The rule "routes call their feature's service, never Redis or key names directly": a route
    module imports neither ``redis`` nor ``shared.keys``, nor takes the Redis client (``PoolDep``,
    ``get_state``)."""
    imported = imported_names(path.read_text())
    reaching_redis = sorted(
        name
        for name in imported
        for banned in REDIS_IMPORTS
        if name == banned or name.startswith(banned + ".")
    )
    assert reaching_redis == []
