"""The server's live events are redacted like its results: a secret split across two writes
never reaches a client in a `stdout` or `stderr` event."""

from __future__ import annotations

import json

import httpx
from splits import OUTPUT_BYTES, REGISTERED, leaked, program


def test_sse_events_never_carry_a_split_secret(alice: httpx.Client) -> None:
    body = {"code": program("stdout", "stderr"), "secrets": list(REGISTERED),
            "limits": {"output_bytes": OUTPUT_BYTES, "timeout_s": 60}}
    text = {"stdout": [], "stderr": []}  # type: dict[str, list[str]]
    result: dict[str, object] = {}
    with alice.stream("POST", "/v1/runs/stream", json=body, timeout=120) as response:
        assert response.status_code == 200
        name = ""
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: "):])
                if name in text:
                    text[name].append(data["text"])
                elif name == "result":
                    result = data
    assert result["status"] == "ok", result.get("error")
    for stream, parts in text.items():
        live = "".join(parts)
        assert not leaked(live), stream
        assert live == result[stream]
