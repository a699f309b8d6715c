"""Graceful shutdown of a real `execbox serve` process: on SIGTERM the run in flight finishes
and is recorded; runs past the grace period are answered `server_shutting_down` (a streamed
one with an error event, a plain one with a 503) and are recorded too; sessions are closed; no
process the server started is left."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from execbox.records import RunStore
from execbox.server.auth import KeyStore


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _descendants(pid: int) -> dict[int, str]:
    """Every live process under `pid`, with its start time (so a reused pid is not confused)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
        starts[int(entry)] = fields[19]
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = starts[child]
            todo.append(child)
    return found


def _still_running(pid: int, start: str) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[19] == start and fields[0] != "Z"


@pytest.fixture
def served(
    executor: object, tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[bytes], str, str, str]]:
    db = f"sqlite:///{tmp_path}/runs.db"
    key = KeyStore(RunStore(db).engine).create("shutdown-test")
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "execbox.cli",
            "serve",
            "--port",
            str(port),
            "--db",
            db,
            "--graceful-timeout",
            "3",
            "--log-level",
            "info",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                if httpx.get(url + "/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not become ready"
            time.sleep(0.1)
        yield proc, url, key, db
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout:
            proc.stdout.close()


def _stream(
    url: str, key: str, code: str, started: threading.Event, events: list[tuple[str, str]]
) -> None:
    try:
        with httpx.stream(
            "POST",
            url + "/v1/runs/stream",
            json={"code": code, "limits": {"timeout_s": 60}},
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        ) as response:
            name = ""
            for line in response.iter_lines():
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    events.append((name, line[6:]))
                    started.set()
    except httpx.TransportError as exc:
        events.append(("transport_error", str(exc)))
    finally:
        started.set()


def test_sigterm_finishes_inflight_runs_closes_sessions_and_leaves_nothing(
    served: tuple[subprocess.Popen[bytes], str, str, str],
) -> None:
    proc, url, key, db = served
    auth = {"Authorization": f"Bearer {key}"}
    session = httpx.post(url + "/v1/sessions", json={}, headers=auth, timeout=30)
    assert session.status_code == 201, session.text
    sid = session.json()["session_id"]
    cell = httpx.post(
        f"{url}/v1/sessions/{sid}/cells", json={"code": "kept = 1"}, headers=auth, timeout=30
    )
    assert cell.json()["status"] == "ok"

    short_started, long_started = threading.Event(), threading.Event()
    short: list[tuple[str, str]] = []
    long: list[tuple[str, str]] = []
    threads = [
        threading.Thread(
            target=_stream,
            args=(
                url,
                key,
                "import time\nprint('started', flush=True)\ntime.sleep(1.5)\nprint('finished')",
                short_started,
                short,
            ),
        ),
        threading.Thread(
            target=_stream,
            args=(
                url,
                key,
                "import time\nprint('started', flush=True)\ntime.sleep(50)",
                long_started,
                long,
            ),
        ),
    ]
    plain: list[httpx.Response] = []

    def post_plain() -> None:
        plain.append(
            httpx.post(
                url + "/v1/runs",
                json={"code": "import time\ntime.sleep(40)", "limits": {"timeout_s": 60}},
                headers=auth,
                timeout=60,
            )
        )

    threads.append(threading.Thread(target=post_plain))
    for thread in threads:
        thread.start()
    assert short_started.wait(30) and long_started.wait(30)
    time.sleep(0.5)  # let the plain request reach the sandbox too
    before = _descendants(proc.pid)
    assert before, "the server should have a fork server and a session running"

    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    for thread in threads:
        thread.join(60)
    code = proc.wait(timeout=60)
    took = time.monotonic() - sent
    log = proc.stdout.read().decode() if proc.stdout else ""
    # uvicorn re-raises the signal once shutdown is complete: killed by SIGTERM, after a
    # lifespan shutdown that ran to its end.
    assert code == -signal.SIGTERM, log

    # The run that fits in the grace period finished and its result reached the client.
    assert short[-1][0] == "result", short
    finished = json.loads(short[-1][1])
    assert finished["status"] == "ok" and finished["stdout"] == "started\nfinished\n"
    # The one that does not is answered with a clear error just before the grace period ends
    # (not a dropped connection) ...
    assert long[-1][0] == "error", long
    assert json.loads(long[-1][1])["error"]["code"] == "server_shutting_down"
    assert all(name != "result" for name, _ in long), long
    assert plain and plain[0].status_code == 503, plain
    assert plain[0].json()["error"]["code"] == "server_shutting_down"
    assert took < 45, "shutdown waited for the 50 s run instead of ending it"
    # ... and both are recorded, the cut one with a status that is not ok.
    store = RunStore(db)
    try:
        assert store.get(finished["run_id"]) is not None
        runs = store.list(limit=20)
        cut = [r for r in runs if "time.sleep(50)" in r.code or "time.sleep(40)" in r.code]
        assert len(cut) == 2 and all(r.status != "ok" for r in cut), [
            (r.code, r.status) for r in runs
        ]
        assert all(r.result.error is not None and r.result.error.message for r in cut)
        cells = [r for r in runs if r.session_id == sid]
        assert len(cells) == 1
    finally:
        store.close()
    # Nothing the server started is still running: fork server, slots, session, runs.
    left = {pid for pid, start in before.items() if _still_running(pid, start)}
    assert not left, f"processes left behind: {left}"
