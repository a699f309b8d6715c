"""Attacks on the E2B-compatible face as a hostile tenant, through a real `execbox serve --e2b`
on loopback over the real sandbox, spoken in raw HTTP (the SDKs would not send most of it)."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import pytest

import execbox
from execbox.server import Settings, create_app
from execbox.server.background import serving
from execbox.server.quotas import REQUESTS_PER_SLOT
from execbox.server.state import ServerState

from .e2b_support import MAX_REQUEST_BYTES, E2BServer, e2b_serving, use_sdk

pytestmark = pytest.mark.slow
PER_CLIENT = 4  # connections one address may hold before it authenticates


@dataclass
class Box:
    id: str
    token: str

    def headers(self) -> dict[str, str]:
        return {"E2b-Sandbox-Id": self.id, "X-Access-Token": self.token}


class Server(E2BServer):
    def __init__(self, url: str, state: ServerState) -> None:
        super().__init__(url, state)
        self.http = httpx.Client(base_url=url + "/e2b", timeout=60)

    def key(self, prefix: str = "attack", max_sessions: int = 4) -> tuple[str, str]:
        return super().key(prefix, max_sessions)

    def create(self, key: str) -> Box:
        answer = self.http.post(
            "/v2/sandboxes", json={"templateID": "base", "timeout": 120}, headers={"X-API-KEY": key}
        )
        assert answer.status_code == 201, answer.text
        body = answer.json()
        return Box(body["sandboxID"], body["envdAccessToken"])

    def kill(self, key: str, box: Box) -> None:
        self.http.delete(f"/sandboxes/{box.id}", headers={"X-API-KEY": key})

    def fs(self, box: Box, method: str, body: bytes) -> httpx.Response:
        headers = {**box.headers(), "Content-Type": "application/json"}
        return self.http.post(f"/filesystem.Filesystem/{method}", content=body, headers=headers)

    def execute(self, box: Box, code: str) -> list[dict[str, object]]:
        answer = self.http.post("/execute", json={"code": code}, headers=box.headers())
        assert answer.status_code == 200, answer.text
        return [json.loads(line) for line in answer.text.splitlines()]


@pytest.fixture(scope="module")
def server(
    executor: execbox.Executor, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    del executor  # proves the host can sandbox (else the module is skipped), before its own
    with e2b_serving(
        tmp_path_factory,
        request_bodies_bytes=2 * MAX_REQUEST_BYTES,  # the least the server accepts
        max_connections_per_client=PER_CLIENT,
    ) as (url, state):
        server = Server(url, state)
        try:
            yield server
        finally:
            server.http.close()


@pytest.fixture
def tenant(server: Server) -> Iterator[tuple[str, str]]:
    name, key = server.key()
    yield name, key
    server.revoke(name)


def _write(server: Server, box: Box, path: str, data: bytes) -> httpx.Response:
    return server.http.post(
        "/files",
        params={"path": path},
        content=data,
        headers={**box.headers(), "Content-Type": "application/octet-stream"},
    )


def test_moving_a_file_onto_itself_keeps_it(server: Server, tenant: tuple[str, str]) -> None:
    _, key = tenant
    box = server.create(key)
    try:
        assert _write(server, box, "/home/user/keep.txt", b"precious").status_code == 200
        for destination in ("/home/user/keep.txt", "/workspace/keep.txt", "keep.txt"):
            body = json.dumps({"source": "/home/user/keep.txt", "destination": destination})
            moved = server.fs(box, "Move", body.encode())
            assert moved.status_code == 200, moved.text
            read = server.http.get("/files", params={"path": "keep.txt"}, headers=box.headers())
            assert (read.status_code, read.content) == (200, b"precious"), destination
    finally:
        server.kill(key, box)


def test_a_filesystem_call_that_is_not_a_json_object_is_invalid(
    server: Server, tenant: tuple[str, str]
) -> None:
    _, key = tenant
    box = server.create(key)
    try:
        for method, body in (
            ("Stat", b"[]"),
            ("Stat", b'"x"'),
            ("Stat", b"null"),
            ("Stat", b'{"path": 1}'),
            ("Move", b'{"source": ["a"], "destination": "b"}'),
            ("ListDir", b'{"path": "/home/user", "depth": "9e9999"}'),
            ("ListDir", b'{"path": "/home/user", "depth": 1e999}'),
            ("ListDir", b'{"path": "/home/user", "depth": [1]}'),
        ):
            answer = server.fs(box, method, body)
            assert answer.status_code == 400, (body, answer.status_code, answer.text)
            assert answer.json()["code"] == "invalid_argument"
    finally:
        server.kill(key, box)


def test_a_revoked_keys_sandbox_answers_no_more_calls(
    server: Server, tenant: tuple[str, str]
) -> None:
    # `execbox keys revoke` takes effect on the next request: the sandbox's access token was
    # given to that key, so it goes with it.
    name, key = tenant
    box = server.create(key)
    try:
        assert server.execute(box, "print(1)")[0]["text"] == "1\n"
        assert server.state.keys is not None
        server.state.keys.revoke(name)
        ran = server.http.post("/execute", json={"code": "print(2)"}, headers=box.headers())
        assert ran.status_code == 401 and "revoked" in ran.json()["message"]
        read = server.http.get("/files", params={"path": "x"}, headers=box.headers())
        assert read.status_code == 401
        command = server.http.post(
            "/process.Process/Start",
            content=struct.pack(">BI", 0, 2) + b"{}",
            headers={**box.headers(), "Content-Type": "application/connect+json"},
        )
        assert command.status_code == 401
    finally:
        server.kill(key, box)


def test_paths_outside_the_workspace_and_foreign_tokens_are_refused(
    server: Server, tenant: tuple[str, str]
) -> None:
    _, key = tenant
    other_name, other_key = server.key()
    mine, theirs = server.create(key), server.create(other_key)
    try:
        for path in ("/etc/passwd", "/home/user/../../etc/passwd", "/home/username/x", "/"):
            read = server.http.get("/files", params={"path": path}, headers=mine.headers())
            assert read.status_code == 400, (path, read.text)
        for path in ("../x", "a/../../x", "/home/user/\x00x"):
            wrote = _write(server, mine, path, b"x")
            assert wrote.status_code == 400, (path, wrote.text)
        # My token with their id, their token with mine: refused either way.
        crossed = {"E2b-Sandbox-Id": theirs.id, "X-Access-Token": mine.token}
        assert server.http.get("/health", headers=crossed).status_code == 401
        # Two ids: the token must match the one the server acts on.
        doubled = httpx.Headers(
            [("E2b-Sandbox-Id", mine.id), ("E2b-Sandbox-Id", theirs.id)]
            + [("X-Access-Token", mine.token)]
        )
        answer = server.http.post("/execute", json={"code": "print(7)"}, headers=doubled)
        assert answer.status_code in (200, 401)
        if answer.status_code == 200:  # it acted on mine: the cell ran in my session
            assert server.execute(mine, "print(8)")[-1]["execution_count"] == 2
        # Their sandbox through the control plane with my key: as if it did not exist.
        for method, path in (
            ("GET", f"/sandboxes/{theirs.id}"),
            ("POST", f"/sandboxes/{theirs.id}/timeout"),
            ("POST", f"/v2/sandboxes/{theirs.id}/connect"),
            ("DELETE", f"/sandboxes/{theirs.id}"),
        ):
            answer = server.http.request(
                method, path, json={"timeout": 5}, headers={"X-API-KEY": key}
            )
            assert answer.status_code == 404, (method, path, answer.text)
        assert server.http.get("/health", headers=theirs.headers()).status_code == 204
    finally:
        server.kill(key, mine)
        server.kill(other_key, theirs)
        assert server.state.keys is not None
        server.state.keys.revoke(other_name)


def _held(server: Server, path: str, headers: dict[str, str], length: int) -> socket.socket:
    """A connection that sends a POST's headers declaring `length` bytes of body, then none."""
    parts = urlsplit(server.url)
    sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80))
    lines = [f"POST /e2b{path} HTTP/1.1", "Host: localhost", "Content-Type: application/json"]
    lines += [f"Content-Length: {length}", *(f"{k}: {v}" for k, v in headers.items())]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return sock


def _refusal(sock: socket.socket) -> tuple[int, dict[str, object]]:
    """The answer to a request whose body was never sent, read to the server's close: a
    timeout here means the server was waiting for the body."""
    sock.settimeout(30)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def _request(sock: socket.socket, request: bytes) -> bytes:
    """Send a body-less request on a kept-alive connection; its answer's status line."""
    sock.sendall(request)
    sock.settimeout(30)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head.split(b"\r\n")[0]


def test_a_stranger_cannot_block_every_e2b_upload(server: Server, tenant: tuple[str, str]) -> None:
    _, key = tenant
    box = server.create(key)
    # No key, no token, or a wrong one: headers that declare the largest body the server
    # takes, then nothing. Each is refused before its body is booked or read.
    strangers = [
        (_held(server, "/execute", {}, MAX_REQUEST_BYTES), 502),
        (_held(server, "/v2/sandboxes", {}, MAX_REQUEST_BYTES), 401),
        (_held(server, "/v2/sandboxes", {"X-API-KEY": "nope"}, MAX_REQUEST_BYTES), 401),
        (_held(server, "/files", {"E2b-Sandbox-Id": box.id}, MAX_REQUEST_BYTES), 401),
    ]
    try:
        for sock, status in strangers:
            answer = _refusal(sock)
            assert answer[0] == status and answer[1]["code"] == status, answer
            assert isinstance(answer[1]["message"], str)
        assert server.state.bodies.used() == 0
        assert server.execute(box, "1")[-1]["type"] == "number_of_executions"
        wrote = _write(server, box, "small.txt", b"tiny")
        assert wrote.status_code == 200, wrote.text
        other = server.create(key)
        server.kill(key, other)
    finally:
        for sock, _ in strangers:
            sock.close()
        server.kill(key, box)


@pytest.mark.parametrize("token", [None, "wrong", "their"])
def test_a_wrong_token_is_refused_before_the_body_is_read(
    server: Server, tenant: tuple[str, str], token: str | None
) -> None:
    _, key = tenant
    other_name, other_key = server.key()
    box, theirs = server.create(key), server.create(other_key)
    given = {"E2b-Sandbox-Id": box.id}
    if token is not None:
        given["X-Access-Token"] = theirs.token if token == "their" else "wrong"
    try:
        for path in (
            "/execute",
            "/contexts",
            "/files?path=x",
            "/filesystem.Filesystem/Stat",
            "/process.Process/Start",
        ):
            with contextlib.closing(_held(server, path, given, MAX_REQUEST_BYTES)) as sock:
                status, body = _refusal(sock)
            assert (status, body["code"]) == (401, 401), (path, body)
            assert "access token" in str(body["message"])
        assert server.state.bodies.used() == 0
    finally:
        server.kill(key, box)
        server.kill(other_key, theirs)
        assert server.state.keys is not None
        server.state.keys.revoke(other_name)


def test_a_tenants_unsent_bodies_are_booked_under_its_own_key(
    server: Server, tenant: tuple[str, str]
) -> None:
    # Each key may hold half of the server's budget for bodies: this one holds all of its half
    # with a body it never sends, and only its own uploads wait for it.
    _, key = tenant
    other_name, other_key = server.key()
    mine, theirs = server.create(key), server.create(other_key)
    held = _held(server, "/files?path=big", mine.headers(), MAX_REQUEST_BYTES)
    try:
        deadline = time.monotonic() + 30
        while server.state.bodies.used() < MAX_REQUEST_BYTES:
            assert time.monotonic() < deadline, "the held body was never booked"
            time.sleep(0.01)
        busy = _write(server, mine, "small.txt", b"tiny")
        assert busy.status_code == 503, busy.text
        assert busy.json()["code"] == 503 and "request bodies" in busy.json()["message"]
        assert busy.headers["Retry-After"] == "1"
        wrote = _write(server, theirs, "small.txt", b"tiny")
        assert wrote.status_code == 200, wrote.text
        assert server.execute(theirs, "1")[-1]["type"] == "number_of_executions"
    finally:
        held.close()
        server.kill(key, mine)
        server.kill(other_key, theirs)
        assert server.state.keys is not None
        server.state.keys.revoke(other_name)
    deadline = time.monotonic() + 30
    while server.state.bodies.used():
        assert time.monotonic() < deadline, "the held body's booking was never given back"
        time.sleep(0.01)


def test_e2b_requests_in_flight_count_against_the_key(server: Server) -> None:
    assert server.state.keys is not None
    name = f"attack-{uuid.uuid4().hex[:8]}"
    key = server.state.keys.create(name, max_concurrent=1, max_sessions=1)
    most = REQUESTS_PER_SLOT * 2  # the in-flight cap of a key with one run slot
    box = server.create(key)
    held: list[socket.socket] = []
    try:
        for n in range(1, most + 1):  # bodies never sent: each request stays in flight
            held.append(_held(server, "/files?path=x", box.headers(), 10))
            deadline = time.monotonic() + 30
            while server.state.bodies.used() < 10 * n:  # admitted: its connection is trusted
                assert time.monotonic() < deadline, "the held request was never admitted"
                time.sleep(0.01)
        deadline = time.monotonic() + 30
        while True:
            answer = _write(server, box, "small.txt", b"tiny")
            if answer.status_code == 429:
                break
            assert time.monotonic() < deadline, "the held requests never filled the cap"
            time.sleep(0.05)
        assert answer.json()["code"] == 429 and "in flight" in answer.json()["message"]
        listed = server.http.get("/v2/sandboxes", headers={"X-API-KEY": key})
        assert listed.status_code == 429, listed.text
    finally:
        for sock in held:
            sock.close()
    try:
        deadline = time.monotonic() + 30
        while (answer := _write(server, box, "small.txt", b"tiny")).status_code != 200:
            assert time.monotonic() < deadline, answer.text
            time.sleep(0.2)
    finally:
        server.kill(key, box)
        server.state.keys.revoke(name)


def test_authenticated_e2b_connections_are_not_evicted_by_strangers(
    server: Server, tenant: tuple[str, str]
) -> None:
    """One address, a tenant and a stranger: the tenant's kept-alive E2B connections, once
    authenticated, neither count toward the address's cap nor are evicted when strangers fill
    it."""
    _, key = tenant
    box = server.create(key)
    parts = urlsplit(server.url)
    address = (parts.hostname or "127.0.0.1", parts.port or 80)
    requests = [
        f"GET /e2b/health HTTP/1.1\r\nHost: localhost\r\nE2b-Sandbox-Id: {box.id}\r\n"
        f"X-Access-Token: {box.token}\r\n\r\n".encode(),
        f"GET /e2b/v2/sandboxes HTTP/1.1\r\nHost: localhost\r\nX-API-KEY: {key}\r\n\r\n".encode(),
    ]
    keyed: list[tuple[socket.socket, bytes]] = []
    waiting: list[socket.socket] = []
    try:
        for i in range(PER_CLIENT + 1):  # every one is served and stays open (keep-alive)
            request = requests[i % 2]
            keyed.append((sock := socket.create_connection(address), request))
            assert _request(sock, request).split()[1] in (b"200", b"204")
        waiting = [socket.create_connection(address) for _ in range(PER_CLIENT)]
        time.sleep(0.2)
        for sock, request in keyed:
            assert _request(sock, request).split()[1] in (b"200", b"204")
    finally:
        for sock in waiting:
            sock.close()
        for sock, _ in keyed:
            sock.close()
        server.kill(key, box)


def test_without_e2b_the_face_is_not_there(executor: execbox.Executor) -> None:
    with serving(create_app(executor, Settings())) as url:
        for method, path in (
            ("POST", "/e2b/v2/sandboxes"),
            ("GET", "/e2b/sandboxes"),
            ("POST", "/e2b/execute"),
            ("GET", "/e2b/files"),
            ("POST", "/e2b/process.Process/Start"),
        ):
            answer = httpx.request(method, url + path, json={"templateID": "base"}, timeout=30)
            assert answer.status_code == 404, (method, path, answer.text)


def test_malformed_commands_are_refused_not_crashed(
    server: Server, tenant: tuple[str, str]
) -> None:
    _, key = tenant
    box = server.create(key)
    headers = {**box.headers(), "Content-Type": "application/connect+json"}
    try:
        for message in (
            b"not json",
            b"\xff\xfe",
            b'{"process": []}',
            b'{"process": {"cmd": "ls", "args": "-la"}}',
            b'{"process": {"cmd": "ls", "envs": "A=1"}}',
            b'{"process": {"cmd": "ls", "envs": {"A": 1}}}',
            b'{"process": {"cmd": "ls", "cwd": 7}}',
        ):
            answer = server.http.post(
                "/process.Process/Start",
                content=struct.pack(">BI", 0, len(message)) + message,
                headers=headers,
            )
            assert answer.status_code == 400, (message, answer.status_code, answer.text)
        # A length prefix past the body, and past the cap: refused before any JSON is read.
        for prefix in (struct.pack(">BI", 0, 100), struct.pack(">BI", 0, 0xFFFFFFFF)):
            answer = server.http.post(
                "/process.Process/Start", content=prefix + b"{}", headers=headers
            )
            assert answer.status_code == 400, answer.text
        # Still usable afterwards.
        assert server.execute(box, "print(3)")[0]["text"] == "3\n"
    finally:
        server.kill(key, box)


def test_a_rename_holds_no_file_in_the_servers_memory(
    executor: execbox.Executor, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # A rename is done in the sandbox: under a result budget too small for a file read (which
    # holds the file in the server's memory), it still moves the file.
    del executor
    budget = {"max_result_bytes": 4 << 20, "tenant_result_bytes": 2 << 20}
    with e2b_serving(tmp_path_factory, **budget) as (url, state):
        server = Server(url, state)
        name, key = server.key()
        box = server.create(key)
        try:
            assert _write(server, box, "a.txt", b"x" * 1000).status_code == 200
            read = server.http.get("/files", params={"path": "a.txt"}, headers=box.headers())
            assert read.status_code >= 400  # control: the budget refuses a read
            assert "result budget" in read.json()["message"]
            body = json.dumps({"source": "a.txt", "destination": "d/b.txt"}).encode()
            moved = server.fs(box, "Move", body)
            assert moved.status_code == 200, moved.text
            assert moved.json()["entry"]["path"] == "/home/user/d/b.txt"
            assert server.fs(box, "Stat", b'{"path": "a.txt"}').status_code == 404
            stat = server.fs(box, "Stat", b'{"path": "d/b.txt"}')
            assert stat.status_code == 200 and stat.json()["entry"]["size"] == "1000"
        finally:
            server.kill(key, box)
            server.http.close()
            server.revoke(name)


def test_an_ended_sandboxs_token_starts_no_contexts(
    server: Server, tenant: tuple[str, str]
) -> None:
    _, key = tenant
    answer = server.http.post(
        "/v2/sandboxes", json={"templateID": "base", "timeout": 1}, headers={"X-API-KEY": key}
    )
    assert answer.status_code == 201, answer.text
    box = Box(answer.json()["sandboxID"], answer.json()["envdAccessToken"])
    deadline = time.monotonic() + 60
    while server.http.get("/health", headers=box.headers()).status_code == 204:
        assert time.monotonic() < deadline, "the sandbox outlived its timeout"
        time.sleep(0.5)
    for language in ("python", "javascript"):
        made = server.http.post("/contexts", json={"language": language}, headers=box.headers())
        assert made.status_code == 502, made.text
        ran = server.http.post(
            "/execute", json={"code": "1", "language": language}, headers=box.headers()
        )
        assert ran.status_code == 502, ran.text


def test_an_unread_file_read_holds_the_result_budget_until_sent(
    executor: execbox.Executor, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # A read is held in memory until the client has it: while one is unread, the next that
    # could not fit beside it is refused, not another copy in the server's write buffers.
    del executor
    mib = 1 << 20
    with e2b_serving(
        tmp_path_factory,
        max_result_bytes=100 * mib,  # the default profile's workspace: one read fits
        tenant_result_bytes=100 * mib,
        max_request_bytes=31 * mib,
    ) as (url, state):
        server = Server(url, state)
        _, key = server.key()
        box = server.create(key)
        try:
            assert _write(server, box, "big.bin", bytes(30 * mib)).status_code == 200
            params = {"path": "big.bin"}
            with server.http.stream("GET", "/files", params=params, headers=box.headers()) as r:
                assert r.status_code == 200
                time.sleep(0.5)  # time for the server to hand over what it would
                assert state.results.used == 30 * mib  # the file's size, until it is sent
                second = server.http.get("/files", params=params, headers=box.headers())
                assert second.status_code == 503, second.status_code
                assert len(r.read()) == 30 * mib
            deadline = time.monotonic() + 5
            while state.results.used and time.monotonic() < deadline:
                time.sleep(0.02)
            assert state.results.used == 0
        finally:
            server.kill(key, box)
            server.http.close()


# ---- attacks on the session's second pass (directories, kill, charts) --------------------------

HOSTILE_FIGURE = (
    "import matplotlib.pyplot as plt\n"
    "fig = plt.figure()\nplt.plot([1, 2], [3, 4])\n"
    "def broken(*args, **kwargs):\n    {body}\n"
    "fig.get_axes = broken\nprint('cell ran')"
)


@pytest.mark.parametrize(
    "body",
    ["raise SystemExit(3)", "raise KeyboardInterrupt", "while True: pass"],
    ids=["exit", "interrupt", "loop"],
)
def test_a_hostile_figure_ends_neither_the_cells_result_nor_the_session(
    server: Server, tenant: tuple[str, str], body: str
) -> None:
    # The chart is read from the figure after the cell, by the figure's own (the cell's) code:
    # what it raises, or its looping past the cell's time, must end no more than a cell would.
    _, key = tenant
    box = server.create(key)
    try:
        events = server.execute(box, HOSTILE_FIGURE.format(body=body))
        assert any(e.get("type") == "stdout" and e.get("text") == "cell ran\n" for e in events)
        assert not any("session has ended" in str(e.get("value", "")) for e in events), events
        assert any(e.get("type") == "result" and e.get("png") for e in events), events
        after = server.execute(box, "1 + 1")
        assert any(e.get("type") == "result" and e.get("text") == "2" for e in after), after
    finally:
        server.kill(key, box)


# What runs in the sandbox, as code in it sees it: each `sleep`'s argument.
SLEEPS = (
    "import os\nsorted(open(f'/proc/{p}/cmdline').read().split('\\0')[1] for p in os.listdir"
    "('/proc') if p.isdigit() and open(f'/proc/{p}/comm').read().strip() == 'sleep')"
)


def test_a_killed_commands_processes_that_left_its_group_go_too(
    server: Server, tenant: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # setsid (or a daemon's double fork) leaves the command's process group, which is all a
    # kill used to reach: those went on running in the sandbox after the command "ended".
    sandbox_sdk = pytest.importorskip("e2b_code_interpreter")
    e2b = pytest.importorskip("e2b")
    _, key = tenant
    use_sdk(monkeypatch, server.url, key)
    sbx = sandbox_sdk.Sandbox.create()
    try:
        # A process an earlier cell left running is not the command's: it stays.
        kept = "import subprocess\n_ = subprocess.Popen(['sleep', '297'], start_new_session=True)"
        assert sbx.run_code(kept).error is None
        handle = sbx.commands.run(
            "setsid sleep 298 & (setsid sleep 299 &); nohup sleep 300 & sleep 301",
            background=True,
        )
        deadline = time.monotonic() + 30
        while handle.pid not in [p.pid for p in sbx.commands.list()]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1)  # the command is running and has started them all
        assert sbx.commands.kill(handle.pid) is True
        with pytest.raises(e2b.CommandExitException):
            handle.wait()
        assert sbx.run_code(SLEEPS).text == "['297']"
    finally:
        sbx.kill()


def test_removing_a_directory_takes_links_fifos_and_deep_trees_without_following(
    server: Server, tenant: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sandbox's code plants what the workspace listing does not show (a link, a FIFO, a
    # tree deeper than the listing goes) in a directory its client then removes: the
    # directory goes whole, and nothing a link names is touched.
    sandbox_sdk = pytest.importorskip("e2b_code_interpreter")
    _, key = tenant
    use_sdk(monkeypatch, server.url, key)
    sbx = sandbox_sdk.Sandbox.create()
    try:
        planted = sbx.run_code(
            "import os\nos.makedirs('/tmp/keep/in')\nopen('/tmp/keep/in/f', 'w').write('k')\n"
            "os.makedirs('d/sub')\nos.symlink('/tmp/keep', 'd/ln')\n"
            "os.symlink('/tmp/keep/in', 'd/sub/ln')\nos.mkfifo('d/sub/fifo')\n"
            "os.makedirs('d/' + '/'.join(['n'] * 80))\nopen('d/f', 'w').write('x')"
        )
        assert planted.error is None, planted.error
        sbx.files.remove("d")
        assert not sbx.files.exists("d")
        seen = sbx.run_code(
            "import os\n(os.path.lexists('d'), open('/tmp/keep/in/f').read(), "
            "sorted(os.listdir('/tmp/keep')))"
        )
        assert seen.text == "(False, 'k', ['in'])"
    finally:
        sbx.kill()


def test_directories_made_through_the_api_are_bounded_by_the_workspace(
    server: Server, tenant: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The supervisor makes them, outside the session's memory cgroup, and an empty directory
    # takes no byte of the workspace's size: 511 a call (a 1 KiB path) went on until the
    # host's memory ran out. The workspace's inode count now stops them.
    sandbox_sdk = pytest.importorskip("e2b_code_interpreter")
    e2b = pytest.importorskip("e2b")
    _, key = tenant
    use_sdk(monkeypatch, server.url, key)
    sbx = sandbox_sdk.Sandbox.create()
    try:
        made = 0
        with pytest.raises(e2b.SandboxException, match="no room"):
            for call in range(200):  # 102,200 directories, twice what 100 MiB holds
                sbx.files.make_dir("/".join([f"d{call}"] + ["a"] * 510))
                made += 511
        assert 0 < made <= (100 << 20) // 2048
        assert sbx.run_code("1 + 1").text == "2"  # the session goes on
    finally:
        sbx.kill()


def test_a_figure_of_millions_of_points_keeps_its_cell_and_session(
    server: Server, tenant: tuple[str, str]
) -> None:
    # The chart's points were copied before they were counted against its 20,000: 3 million
    # of them (the cell's own arrays well within its memory) ended the session out of memory.
    _, key = tenant
    box = server.create(key)
    try:
        events = server.execute(
            box,
            "import numpy as np, matplotlib.pyplot as plt\n"
            "x = np.arange(3_000_000, dtype=float)\nplt.plot(x, x)\nprint('drawn')",
        )
        assert any(e.get("text") == "drawn\n" for e in events), events
        figures = [e for e in events if e.get("type") == "result" and e.get("png")]
        assert len(figures) == 1 and "chart" not in figures[0], events
        after = server.execute(box, "1 + 1")
        assert any(e.get("type") == "result" and e.get("text") == "2" for e in after), after
    finally:
        server.kill(key, box)
