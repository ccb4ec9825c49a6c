"""The gateway stays light: creating the app imports neither torch nor transformers nor the worker;
and only ``shared/jobs/arq_seam.py`` imports arq."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

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


_ARQ_SEAM = Path("shared/jobs/arq_seam.py")


def _imports_arq(source: Path) -> bool:
    for node in ast.walk(ast.parse(source.read_text(), filename=str(source))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        if any(name == "arq" or name.startswith("arq.") for name in names):
            return True
    return False


def test_only_the_seam_imports_arq() -> None:
    root = Path(__file__).resolve().parents[2]
    sources = [
        path.relative_to(root)
        for folder in ("gateway", "worker", "shared", "cli", "bench", "deploy")
        for path in sorted((root / folder).rglob("*.py"))
    ]
    assert _ARQ_SEAM in sources
    assert [source for source in sources if _imports_arq(root / source)] == [_ARQ_SEAM]
