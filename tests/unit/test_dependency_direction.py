"""The gateway stays light: creating the app imports neither torch nor transformers nor the worker."""

from __future__ import annotations

import subprocess
import sys

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
