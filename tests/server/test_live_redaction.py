"""The server's live events are redacted like its results: a secret split across two writes
never reaches a client in a `stdout` or `stderr` event."""

from __future__ import annotations

import json

import httpx

from tests.splits import OUTPUT_BYTES, REGISTERED, leaked, program


def test_sse_events_never_carry_a_split_secret(alice: httpx.Client) -> None:
    body = {
        "code": program("stdout", "stderr"),
        "secrets": list(REGISTERED),
        "limits": {"output_bytes": OUTPUT_BYTES, "timeout_s": 60},
    }
    text = {"stdout": [], "stderr": []}  # type: dict[str, list[str]]
    result: dict[str, object] = {}
    with alice.stream("POST", "/v1/runs/stream", json=body, timeout=120) as response:
        assert response.status_code == 200
        name = ""
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
                if name in text:
                    text[name].append(data["text"])
                elif name == "result":
                    result = data
    assert result["status"] == "ok", result.get("error")
    for stream, parts in text.items():
        live = "".join(parts)
        assert not leaked(live), stream
        assert live == result[stream]


def test_sse_events_never_carry_a_long_start_or_end_of_a_secret(alice: httpx.Client) -> None:
    """A value shown cut short (any mark, or none), written in pieces: no event carries a
    long start or end of it, and the live text is the result's."""
    value = "hunter2-Zq9xK7Lw-abcdefghijklmnopqrstuvwxyz0123456789"
    code = (
        "import sys, time\n"
        f"v = {value!r}\n"
        "for shown in (v[:40] + ' [...]', v[:30] + '[truncated]', '(more) ' + v[-30:], v[:26]):\n"
        "    for k in range(0, len(shown), 7):\n"
        "        sys.stdout.write(shown[k:k + 7]); sys.stdout.flush(); time.sleep(0.001)\n"
        "    print()\n"
    )
    parts: list[str] = []
    result: dict[str, object] = {}
    with alice.stream(
        "POST", "/v1/runs/stream", json={"code": code, "secrets": [value]}, timeout=120
    ) as response:
        assert response.status_code == 200
        name = ""
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
                if name == "stdout":
                    parts.append(data["text"])
                elif name == "result":
                    result = data
    assert result["status"] == "ok", result.get("error")
    live = "".join(parts)
    assert live == result["stdout"]
    assert live.count("[REDACTED:secret]") == 4, live
    for piece in (value[:16], value[-16:]):
        assert not any(piece in part for part in parts) and piece not in live


def test_sse_events_never_carry_a_start_and_end_shown_on_two_lines(alice: httpx.Client) -> None:
    """A value's 15-character start and end printed on consecutive lines (each under the
    part length), written a few characters at a time: no event carries the start before
    the end shows it is a pair, and the live text is the result's."""
    value = "hunter2-Zq9xK7Lw-abcdefghijklmnopqrstuvwxyz0123456789"
    code = (
        "import sys, time\n"
        f"v = {value!r}\n"
        "shown = 'key ' + v[:15] + '\\n' + v[-15:] + '\\nother\\n'\n"
        "for k in range(0, len(shown), 5):\n"
        "    sys.stdout.write(shown[k:k + 5]); sys.stdout.flush(); time.sleep(0.005)\n"
    )
    parts: list[str] = []
    result: dict[str, object] = {}
    with alice.stream(
        "POST", "/v1/runs/stream", json={"code": code, "secrets": [value]}, timeout=120
    ) as response:
        assert response.status_code == 200
        name = ""
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
                if name == "stdout":
                    parts.append(data["text"])
                elif name == "result":
                    result = data
    assert result["status"] == "ok", result.get("error")
    live = "".join(parts)
    assert live == result["stdout"] == "key [REDACTED:secret]\n[REDACTED:secret]\nother\n"
    assert not any(value[:6] in part or value[-6:] in part for part in parts)
