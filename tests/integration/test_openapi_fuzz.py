"""schemathesis against /openapi.json of real gateway and fake-engine worker processes: no 5xx, no schema lie.

Every operation the schema declares gets generated requests, valid and invalid;
each response must be no server error, with a declared status, content type,
headers and body schema. Examples per operation come from
``TOKENFERRY_FUZZ_EXAMPLES`` (default small enough for ``make test``);
``make fuzz`` runs a long campaign (over 1,000 cases) and prints the count.

Left out: schemathesis's ``positive_data_acceptance`` check, which expects 2xx for
every schema-valid body. Some refusals depend on state no schema can express
(the prompt's length in tokens against the context window, an unknown model,
a feature refused with a named 400), so those valid-looking requests get 4xx by design.
The worker's context is 256 tokens, which keeps fuzzed max_tokens cheap.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance
from schemathesis.schemas import BaseSchema

from shared.redis_server import EmbeddedRedis
from tests.live_stack import served_stack

MODEL = "fuzzed-model"
EXAMPLES = int(os.environ.get("TOKENFERRY_FUZZ_EXAMPLES", "15"))


@pytest.fixture(scope="module")
def base_url(redis_server: EmbeddedRedis) -> Iterator[str]:
    with served_stack(redis_server.url, MODEL) as url:
        yield url


@pytest.fixture(scope="module")
def api_schema(base_url: str) -> BaseSchema:
    return schemathesis.openapi.from_url(f"{base_url}/openapi.json")


@pytest.fixture(scope="module")
def case_count() -> Iterator[list[int]]:
    count = [0]
    yield count
    print(f"\nschemathesis: {count[0]} cases, {EXAMPLES} examples per operation")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_api_answers_as_its_schema_says(case: schemathesis.Case, case_count: list[int]) -> None:
    case_count[0] += 1
    case.call_and_validate(excluded_checks=[positive_data_acceptance], timeout=30)
