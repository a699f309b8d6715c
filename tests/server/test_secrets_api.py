"""Secrets over the HTTP API: a cached result is redacted for the caller that gets it, in
escaped forms too, and a flood of secrets is refused with a 422 naming the limit."""

from __future__ import annotations

import hashlib
import json
import os
import uuid

import httpx
import pytest

from execbox.contract import MAX_SECRETS, MAX_SECRETS_BYTES


def _secret() -> str:
    return "k\\e\"y 'é-" + os.urandom(6).hex()


def _code(secret: str) -> str:
    return f"import json\nv = {secret!r}\nprint(repr(v), json.dumps([v]), {{'k': v}})\n"


@pytest.mark.parametrize("first_with_secrets", [False, True])
def test_a_cached_run_answers_only_the_same_secrets_in_both_orders(
    alice: httpx.Client, first_with_secrets: bool
) -> None:
    secret = _secret()
    bodies = [
        {"code": _code(secret), "cache": True},
        {"code": _code(secret), "cache": True, "secrets": [secret]},
    ]
    if first_with_secrets:
        bodies.reverse()
    first, again = (alice.post("/v1/runs", json=b).json() for b in bodies)
    # The secrets are part of the cache key: neither set answers the other.
    assert first["status"] == "ok" and not first["cached"] and not again["cached"]
    redacted, plain = (first, again) if first_with_secrets else (again, first)
    assert redacted["stdout"].count("[REDACTED:secret]") == 3
    assert "[REDACTED" not in plain["stdout"]
    hit = alice.post(
        "/v1/runs", json={"code": _code(secret), "cache": True, "secrets": [secret]}
    ).json()
    assert hit["cached"] and hit["stdout"] == redacted["stdout"]
    for run in (redacted, hit):
        record = alice.get(f"/v1/runs/{run['run_id']}")
        assert record.status_code == 200
        for text in (run["stdout"], record.text):
            assert secret[-12:] not in text


def _stream_result(client: httpx.Client, body: dict[str, object]) -> dict[str, object]:
    with client.stream("POST", "/v1/runs/stream", json=body, timeout=120) as response:
        assert response.status_code == 200
        events = [
            json.loads(line[len("data: ") :])
            for line in response.iter_lines()
            if line.startswith("data: ")
        ]
    result = events[-1]
    assert isinstance(result, dict) and "code_sha256" in result, events[-3:]
    return result


def test_no_answer_carries_the_plain_digest_of_code_holding_a_secret(alice: httpx.Client) -> None:
    """An attack brute-forced a 4-digit secret from the `code_sha256` of a run's result in
    10,000 tries. Every answer names the code as recorded, redacted: a run, its cache hit,
    the stream's final event, the record and a session cell."""
    pin = "4821"
    code = f"pin = {pin!r}\nprint('ok', {uuid.uuid4().hex!r})\n"
    body = {"code": code, "cache": True, "secrets": [pin]}
    fresh = alice.post("/v1/runs", json=body).json()
    hit = alice.post("/v1/runs", json=body).json()
    streamed = _stream_result(alice, {**body, "cache": False})
    sid = alice.post("/v1/sessions", json={"secrets": [pin]}).json()["session_id"]
    try:
        cell = alice.post(f"/v1/sessions/{sid}/cells", json={"code": code}).json()
    finally:
        alice.delete(f"/v1/sessions/{sid}")
    assert not fresh["cached"] and hit["cached"], (fresh, hit)
    stored = code.replace(repr(pin), "'[REDACTED:secret]'")
    want = hashlib.sha256(stored.encode()).hexdigest()
    for answer in (fresh, hit, streamed, cell):
        assert answer["status"] == "ok", answer
        assert answer["code_sha256"] == want, answer
        record = alice.get(f"/v1/runs/{answer['run_id']}").json()
        assert record["code_sha256"] == record["result"]["code_sha256"] == want
        assert record["code"] == stored
    plain = {
        hashlib.sha256(code.replace(pin, f"{n:04d}").encode()).hexdigest() for n in range(10_000)
    }
    assert want not in plain


@pytest.mark.parametrize("path", ["/v1/runs", "/v1/runs/stream", "/v1/sessions"])
def test_a_flood_of_secrets_is_refused_with_422_naming_the_limit(
    fake_alice: httpx.Client, path: str
) -> None:
    code = {"code": "print(1)"} if "runs" in path else {}
    # 100,000 secrets do not fit in the test server's request bodies: 413 with its reason.
    flood = fake_alice.post(path, json={**code, "secrets": [f"s{i:07d}" for i in range(100_000)]})
    assert flood.status_code == 413 and "max_request_bytes" in flood.text
    many = fake_alice.post(path, json={**code, "secrets": [f"s{i:07d}" for i in range(1000)]})
    assert many.status_code == 422, many.text
    # Refused from the raw body, before its JSON is decoded (tests/server/test_backpressure.py).
    assert f"at most {MAX_SECRETS} per request (execbox.contract.MAX_SECRETS)" in many.text
    big = fake_alice.post(path, json={**code, "secrets": ["x" * (MAX_SECRETS_BYTES + 1)]})
    assert big.status_code == 422 and "MAX_SECRETS_BYTES" in big.text


def test_a_cell_with_a_flood_of_secrets_is_refused_and_the_session_goes_on(
    fake_alice: httpx.Client,
) -> None:
    sid = fake_alice.post("/v1/sessions", json={}).json()["session_id"]
    try:
        refused = fake_alice.post(
            f"/v1/sessions/{sid}/cells", json={"code": "print(1)", "secrets": ["s" * 10] * 300}
        )
        assert refused.status_code == 422 and "MAX_SECRETS" in refused.text
        ok = fake_alice.post(f"/v1/sessions/{sid}/cells", json={"code": "print(1)"})
        assert ok.status_code == 200 and ok.json()["stdout"] == "1\n"
    finally:
        fake_alice.delete(f"/v1/sessions/{sid}")
