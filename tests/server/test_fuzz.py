"""Property-based fuzzing of the API from its own OpenAPI document (schemathesis): whatever a
client sends, valid or not, the server answers with a documented status and content type, a
body matching the schema, and never a 500. Bounded: a few examples per operation and mode."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Err
from schemathesis.generation import GenerationMode
from schemathesis.schemas import APIOperation
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

import execbox
from execbox.server import Settings, create_app
from execbox.server.background import serving
from execbox.server.quotas import Backoff
from execbox.testing import FakeSandbox
from tests.server.conftest import Api

# The document comes from the app itself (building it starts nothing); the calls go to a real
# server over the fake sandbox: the claim is the server's, whatever the code would do.
SCHEMA = schemathesis.openapi.from_dict(create_app().openapi())


def _operations() -> dict[str, APIOperation[Any, Any, Any, Any]]:
    """Every operation in the document by its label; a part that does not parse fails loudly."""
    operations = {}
    for result in SCHEMA.get_all_operations():
        if isinstance(result, Err):
            raise result.err()
        operations[result.ok().label] = result.ok()
    return operations


OPERATIONS = _operations()
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[tuple[str, str]]:
    # A handler that answers any code (the fuzzer's is arbitrary) with an empty success.
    with execbox.Executor(backend=FakeSandbox(), cache=False) as executor:
        app = create_app(executor, Settings(max_request_bytes=64 * 1024))
        keys = app.state.execbox.keys
        key = keys.create("fuzzer", max_concurrent=4, max_sessions=2, rpm=100_000)
        # Negative cases are refused on purpose, and the back-off (tested in test_fairness)
        # would space every later case's requests ~1 s apart: 6 s a case for no claim here.
        app.state.execbox.backoff = Backoff(base_s=0.0)
        with serving(app) as url:
            yield url, key


# Above the sandbox boundary: `make test-unprivileged` runs these too.
pytestmark = pytest.mark.fake_sandbox

# Negative mode mutates inputs; an operation without any (GET /healthz) has none to mutate.
CASES = [
    (label, mode)
    for label in sorted(OPERATIONS)
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE or "{" in label or label.startswith(("POST", "PUT"))
]


@pytest.mark.parametrize(("label", "mode"), CASES)
def test_api_never_500s_and_answers_as_documented(
    label: str, mode: GenerationMode, fuzz_server: tuple[str, str]
) -> None:
    url, key = fuzz_server

    @given(case=OPERATIONS[label].as_strategy(generation_mode=mode))
    @settings(
        max_examples=6,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case: schemathesis.Case[APIOperation[Any, Any, Any, Any]]) -> None:
        case.call_and_validate(
            base_url=url, headers={"Authorization": f"Bearer {key}"}, checks=CHECKS
        )

    fuzz()


def test_every_operation_is_fuzzed() -> None:
    assert len(OPERATIONS) >= 14, sorted(OPERATIONS)


def test_anonymous_callers_get_401_not_500(fake_api: Api) -> None:
    for path in ("/v1/runs", "/v1/sessions", "/v1/runs/stream"):
        response = httpx.post(fake_api.url + path, json={})
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "missing_api_key"
