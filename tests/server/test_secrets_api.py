"""Secrets over the HTTP API: a cached result is redacted for the caller that gets it, in
escaped forms too, and a flood of secrets is refused with a 422 naming the limit."""

from __future__ import annotations

import os

import httpx
import pytest

from execbox.contract import MAX_SECRETS, MAX_SECRETS_BYTES


def _secret() -> str:
    return 'k\\e"y \'é-' + os.urandom(6).hex()


def _code(secret: str) -> str:
    return f"import json\nv = {secret!r}\nprint(repr(v), json.dumps([v]), {{'k': v}})\n"


@pytest.mark.parametrize("first_with_secrets", [False, True])
def test_a_cached_run_answers_only_the_same_secrets_in_both_orders(
        alice: httpx.Client, first_with_secrets: bool) -> None:
    secret = _secret()
    bodies = [{"code": _code(secret), "cache": True},
              {"code": _code(secret), "cache": True, "secrets": [secret]}]
    if first_with_secrets:
        bodies.reverse()
    first, again = (alice.post("/v1/runs", json=b).json() for b in bodies)
    # The secrets are part of the cache key: neither set answers the other.
    assert first["status"] == "ok" and not first["cached"] and not again["cached"]
    redacted, plain = (first, again) if first_with_secrets else (again, first)
    assert redacted["stdout"].count("[REDACTED:secret]") == 3
    assert "[REDACTED" not in plain["stdout"]
    hit = alice.post("/v1/runs", json={"code": _code(secret), "cache": True,
                                       "secrets": [secret]}).json()
    assert hit["cached"] and hit["stdout"] == redacted["stdout"]
    for run in (redacted, hit):
        record = alice.get(f"/v1/runs/{run['run_id']}")
        assert record.status_code == 200
        for text in (run["stdout"], record.text):
            assert secret[-12:] not in text


@pytest.mark.parametrize("path", ["/v1/runs", "/v1/runs/stream", "/v1/sessions"])
def test_a_flood_of_secrets_is_refused_with_422_naming_the_limit(alice: httpx.Client,
                                                                  path: str) -> None:
    code = {"code": "print(1)"} if "runs" in path else {}
    # 100,000 secrets do not fit in the test server's request bodies: 413 with its reason.
    flood = alice.post(path, json={**code, "secrets": [f"s{i:07d}" for i in range(100_000)]})
    assert flood.status_code == 413 and "max_request_bytes" in flood.text
    many = alice.post(path, json={**code, "secrets": [f"s{i:07d}" for i in range(1000)]})
    assert many.status_code == 422, many.text
    # Refused from the raw body, before its JSON is decoded (tests/server/test_backpressure.py).
    assert f"at most {MAX_SECRETS} per request (execbox.contract.MAX_SECRETS)" in many.text
    big = alice.post(path, json={**code, "secrets": ["x" * (MAX_SECRETS_BYTES + 1)]})
    assert big.status_code == 422 and "MAX_SECRETS_BYTES" in big.text


def test_a_cell_with_a_flood_of_secrets_is_refused_and_the_session_goes_on(
        alice: httpx.Client) -> None:
    sid = alice.post("/v1/sessions", json={}).json()["session_id"]
    try:
        refused = alice.post(f"/v1/sessions/{sid}/cells",
                             json={"code": "print(1)", "secrets": ["s" * 10] * 300})
        assert refused.status_code == 422 and "MAX_SECRETS" in refused.text
        ok = alice.post(f"/v1/sessions/{sid}/cells", json={"code": "print(1)"})
        assert ok.status_code == 200 and ok.json()["stdout"] == "1\n"
    finally:
        alice.delete(f"/v1/sessions/{sid}")
