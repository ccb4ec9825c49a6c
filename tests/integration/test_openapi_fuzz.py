"""schemathesis against /openapi.json of real gateway and fake-engine worker processes: no 5xx, no schema lie.

Every operation the schema declares gets generated requests, valid and invalid
(examples, coverage and fuzzing phases); each response must be no server error,
with a declared status, content type, headers and body schema. Examples per
operation come from ``TOKENFERRY_FUZZ_EXAMPLES`` (default small enough for
``make test``); ``make fuzz`` runs a long campaign (over 1,000 cases).

schemathesis runs as its CLI, against the stack's URL: its pytest plugin does
not work with the pytest we pin (it reads a private ``_nodeid`` that pytest 9 removed).

Left out: the ``positive_data_acceptance`` check, which expects 2xx for every
schema-valid body. Some refusals depend on state no schema can express (the
prompt's length in tokens against the context window, an unknown model), so
those valid-looking requests get a 4xx by design. The worker's 256-token
context keeps fuzzed max_tokens cheap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.redis_server import EmbeddedRedis
from tests.live_stack import served_stack

MODEL = "fuzzed-model"
EXAMPLES = int(os.environ.get("TOKENFERRY_FUZZ_EXAMPLES", "5"))
# `make fuzz` sets this, so a campaign that generated fewer cases than promised fails.
MIN_CASES = int(os.environ.get("TOKENFERRY_FUZZ_MIN_CASES", "0"))
RUN_TIMEOUT_S = 3000
# schemathesis' statuses for a refused schema-violating request, plus 413: a list past its
# maxItems whose items are large (2,049 messages of up to 2,049 parts each) is a body past
# the gateway's size limit, refused before its fields are read.
CONFIG = """
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429",
                     "5xx"]
"""


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    # A Redis of its own: on the session's, the fuzzer would also reach other tests' workers
    # (the e2e real-model one, whose long generations time the run out).
    with EmbeddedRedis() as private_redis, served_stack(private_redis.url, MODEL) as url:
        yield url


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_api_answers_as_its_schema_says(base_url: str, tmp_path: Path) -> None:
    report = tmp_path / "schemathesis.json"
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    run = subprocess.run(
        [
            str(Path(sys.executable).parent / "schemathesis"), "--config-file", str(config),
            "run", f"{base_url}/openapi.json",
            "--max-examples", str(EXAMPLES),
            "--exclude-checks", "positive_data_acceptance",
            "--generation-database", "none",
            "--request-timeout", "30",
            "--report", "json", "--report-json-path", str(report),
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=tmp_path,  # schemathesis keeps a crash cache in its working directory
    )  # fmt: skip
    summary = json.loads(report.read_text()) if report.exists() else {}
    print(f"\nschemathesis: {summary.get('test_cases')} failures={summary.get('failures')}")

    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    assert summary["test_cases"]["generated"] >= MIN_CASES
