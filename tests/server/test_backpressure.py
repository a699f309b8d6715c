"""Refusals cost the refused, not the other tenants, through a real server on loopback: an
over-cap list of secrets is refused before its JSON is parsed, a key's requests of any kind in
flight are capped, and a key that keeps being refused is spaced out (on the event loop: the
other tenants' requests go on at once). The claims are the server's: the sandbox is the fake."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from execbox.contract import MAX_SECRETS
from tests.server.conftest import Api

# Claims about waits and admission under load: the machine to themselves (make test).
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def api(fake_api: Api) -> Iterator[Api]:
    yield fake_api


def _code(response: httpx.Response) -> str:
    code: str = response.json()["error"]["code"]
    return code


@pytest.mark.parametrize(
    "path",
    [
        "/v1/runs",
        "/v1/runs/stream",
        "/v1/sessions",
        "/v1/sessions/0123456789abcdef/cells",
        "/v1/sessions/0123456789abcdef/cells/stream",
    ],
)
def test_over_cap_secrets_are_refused_before_the_body_is_parsed(api: Api, path: str) -> None:
    """The list is followed by bytes that are not JSON: only a refusal made before the body is
    decoded can name the secrets (a parse would fail on the rest first)."""
    secrets = json.dumps([f"s{n:05d}" for n in range(MAX_SECRETS + 1)])
    body = b'{"code": "print(1)", "secrets": ' + secrets.encode() + b" and then no JSON at all"
    with api.http(api.key("secrets")[1]) as client:
        refused = client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert refused.status_code == 422, refused.text
    assert f"at most {MAX_SECRETS} per request" in refused.json()["error"]["message"]


def test_secrets_within_the_cap_and_the_word_in_code_pass(api: Api) -> None:
    listed = json.dumps(["a"] * (MAX_SECRETS + 5))
    code = f'x = {{"secrets": {listed}}}\nprint("ran")'
    body = {"code": code, "secrets": [f"s{n:05d}" for n in range(MAX_SECRETS)]}
    with api.http(api.key("secrets")[1]) as client:
        ok = client.post("/v1/runs", json=body)
    assert ok.status_code == 200, ok.text
    assert ok.json()["stdout"] == "ran\n"


def test_a_key_that_keeps_being_refused_is_spaced_out_and_others_are_not(api: Api) -> None:
    _, key = api.key("refused")
    with api.http(key) as flood, api.http(api.key("victim")[1]) as victim:
        answered = 0
        end = time.monotonic() + 3.0
        while time.monotonic() < end:  # invalid bodies, as fast as the server answers
            assert flood.post("/v1/runs", json={"code": 5}).status_code in (422, 429)
            answered += 1
        # Spaced 0.05, 0.1, 0.2 ... 1 s apart: a handful in 3 s, not hundreds.
        assert answered <= 12, answered
        started = time.monotonic()
        assert victim.post("/v1/runs", json={"code": "print(1)"}).status_code == 200
        assert time.monotonic() - started < 1.0
        # A request the server serves ends the back-off: the next ones go at once.
        assert flood.post("/v1/runs", json={"code": "print(1)"}).status_code == 200
        started = time.monotonic()
        for _ in range(3):
            assert flood.post("/v1/runs", json={"code": 5}).status_code == 422
        assert time.monotonic() - started < 1.0


def test_a_request_whose_turn_is_too_far_away_is_refused_with_retry_after(api: Api) -> None:
    _, key = api.key("refused")
    with api.http(key) as flood:
        for _ in range(6):  # spacing grows to 1 s
            flood.post("/v1/runs", json={"code": 5})
        with httpx.Client(
            base_url=api.url,
            headers=flood.headers,
            timeout=60,
            limits=httpx.Limits(max_connections=20),
        ) as many:
            with ThreadPoolExecutor(12) as pool:
                answers = list(
                    pool.map(lambda _: many.post("/v1/runs", json={"code": 5}), range(12))
                )
    codes = [_code(a) for a in answers]
    assert "backing_off" in codes, codes
    assert all(a.headers["retry-after"] for a in answers if _code(a) == "backing_off")


def test_requests_in_flight_of_any_kind_are_capped_per_key(api: Api) -> None:
    """Requests whose bodies have not arrived hold their place; past the cap (4 per run slot,
    plus 4) the next one is refused at once, whatever it asks."""
    _, key = api.key("inflight", concurrent=1)
    host, port = api.url.removeprefix("http://").split(":")
    head = (
        f"POST /v1/runs HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    ).encode()
    held = [socket.create_connection((host, int(port))) for _ in range(8)]
    try:
        for sock in held:
            sock.sendall(head)
        with api.http(key) as client:
            # Served (404) until the server has counted all eight: one probe at a time, so
            # only they can fill the cap.
            deadline = time.monotonic() + 10
            while (refused := client.get("/v1/sessions/0123456789abcdef")).status_code == 404:
                assert time.monotonic() < deadline, "the held requests never filled the cap"
                time.sleep(0.01)
            assert refused.status_code == 429, refused.text
            assert _code(refused) == "too_many_requests"
    finally:
        for sock in held:
            sock.close()
    with api.http(key) as client:
        deadline = time.monotonic() + 10
        while (answer := client.post("/v1/runs", json={"code": "print(1)"})).status_code != 200:
            assert time.monotonic() < deadline, answer.text
            time.sleep(0.2)
