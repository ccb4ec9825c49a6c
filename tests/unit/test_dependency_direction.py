"""Dependencies point one way: ``cli -> gateway, worker -> shared``.

The gateway stays light (no torch, transformers or worker), ``shared`` imports no tier
(nor the CLI above them), only ``shared/jobs/arq_seam.py`` imports arq, and gateway routes
reach Redis only through their feature's service. The static checks read every import
statement, function-level ones included, so a lazy import cannot slip past them.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = ROOT / "gateway"
ROUTE_MODULES = sorted(
    path for path in GATEWAY.rglob("*.py") if path.name == "routes.py" or path.name.endswith("_routes.py")
)
# Redis itself, its key names, and the dependencies handing out the Redis client.
REDIS_IMPORTS = ("redis", "shared.keys", "gateway.http.deps.PoolDep", "gateway.http.deps.get_state")
_ARQ_SEAM = Path("shared/jobs/arq_seam.py")

_PROBE = """
import sys
from gateway.http.app import create_app
from shared.settings import GatewaySettings
create_app(GatewaySettings())
heavy = sorted(name for name in sys.modules if name.split(".")[0] in ("torch", "transformers", "worker"))
print(",".join(heavy))
"""


def imported_names(source: str) -> set[str]:
    """Every module a source imports, and each name imported from one as ``module.name``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def sources_of(*folders: str) -> list[Path]:
    """The Python files under ``folders``, relative to the repository root."""
    return [path.relative_to(ROOT) for folder in folders for path in sorted((ROOT / folder).rglob("*.py"))]


def importers_of(packages: tuple[str, ...], folders: tuple[str, ...]) -> list[str]:
    """The files under ``folders`` importing any of ``packages`` (or a module inside one)."""
    return [
        f"{source}: {name}"
        for source in sources_of(*folders)
        for name in sorted(imported_names((ROOT / source).read_text()))
        if name.split(".")[0] in packages
    ]


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


def test_no_module_of_shared_imports_a_tier_or_the_cli() -> None:
    assert importers_of(("gateway", "worker", "cli", "torch", "transformers", "fastapi"), ("shared",)) == []


def test_the_tiers_import_neither_each_other_nor_the_cli() -> None:
    assert importers_of(("worker", "cli", "torch", "transformers"), ("gateway",)) == []
    assert importers_of(("gateway", "cli"), ("worker",)) == []


def test_only_the_seam_imports_arq() -> None:
    sources = sources_of("gateway", "worker", "shared", "cli", "bench", "deploy")
    assert _ARQ_SEAM in sources
    importers = [
        source
        for source in sources
        if "arq" in {name.split(".")[0] for name in imported_names((ROOT / source).read_text())}
    ]
    assert importers == [_ARQ_SEAM]


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
