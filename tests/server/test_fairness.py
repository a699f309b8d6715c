"""One tenant cannot hurt the others through a real server on loopback: file calls on a busy
session do not queue on worker threads, every costly request counts against the key's quotas,
unread streams hold bounded memory and their tenant's slot, sessions are shared by guaranteed
shares, and slow or greedy clients are cut off at the connection. The claims are the server's, so
the sandbox is the fake, except where a real program's output fills the stream (`real_api`)."""

from __future__ import annotations

import gc
import json
import os
import re
import socket
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

import execbox
from execbox.cli import main
from execbox.server import Settings, create_app
from execbox.server.auth import KeyStore
from execbox.server.background import serving
from execbox.server.state import SESSION_START_BURST
from execbox.testing import FakeSandbox
from tests.probes import wait_until
from tests.server.conftest import Api, own_server

# Claims about waits and admission under load: the machine to themselves (make test).
pytestmark = pytest.mark.serial

MIB = 1 << 20


@pytest.fixture(scope="module")
def api(fake_api: Api) -> Iterator[Api]:
    yield fake_api  # alice too


BUSY_CELL = "import time\nprint('go', flush=True)\ntime.sleep({s})"


def _code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


@contextmanager
def _busy(client: httpx.Client, sid: str, seconds: float) -> Iterator[None]:
    """The session runs a cell (streamed on a thread) for the block's duration."""
    started = threading.Event()

    def cell() -> None:
        with client.stream(
            "POST",
            f"/v1/sessions/{sid}/cells/stream",
            json={"code": BUSY_CELL.format(s=seconds), "timeout_s": 60},
        ) as r:
            for line in r.iter_lines():
                if line.startswith("event: stdout"):
                    started.set()

    thread = threading.Thread(target=cell)
    thread.start()
    try:
        assert started.wait(30), "the cell did not start"
        yield
    finally:
        thread.join(timeout=90)


def _raw_request(url: str, head: str, *, rcvbuf: int | None = None) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # before connect, so the window stays small
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((host, int(port)))
    sock.sendall(head.encode())
    return sock


def _read_all(sock: socket.socket, timeout_s: float) -> bytes:
    sock.settimeout(timeout_s)
    chunks = []
    while chunk := sock.recv(1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def _one_response(sock: socket.socket, timeout_s: float) -> bytes:
    """One whole response on a connection the server may keep open after it."""
    sock.settimeout(timeout_s)
    raw = b""
    while b"\r\n\r\n" not in raw:
        raw += sock.recv(1 << 16)
    head = raw.partition(b"\r\n\r\n")[0].lower()
    length = re.search(rb"content-length: *(\d+)", head)
    while not (
        len(raw) >= len(head) + 4 + int(length.group(1))
        if length
        else raw.endswith(b"\r\n0\r\n\r\n")
    ):
        chunk = sock.recv(1 << 16)
        assert chunk, raw
        raw += chunk
    return raw


def _dechunk(raw: bytes) -> bytes:
    """The body of a chunked HTTP/1.1 response."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower(), head
    body = bytearray()
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return bytes(body)
        body += rest[:size]
        rest = rest[size + 2 :]


# ---- finding 3: a busy session holds no worker threads ------------------------------------


def test_file_calls_on_a_busy_session_are_409_and_stall_no_other_tenant(api: Api) -> None:
    _, key = api.key("flood", concurrent=64, sessions=1)
    with api.http(key) as alice, api.http(api.key("victim")[1]) as bob:
        sid = alice.post("/v1/sessions", json={}).json()["session_id"]
        try:
            with _busy(alice, sid, 20):
                # Far more waiting file calls than the server's shared thread pool has threads.
                with ThreadPoolExecutor(45) as pool:
                    flood = [pool.submit(alice.get, f"/v1/sessions/{sid}/files") for _ in range(45)]
                    started = time.monotonic()
                    run = bob.post("/v1/runs", json={"code": "print(1)"})
                    record = bob.get(f"/v1/runs/{run.json()['run_id']}")
                    victim_s = time.monotonic() - started
                    answers = [f.result() for f in flood]
                assert run.status_code == 200 and record.status_code == 200
                assert victim_s < 10, f"another tenant waited {victim_s:.1f} s"
                # Refused at once, or, once the key keeps being refused, spaced out (back-off).
                codes = {_code(a) for a in answers}
                assert "session_busy" in codes and codes <= {"session_busy", "backing_off"}
                assert all(a.headers["retry-after"] for a in answers)
                alice.delete(f"/v1/sessions/{sid}")  # ends the cell now
            files = alice.get(f"/v1/sessions/{sid}/files")
            assert files.status_code == 409 and _code(files) == "session_closed"
        finally:
            alice.delete(f"/v1/sessions/{sid}")


def test_a_cell_waits_for_a_busy_session_and_then_runs(alice: httpx.Client) -> None:
    sid = alice.post("/v1/sessions", json={}).json()["session_id"]
    try:
        with _busy(alice, sid, 1):
            second = alice.post(f"/v1/sessions/{sid}/cells", json={"code": "print('after')"})
        assert second.status_code == 200 and second.json()["stdout"] == "after\n"
        assert alice.get(f"/v1/sessions/{sid}/files").status_code == 200  # the gate is free
    finally:
        alice.delete(f"/v1/sessions/{sid}")


# ---- findings 3 and 6: every costly request counts against the key --------------------------


def test_session_and_file_requests_count_against_the_rate(api: Api) -> None:
    _, key = api.key("rate", rpm=4)
    with api.http(key) as client:
        sid = client.post("/v1/sessions", json={}).json()["session_id"]
        try:
            assert client.put(f"/v1/sessions/{sid}/files/a.txt", content=b"a").status_code == 200
            assert client.get(f"/v1/sessions/{sid}/files").status_code == 200
            assert client.get(f"/v1/sessions/{sid}/files/a.txt").status_code == 200
            refused = client.get(f"/v1/sessions/{sid}/files")
            assert refused.status_code == 429 and _code(refused) == "rate_limited"
            assert "requests per minute" in refused.json()["error"]["message"]
            assert client.post("/v1/sessions", json={}).status_code == 429
        finally:
            api.executor.get_session(sid).close()


def test_in_flight_limit_covers_sessions_and_files(api: Api) -> None:
    _, key = api.key("inflight", concurrent=1, sessions=2)
    with api.http(key) as client:
        sid = client.post("/v1/sessions", json={}).json()["session_id"]
        try:
            with _busy(client, sid, 3):
                created = client.post("/v1/sessions", json={})
                assert created.status_code == 429 and _code(created) == "concurrency_limited"
                files = client.get(f"/v1/sessions/{sid}/files")
                assert files.status_code == 429 and _code(files) == "concurrency_limited"
        finally:
            client.delete(f"/v1/sessions/{sid}")


# ---- finding 4: unread streams ------------------------------------------------------------

PRINT_16_MIB = "import sys\nfor _ in range(16384):\n    sys.stdout.write('x' * 1023 + '\\n')\n"


def test_an_unread_stream_is_bounded_and_holds_its_tenant_slot(real_api: Api) -> None:
    cap = 256 * 1024
    with own_server(real_api.executor, stream_buffer_bytes=cap) as (url, state):
        tenant, key = real_api.key("unread", concurrent=1)
        body = json.dumps({"code": PRINT_16_MIB, "limits": {"output_bytes": 16 * MIB}})
        sock = _raw_request(
            url,
            "POST /v1/runs/stream HTTP/1.1\r\nHost: localhost\r\n"
            f"Connection: close\r\nAuthorization: Bearer {key}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}",
            rcvbuf=16384,
        )
        try:
            # The run ends and is recorded while its client reads nothing.
            assert wait_until(lambda: state.key_store().count_runs(tenant) == 1, 60), "timed out"
            assert state.streams.peak <= cap
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as c:
                held = c.post("/v1/runs", json={"code": "print(1)"})
                assert held.status_code == 429 and _code(held) == "concurrency_limited"
                raw = _dechunk(_one_response(sock, 60))
                events = [
                    block.split("\n", 2)
                    for block in raw.decode().split("\n\n")
                    if block.startswith("event:")
                ]
                names = [e[0].removeprefix("event: ") for e in events]
                assert names.count("overflow") == 1 and names[-1] == "result"
                assert names.index("overflow") < len(names) - 1
                result = json.loads(events[-1][1].removeprefix("data: "))
                assert len(result["stdout"]) == 16 * MIB and not result["stdout_truncated"]
                sock.close()
                assert wait_until(lambda: state.quotas.running(tenant) == 0, 10), "timed out"
                assert c.post("/v1/runs", json={"code": "print(1)"}).status_code == 200
            assert state.streams.held == 0
        finally:
            sock.close()


def _unread_stream(url: str, key: str, body: str) -> tuple[socket.socket, int]:
    """A streamed run whose client reads only the status line: (its socket, the status)."""
    sock = _raw_request(
        url,
        f"POST /v1/runs/stream HTTP/1.1\r\nHost: localhost\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json"
        f"\r\nContent-Length: {len(body)}\r\n\r\n{body}",
        rcvbuf=16384,
    )
    sock.settimeout(30)
    return sock, int(sock.recv(12).split()[1])


def test_unread_streams_hold_only_their_tenants_share_of_the_result_budget(real_api: Api) -> None:
    """One key's unread streams filled the whole result budget and every other tenant's run
    was refused; now a key holds at most its share, and each stream reserves what its result
    really costs the server (several copies of the output), not the output once."""
    with own_server(
        real_api.executor,
        max_result_bytes=200 * MIB,
        tenant_result_bytes=120 * MIB,
        stream_buffer_bytes=64 * 1024,
    ) as (url, state):
        attacker, key = real_api.key("greedy", concurrent=16)
        body = json.dumps(
            {"code": PRINT_16_MIB.replace("16384", "4096"), "limits": {"output_bytes": 4 * MIB}}
        )
        socks: list[socket.socket] = []
        try:
            statuses = []
            for _ in range(16):
                sock, status = _unread_stream(url, key, body)
                socks.append(sock)
                statuses.append(status)
                if status != 200:
                    break
            held = state.results.by_tenant[attacker]
            assert statuses[-1] == 429 and held <= 120 * MIB, (statuses, held)
            refusal = json.loads(_one_response(socks[-1], 10).partition(b"\r\n\r\n")[2])
            assert refusal["error"]["code"] == "result_share"
            assert "--tenant-result-mib" in refusal["error"]["message"]
            # Each admitted stream holds six copies of each 4 MiB output, plus its artifacts.
            assert held == (len(statuses) - 1) * (2 * 6 * 4 * MIB + 10 * MIB)
            with real_api.http(real_api.key("victim")[1]) as victim:
                victim.base_url = httpx.URL(url)
                for _ in range(3):
                    run = victim.post("/v1/runs", json={"code": "print(1)"})
                    assert run.status_code == 200, run.text
        finally:
            for sock in socks:
                sock.close()
        assert wait_until(lambda: state.results.used == 0, 30), "timed out"


# ---- finding 5: sessions are shared fairly ------------------------------------------------


@pytest.mark.fake_sandbox
def test_each_key_is_guaranteed_its_share_of_the_sessions(tmp_path: Path) -> None:
    with execbox.Executor(
        backend=FakeSandbox(),
        cache=False,
        max_sessions=2,
        records=f"sqlite:///{tmp_path}/runs.db",
    ) as executor:
        app = create_app(executor, Settings())
        keys = app.state.execbox.keys
        first = keys.create("first", max_sessions=2)
        second = keys.create("second", max_sessions=2)
        with (
            serving(app) as url,
            httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {first}"}, timeout=60
            ) as a,
            httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {second}"}, timeout=60
            ) as b,
        ):
            # Quotas of 2 + 2 over 2 places: each key is guaranteed one.
            assert a.post("/v1/sessions", json={}).status_code == 201
            greedy = a.post("/v1/sessions", json={})
            assert greedy.status_code == 429 and _code(greedy) == "session_capacity"
            assert "guaranteed 1" in greedy.json()["error"]["message"]
            assert b.post("/v1/sessions", json={}).status_code == 201


def test_a_keys_second_concurrent_session_start_is_429_while_another_key_starts(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start is CPU-bound: one key starts one session at a time (or its own cap from the
    keys file), other keys are not held."""
    flooder, flood_key = api.key("starter")
    _, other_key = api.key("other")
    pair = f"pair-{flooder}"
    pair_key = api.keys.create(pair, session_starts=2)
    release = threading.Event()
    held_once: set[str] = set()
    real_session = api.executor.session

    def held(**kwargs: Any) -> Any:
        tenant = kwargs.get("tenant")
        if tenant in (flooder, pair) and tenant not in held_once:  # the first stays starting
            held_once.add(tenant)
            assert release.wait(60)
        return real_session(**kwargs)

    monkeypatch.setattr(api.executor, "session", held)
    with (
        own_server(api.executor) as (url, state),
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {flood_key}"}) as a,
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {other_key}"}) as b,
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {pair_key}"}) as c,
        ThreadPoolExecutor(2) as pool,
    ):
        firsts = [
            pool.submit(client.post, "/v1/sessions", json={}, timeout=90) for client in (a, c)
        ]
        sids = []
        try:
            assert wait_until(lambda: set(state.sessions._pending) >= {flooder, pair}, 30)
            second = a.post("/v1/sessions", json={})
            assert second.status_code == 429 and _code(second) == "session_starts"
            assert second.headers["retry-after"] == "1"
            assert "--session-starts-per-key" in second.json()["error"]["message"]
            for client in (b, c):  # another key; a key allowed two starts at once
                created = client.post("/v1/sessions", json={}, timeout=60)
                assert created.status_code == 201, created.text
                sids.append(created.json()["session_id"])
        finally:
            release.set()
            answers = [first.result() for first in firsts]
        assert [answer.status_code for answer in answers] == [201, 201]
        sids += [answer.json()["session_id"] for answer in answers]
        for sid in sids:
            api.executor.get_session(sid).close()


@pytest.mark.fake_sandbox
def test_keys_made_before_session_start_caps_get_the_column(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path}/old.db")
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "CREATE TABLE api_keys (name VARCHAR(100) PRIMARY KEY, key_sha256 VARCHAR(64) "
                "NOT NULL UNIQUE, created_at FLOAT NOT NULL, revoked_at FLOAT, max_concurrent "
                "INTEGER NOT NULL, max_sessions INTEGER NOT NULL, rpm INTEGER NOT NULL)"
            )
        )
    keys = KeyStore(engine)
    tenant = keys.authenticate(keys.create("later", session_starts=3))
    assert tenant is not None and tenant.session_starts == 3 and tenant.role == "tenant"
    assert [k.session_starts for k in keys.list()] == [3]


def test_a_key_starts_sessions_at_its_rate_after_a_burst(api: Api) -> None:
    _, key = api.key("burst", sessions=8)
    with (
        own_server(api.executor, session_starts_per_s=0.01) as (url, _),
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as a,
    ):
        sids = []
        try:
            for _ in range(SESSION_START_BURST):
                created = a.post("/v1/sessions", json={})
                assert created.status_code == 201, created.text
                sids.append(created.json()["session_id"])
            refused = a.post("/v1/sessions", json={})
            assert refused.status_code == 429 and _code(refused) == "session_starts"
            assert 1 <= int(refused.headers["retry-after"]) <= 100
            assert "--session-starts-per-s" in refused.json()["error"]["message"]
        finally:
            for sid in sids:
                api.executor.get_session(sid).close()


def test_session_idle_and_lifetime_are_capped_by_server_policy(alice: httpx.Client) -> None:
    for field, value in (("idle_timeout_s", 86400), ("max_lifetime_s", 7 * 86400)):
        refused = alice.post("/v1/sessions", json={field: value})
        assert refused.status_code == 422 and _code(refused) == "session_policy"
        assert "--max-session-" in refused.json()["error"]["message"]


@pytest.mark.fake_sandbox
def test_serve_has_the_session_and_connection_options() -> None:
    help_text = CliRunner().invoke(main, ["serve", "--help"]).output
    for option in (
        "--max-sessions",
        "--max-session-idle",
        "--max-session-lifetime",
        "--header-timeout",
        "--body-timeout",
        "--max-connections-per-client",
        "--stream-buffer-kib",
        "--tenant-result-mib",
        "--listen-backlog",
        "--max-request-bodies-mib",
        "--session-starts-per-key",
        "--session-starts-per-s",
    ):
        assert option in help_text
    assert "--session-starts" in CliRunner().invoke(main, ["keys", "create", "--help"]).output


# ---- finding 10: slow and greedy clients --------------------------------------------------


def test_slow_headers_and_bodies_are_cut_off(api: Api) -> None:
    with own_server(api.executor, header_timeout_s=0.5, body_timeout_s=0.5) as (url, _):
        half_headers = _raw_request(url, "GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        half_body = _raw_request(
            url,
            "PUT /v1/sessions/s/files/a HTTP/1.1\r\nHost: localhost\r\n"
            f"Authorization: Bearer {api.key()[1]}\r\n"
            "Content-Length: 1000\r\n\r\nonly a little",
        )
        silent = _raw_request(url, "")
        try:
            started = time.monotonic()
            answer = _read_all(half_headers, 10)
            assert answer.startswith(b"HTTP/1.1 408") and b"--header-timeout" in answer
            assert _read_all(silent, 10).startswith(b"HTTP/1.1 408")
            assert _read_all(half_body, 10) == b""  # closed: no answer can be framed
            assert time.monotonic() - started < 5
        finally:
            for sock in (half_headers, half_body, silent):
                sock.close()
        with httpx.Client(base_url=url) as client:  # a prompt client is served as before
            assert client.get("/healthz").status_code == 200


def test_an_idle_kept_alive_connection_gets_no_answer_it_did_not_ask_for(api: Api) -> None:
    """Past the header timeout, an idle kept-alive connection is not sent a 408 (a client
    sending its next request then would read it as that request's answer): it still serves
    the next request, and a half-sent next request is still cut off with a 408."""
    with own_server(api.executor, header_timeout_s=0.5) as (url, _):
        get = "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
        for second, answer in ((get, b"HTTP/1.1 200"), ("GET /healthz HTTP/1.1\r\n", b"")):
            sock = _raw_request(url, get)
            try:
                assert _one_response(sock, 10).startswith(b"HTTP/1.1 200")
                time.sleep(1.5)  # three header timeouts with nothing sent
                sock.sendall(second.encode())
                if answer:
                    assert _one_response(sock, 10).startswith(answer)
                else:
                    started = time.monotonic()
                    late = _read_all(sock, 10)
                    assert late.startswith(b"HTTP/1.1 408") and late.count(b"HTTP/1.1") == 1
                    assert time.monotonic() - started < 5
            finally:
                sock.close()


def test_one_client_holds_a_bounded_number_of_connections(api: Api) -> None:
    """Past the cap, a new connection takes the place of the oldest one still waiting for its
    headers: the address never holds more than the cap."""
    with own_server(api.executor, max_connections_per_client=4) as (url, _):
        held = [_raw_request(url, "") for _ in range(4)]
        try:
            with httpx.Client(base_url=url) as probe:
                assert probe.get("/healthz").status_code == 200
            assert _read_all(held[0], 10).startswith(b"HTTP/1.1 503")
        finally:
            for sock in held:
                sock.close()


def _listen_backlog(port: int) -> int:
    """The kernel's accept-queue limit of this process's socket listening on `port` (Linux:
    TCP_INFO's tcpi_sacked holds it for a listening socket)."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        with sock:
            try:
                listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                if listening and sock.getsockname()[1] == port:
                    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 32)
                    return int(struct.unpack_from("I", info, 28)[0])
            except OSError:
                continue
    raise AssertionError(f"no socket listening on port {port}")


def test_a_reconnecting_flood_waits_in_the_kernel_not_in_the_event_loop(api: Api) -> None:
    """A client reconnecting in a loop past its connection cap (740 connections a second) took
    the event loop 140 ms at a time, setting up connections queued 2048 deep; the kernel now
    queues few, and the heap made at start-up is out of the collector's sight (a full
    collection, which such bursts set off, walked all of it: 150 ms)."""
    frozen = gc.get_freeze_count()
    with (
        own_server(api.executor) as (url, _),
        own_server(api.executor, listen_backlog=16) as (other, _),
    ):
        assert _listen_backlog(int(url.rsplit(":", 1)[1])) == 128
        assert _listen_backlog(int(other.rsplit(":", 1)[1])) == 16
        assert gc.get_freeze_count() > frozen
        with httpx.Client(base_url=url) as client:
            assert client.get("/healthz").status_code == 200
