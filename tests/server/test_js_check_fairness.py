"""The minimal profile's JavaScript check (a host node per new code, two at once server-wide)
is shared fairly: one key's flood of new code does not queue another key's check behind it."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from execbox.policy import javascript
from tests.server.conftest import Api

PARSE_S = 1.0  # each check, made slow so that the queue, not the CPU, decides the wait


def test_one_keys_new_javascript_does_not_queue_anothers_check(
    fake_api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    parse = javascript.parse

    def slow_parse(code: str, node: str) -> javascript.JsAnalysis:
        time.sleep(PARSE_S)
        return parse(code, node)

    monkeypatch.setattr(javascript, "parse", slow_parse)
    flooder = fake_api.http(fake_api.key("flood", concurrent=8)[1])
    victim = fake_api.http(fake_api.key("victim")[1])

    def run(client: object, code: str) -> float:
        start = time.perf_counter()
        body = {"code": code, "language": "javascript", "profile": "minimal"}
        response = client.post("/v1/runs", json=body)  # type: ignore[attr-defined]
        assert response.status_code == 200, response.text
        return time.perf_counter() - start

    with flooder, victim, ThreadPoolExecutor(8) as pool:
        flood = [pool.submit(run, flooder, f"// {uuid.uuid4().hex}\n1") for _ in range(8)]
        time.sleep(PARSE_S / 5)  # the flood holds both parses and queues six more
        waited = run(victim, f"// {uuid.uuid4().hex}\nconsole.log(1)")
        for f in flood:
            f.result()
    # Its own check, and at most one of the flood's ahead of it in a fair share.
    assert waited < 2.5 * PARSE_S, waited
