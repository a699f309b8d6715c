"""`execbox mcp`: the MCP SDK's own client lists and calls the tools over stdio and streamable
HTTP against a real server subprocess running the real sandbox, and gets images for charts."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx
import pytest
from mcp import Client, ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import CallToolResult, ImageContent, TextContent

import execbox
from execbox.image import ENV_DIR
from execbox.records import RunStore
from execbox.server.auth import ADMIN, KeyStore
from tests.probes import alive, wait_until

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SERVER = [sys.executable, "-m", "execbox.cli", "mcp"]
TOOLS = {
    "run_python",
    "run_javascript",
    "run_bash",
    "read_artifact",
    "session_create",
    "session_run",
    "session_write_file",
    "session_read_file",
    "session_list_files",
    "session_close",
}
CHART = (
    "import matplotlib.pyplot as plt\nplt.plot([1, 4, 2, 8])\nplt.title('sales')\n"
    "plt.savefig('chart.png')\nprint('saved')\n"
)
_T = TypeVar("_T")


@pytest.fixture(scope="module", autouse=True)
def _needs_sandbox(executor: execbox.Executor) -> None:
    """The servers below start their own executors; skip where the sandbox cannot run."""


def _sessions_available() -> bool:
    return hasattr(execbox.Executor, "session")


def _text(result: Any) -> str:
    assert isinstance(result, CallToolResult), result
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def _images(result: Any) -> list[bytes]:
    assert isinstance(result, CallToolResult), result
    return [
        base64.b64decode(c.data)
        for c in result.content
        if isinstance(c, ImageContent) and c.mime_type == "image/png"
    ]


def _children(pid: int) -> set[int]:
    """The processes whose parent is `pid`."""
    found: set[int] = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                found |= {int(k) for k in fh.read().split()}
        except OSError:  # the thread ended meanwhile
            continue
    return found


def _descendants(pid: int) -> set[int]:
    """Every live process below `pid` (children files of each thread, recursively)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        try:
            kids = _children(todo.pop())
        except OSError:  # the process ended meanwhile
            continue
        todo.extend(kids - found)
        found |= kids
    return found


def _fork_servers(pid: int) -> set[int]:
    """The processes below `pid` that run the runtime image's interpreter (the fork server):
    from the image's tree while `execbox-enter` sets its mount up, then from `ENV_DIR`."""
    found = set()
    for child in _descendants(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as fh:
                argv0 = fh.read().split(b"\0")[0]
        except OSError:
            continue
        if b"/envs/trees/" in argv0 or argv0.startswith(ENV_DIR.encode() + b"/"):
            found.add(child)
    return found


def _wait_gone(pids: set[int], timeout_s: float = 15.0) -> set[int]:
    """Those of `pids` still running after up to `timeout_s` of waiting for all to end."""
    wait_until(lambda: not any(alive(p) for p in pids), timeout_s)
    return {p for p in pids if alive(p)}


def _run(fn: Callable[[], Awaitable[_T]]) -> _T:
    return anyio.run(fn)


# --- stdio -----------------------------------------------------------------------------------


@asynccontextmanager
async def _stdio(errlog: Path) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=SERVER[0], args=SERVER[1:], env=dict(os.environ))
    with errlog.open("w") as log:
        async with (
            stdio_client(params, errlog=log) as (read, write),
            ClientSession(read, write, read_timeout_seconds=60) as session,
        ):
            await session.initialize()
            yield session


def test_stdio_client_lists_the_tools_and_runs_code_with_a_chart_as_an_image(
    tmp_path: Path,
) -> None:
    async def main() -> tuple[Any, Any, Any]:
        async with _stdio(tmp_path / "server.log") as client:
            listed = await client.list_tools()
            ok = await client.call_tool("run_python", {"code": "print(6 * 7)"})
            chart = await client.call_tool("run_python", {"code": CHART})
            return listed, ok, chart

    listed, ok, chart = _run(main)
    tools = {tool.name: tool for tool in listed.tools}
    assert set(tools) == TOOLS
    run_python = tools["run_python"]
    assert run_python.input_schema["required"] == ["code"]
    assert "no network" in (run_python.description or "")
    assert run_python.annotations is not None and run_python.annotations.open_world_hint is False
    assert _text(ok) == "status: ok\nstdout:\n42"
    assert ok.structured_content["status"] == "ok" and ok.structured_content["run_id"]
    text = _text(chart)
    assert text.startswith("status: ok") and "chart.png (image/png" in text
    assert "images attached: chart.png" in text
    images = _images(chart)
    assert len(images) == 1 and images[0].startswith(PNG_MAGIC)


def test_stdio_server_stops_its_sandbox_when_the_client_leaves(tmp_path: Path) -> None:
    # Only the tree below the new server process: the test session's own executor stages
    # slots below its zygotes meanwhile, and those are not the server's.
    async def main() -> set[int]:
        before = _children(os.getpid())
        async with _stdio(tmp_path / "server.log") as client:
            result = await client.call_tool("run_python", {"code": "print('up')"})
            assert _text(result).endswith("up")
            servers = _children(os.getpid()) - before
            return servers.union(*(_descendants(s) for s in servers))

    spawned = _run(main)
    assert len(spawned) >= 2, "expected the server and its fork server below it"
    assert _wait_gone(spawned) == set()


INITIALIZE = (
    b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {'
    b'"protocolVersion": "2025-06-18", "capabilities": {}, '
    b'"clientInfo": {"name": "test", "version": "0"}}}\n'
)


@pytest.mark.parametrize("when", ["starting", "serving"])
def test_stdio_server_stops_cleanly_on_sigterm(tmp_path: Path, when: str) -> None:
    log = tmp_path / "server.log"
    with log.open("w") as errlog:
        proc = subprocess.Popen(
            SERVER, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errlog
        )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        below: set[int] = set()
        if when == "serving":
            proc.stdin.write(INITIALIZE)
            proc.stdin.flush()
            assert b'"result"' in proc.stdout.readline(), log.read_text()
            below = _descendants(proc.pid)
            assert below, "the fork server runs below the server"
        else:  # the fork server has started; the Executor is still getting ready
            deadline = time.monotonic() + 30
            while not (below := _fork_servers(proc.pid)) and time.monotonic() < deadline:
                time.sleep(0.005)
            assert below, log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
        assert _wait_gone(below) == set()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stdout.close()


# --- streamable HTTP -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class HttpServer:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path, db: str) -> None:
        self.proc, self.url, self.log = proc, url, log
        self.keys = KeyStore(RunStore(db).engine)
        self.key = self.new_key("mcp")

    def new_key(self, prefix: str, **limits: Any) -> str:
        """A fresh key of the server's key table (the HTTP API's, in the same database)."""
        return self.keys.create(f"{prefix}-{os.urandom(4).hex()}", **limits)


@contextmanager
def _http_server_process(log: Path, *options: str, db: str | None = None) -> Iterator[HttpServer]:
    """`execbox mcp --transport http` on a free loopback port, listening; stopped (and anything
    it left behind killed) on the way out. `db`: its records and keys (default: the tests')."""
    port = _free_port()
    db = db or os.environ["EXECBOX_DB_URL"]
    with log.open("w") as errlog:
        proc = subprocess.Popen(
            [*SERVER, "--transport", "http", "--port", str(port), *options],
            stdin=subprocess.DEVNULL,
            stdout=errlog,
            stderr=errlog,
            env={**os.environ, "EXECBOX_DB_URL": db},
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(f"execbox mcp exited with {proc.returncode}:\n{log.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"execbox mcp did not listen within 30 s:\n{log.read_text()}")
                time.sleep(0.1)
        yield HttpServer(proc, f"http://127.0.0.1:{port}/mcp", log, db)
    finally:
        below = _descendants(proc.pid)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in _wait_gone(below):  # never leave a process behind, even if the server did
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    with _http_server_process(tmp_path_factory.mktemp("mcp-http") / "server.log") as server:
        yield server


@asynccontextmanager
async def _http(server: HttpServer, key: str | None = None) -> AsyncIterator[ClientSession]:
    """An MCP client session over HTTP with `key` (default: the server's first key)."""
    headers = {"Authorization": f"Bearer {key or server.key}"}
    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(server.url, http_client=http) as (read, write),
        ClientSession(read, write, read_timeout_seconds=60) as session,
    ):
        await session.initialize()
        yield session


def test_http_client_lists_the_tools_and_gets_an_error_with_its_line(
    http_server: HttpServer,
) -> None:
    async def main() -> tuple[Any, Any]:
        async with _http(http_server) as client:
            listed = await client.list_tools()
            failed = await client.call_tool(
                "run_python",
                {
                    "code": "import pandas as pd\ndf = pd.read_csv('t.csv')\nprint(df.a.sum())\n"
                    "df.missing\n",
                    "files": {"t.csv": "a\n1\n2\n"},
                },
            )
            return listed, failed

    listed, failed = _run(main)
    assert {tool.name for tool in listed.tools} == TOOLS
    text = _text(failed)
    assert text.startswith("status: error, exit code 1")
    assert "error: AttributeError (line 4)" in text
    assert "stdout:\n3" in text
    assert failed.is_error is False  # what the code did is data, not a failed tool call


def test_http_client_gets_a_chart_as_an_image_and_limits_apply(http_server: HttpServer) -> None:
    async def main() -> tuple[Any, Any]:
        async with _http(http_server) as client:
            chart = await client.call_tool("run_python", {"code": CHART})
            slow = await client.call_tool(
                "run_python", {"code": "while True:\n    pass\n", "limits": {"timeout_s": 1}}
            )
            return chart, slow

    chart, slow = _run(main)
    images = _images(chart)
    assert len(images) == 1 and images[0].startswith(PNG_MAGIC)
    assert _text(slow).startswith("status: timeout")
    assert slow.structured_content["limits"]["timeout_s"] == 1


def test_http_bad_arguments_are_a_tool_error_not_a_crash(http_server: HttpServer) -> None:
    async def main() -> tuple[Any, Any]:
        async with _http(http_server) as client:
            bad_limits = await client.call_tool(
                "run_python", {"code": "print(1)", "limits": {"timeout_s": -1}}
            )
            unknown = await client.call_tool("session_run", {"session_id": "nope", "code": "1"})
            return bad_limits, unknown

    bad_limits, unknown = _run(main)
    assert bad_limits.is_error is True and "timeout_s" in _text(bad_limits)
    assert unknown.is_error is True and "nope" in _text(unknown)
    assert http_server.proc.poll() is None


def test_http_authentication_does_not_wait_for_the_tools_thread_pool(
    http_server: HttpServer,
) -> None:
    """Tool calls run on anyio's default pool of 40 threads; calls waiting for a busy session
    fill it. Other tenants are still authenticated at once (before, every request waited for a
    free tool thread, a key lookup included)."""
    flood_key = http_server.new_key("flood", max_concurrent=64)
    victim_key = http_server.new_key("victim")

    async def main() -> tuple[float, Any, list[Any]]:
        async with _http(http_server, flood_key) as client:
            made = await client.call_tool("session_create", {})
            sid = made.structured_content["session_id"]
            results: list[Any] = []

            async def call(code: str) -> None:
                results.append(
                    await client.call_tool("session_run", {"session_id": sid, "code": code})
                )

            async with anyio.create_task_group() as flood:
                flood.start_soon(call, "import time; time.sleep(10)")
                await anyio.sleep(1)
                for _ in range(44):  # each waits for the session on a tool thread
                    flood.start_soon(call, "1")
                await anyio.sleep(1.5)
                started = time.monotonic()
                async with httpx.AsyncClient(timeout=30) as http:
                    answer = await http.post(
                        http_server.url,
                        json=_INITIALIZE,
                        headers={**_MCP_HEADERS, "Authorization": f"Bearer {victim_key}"},
                    )
                victim_s = time.monotonic() - started
            await client.call_tool("session_close", {"session_id": sid})
        return victim_s, answer, results

    victim_s, answer, results = _run(main)
    assert answer.status_code == 200, answer.text
    assert victim_s < 1, f"another tenant's request waited {victim_s:.1f} s"
    assert len(results) == 45 and not any(r.is_error for r in results)


_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "probe", "version": "0"},
    },
}
_MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


def _post(
    server: HttpServer, key: str | None, body: dict[str, Any], session: str | None = None
) -> httpx.Response:
    headers = dict(_MCP_HEADERS)
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    if session is not None:
        headers["mcp-session-id"] = session
    return httpx.post(server.url, json=body, headers=headers, timeout=30)


def test_http_refuses_requests_without_a_tenants_key(http_server: HttpServer) -> None:
    revoked = http_server.new_key("revoked")
    http_server.keys.revoke(
        next(
            k.name
            for k in http_server.keys.list()
            if k.name.startswith("revoked-") and k.revoked_at is None
        )
    )
    admin = http_server.new_key("admin", role=ADMIN)
    for key, status, code in (
        (None, 401, "missing_api_key"),
        ("ebx_not-a-real-key", 401, "invalid_api_key"),
        (revoked, 401, "revoked_api_key"),
        (admin, 403, "admin_key"),
    ):
        refused = _post(http_server, key, _INITIALIZE)
        assert refused.status_code == status, (key, refused.text)
        assert refused.json()["error"]["code"] == code
        if status == 401:
            assert refused.headers["www-authenticate"] == "Bearer"
    accepted = _post(http_server, http_server.key, _INITIALIZE)
    assert accepted.status_code == 200 and "mcp-session-id" in accepted.headers


def test_http_refuses_a_foreign_host_before_its_key(http_server: HttpServer) -> None:
    """A page renamed to the server's address (DNS rebinding) is refused, its key unread."""
    for key in (http_server.key, "ebx_not-a-real-key"):
        headers = {**_MCP_HEADERS, "Authorization": f"Bearer {key}", "Host": "evil.example"}
        refused = httpx.post(http_server.url, json=_INITIALIZE, headers=headers, timeout=30)
        assert refused.status_code == 421, refused.text
        assert refused.json()["error"]["code"] == "host_not_allowed"
        assert "--allowed-host evil.example" in refused.json()["error"]["message"]


def test_http_answers_the_names_allowed_host_lists(tmp_path: Path) -> None:
    with _http_server_process(tmp_path / "server.log", "--allowed-host", "*.mcp.example") as server:
        for host, status in (("a.mcp.example", 200), ("mcp.example", 421), ("localhost", 200)):
            headers = {**_MCP_HEADERS, "Authorization": f"Bearer {server.key}", "Host": host}
            answer = httpx.post(server.url, json=_INITIALIZE, headers=headers, timeout=30)
            assert answer.status_code == status, (host, answer.text)


def test_http_tenant_reaches_only_its_own_sessions_runs_and_mcp_sessions(
    http_server: HttpServer,
) -> None:
    bob = http_server.new_key("bob")

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with _http(http_server) as alice:
            created = await alice.call_tool("session_create", {})
            sid = created.structured_content["session_id"]
            ran = await alice.call_tool(
                "run_python", {"code": "open('secret.txt', 'w').write('alice only')"}
            )
            run_id = ran.structured_content["run_id"]
            async with _http(http_server, bob) as other:
                out["cell"] = await other.call_tool("session_run", {"session_id": sid, "code": "1"})
                out["close"] = await other.call_tool("session_close", {"session_id": sid})
                out["read"] = await other.call_tool(
                    "read_artifact", {"run_id": run_id, "path": "secret.txt"}
                )
            out["own_cell"] = await alice.call_tool(
                "session_run", {"session_id": sid, "code": "40 + 2"}
            )
            out["own_read"] = await alice.call_tool(
                "read_artifact", {"run_id": run_id, "path": "secret.txt"}
            )
            await alice.call_tool("session_close", {"session_id": sid})
        return out

    out = _run(main)
    for name in ("cell", "close", "read"):
        assert out[name].is_error is True, (name, _text(out[name]))
    assert "session_not_found" in _text(out["cell"]) and "alice only" not in _text(out["read"])
    assert "output: 42" in _text(out["own_cell"]) and _text(out["own_read"]) == "alice only"
    # An MCP session id is its opener's: another tenant's key cannot use it.
    opened = _post(http_server, http_server.key, _INITIALIZE)
    session = opened.headers["mcp-session-id"]
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    hijack = _post(http_server, bob, listing, session=session)
    assert hijack.status_code == 404 and hijack.json()["error"]["code"] == "session_not_found"


def test_http_keys_quotas_apply_to_tool_calls(http_server: HttpServer) -> None:
    limited = http_server.new_key("limited", rpm=1, max_sessions=0)

    async def main() -> tuple[Any, Any, Any]:
        async with _http(http_server, limited) as client:
            first = await client.call_tool("run_python", {"code": "print(1)"})
            second = await client.call_tool("run_python", {"code": "print(2)"})
            session = await client.call_tool("session_create", {})
            return first, second, session

    first, second, session = _run(main)
    assert _text(first).startswith("status: ok")
    assert second.is_error is True and "rate_limited" in _text(second)
    assert "retry after" in _text(second)
    assert session.is_error is True and "session_quota" in _text(session)


@pytest.mark.skipif(not _sessions_available(), reason="sessions have not landed yet")
def test_http_a_key_starts_sessions_at_the_servers_rate(tmp_path: Path) -> None:
    """As `execbox serve`: after a burst of 4 session starts, a key waits for the rate (here one
    start in 100 s), so a flood of starts cannot take the server's CPU from other keys."""
    db = f"sqlite:///{tmp_path}/records.db"
    rate = ("--session-starts-per-s", "0.01")
    with _http_server_process(tmp_path / "server.log", *rate, db=db) as server:
        flood = server.new_key("flood", max_sessions=8)

        async def main() -> list[Any]:
            answers = []
            async with _http(server, flood) as client:
                for _ in range(5):
                    answers.append(await client.call_tool("session_create", {}))
                    if not answers[-1].is_error:
                        sid = answers[-1].structured_content["session_id"]
                        await client.call_tool("session_close", {"session_id": sid})
            return answers

        answers = _run(main)
    assert [a.is_error for a in answers] == [False] * 4 + [True], [_text(a) for a in answers]
    assert "session_starts" in _text(answers[4]) and "retry after" in _text(answers[4])


@pytest.mark.skipif(not _sessions_available(), reason="sessions have not landed yet")
def test_http_each_key_is_guaranteed_its_share_of_the_sessions(tmp_path: Path) -> None:
    """Two keys with quotas of 2 on a server of 2 sessions: each is guaranteed one, so the
    first cannot take both (429 session_capacity), and the second still gets its own."""
    db = f"sqlite:///{tmp_path}/records.db"
    with _http_server_process(tmp_path / "server.log", "--max-sessions", "2", db=db) as server:
        hog, other = (server.new_key(name, max_sessions=2) for name in ("hog", "other"))
        server.keys.revoke(next(k.name for k in server.keys.list() if k.name.startswith("mcp")))

        async def main() -> list[Any]:
            async with _http(server, hog) as first, _http(server, other) as second:
                answers = [
                    await first.call_tool("session_create", {}),
                    await first.call_tool("session_create", {}),
                    await second.call_tool("session_create", {}),
                ]
                for client, answer in ((first, answers[0]), (second, answers[2])):
                    if not answer.is_error:
                        await client.call_tool(
                            "session_close", {"session_id": answer.structured_content["session_id"]}
                        )
                return answers

        held, refused, other_session = _run(main)
    assert not held.is_error, _text(held)
    assert refused.is_error is True and "session_capacity" in _text(refused), _text(refused)
    assert not other_session.is_error, _text(other_session)


@pytest.mark.skipif(not _sessions_available(), reason="sessions have not landed yet")
def test_http_session_keeps_state_and_files_across_cells_and_returns_chart_images(
    http_server: HttpServer,
) -> None:
    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with _http(http_server) as client:
            created = await client.call_tool(
                "session_create", {"files": {"in.csv": "x\n1\n2\n3\n"}}
            )
            assert isinstance(created, CallToolResult) and not created.is_error, created
            sid = created.structured_content["session_id"]
            await client.call_tool("session_run", {"session_id": sid, "code": "n = 41"})
            out["value"] = await client.call_tool(
                "session_run", {"session_id": sid, "code": "n + 1"}
            )
            out["chart"] = await client.call_tool(
                "session_run",
                {
                    "session_id": sid,
                    "code": (
                        "import matplotlib.pyplot as plt, pandas as pd\n"
                        "pd.read_csv('in.csv').x.plot()\nplt.show()\n"
                    ),
                },
            )
            out["write"] = await client.call_tool(
                "session_write_file", {"session_id": sid, "path": "notes/a.txt", "content": "hello"}
            )
            out["cell"] = await client.call_tool(
                "session_run",
                {"session_id": sid, "code": "print(open('notes/a.txt').read().upper())"},
            )
            out["list"] = await client.call_tool("session_list_files", {"session_id": sid})
            out["read"] = await client.call_tool(
                "session_read_file", {"session_id": sid, "path": "notes/a.txt"}
            )
            out["close"] = await client.call_tool("session_close", {"session_id": sid})
            out["after"] = await client.call_tool("session_run", {"session_id": sid, "code": "n"})
        return out

    out = _run(main)
    assert "output: 42" in _text(out["value"])
    images = _images(out["chart"])
    assert len(images) == 1 and images[0].startswith(PNG_MAGIC)
    assert "wrote notes/a.txt (5 bytes" in _text(out["write"])
    assert "stdout:\nHELLO" in _text(out["cell"])
    assert "notes/a.txt\t5\t" in _text(out["list"])
    assert _text(out["read"]) == "hello"
    assert "closed" in _text(out["close"])
    assert out["after"].is_error is True


def test_http_server_stops_on_sigterm_closing_open_sessions_and_the_sandbox(tmp_path: Path) -> None:
    with _http_server_process(tmp_path / "server.log") as server:

        async def main() -> Any:
            async with _http(server) as client:
                created = await client.call_tool("session_create", {})
                sid = created.structured_content["session_id"]
                return await client.call_tool(
                    "session_run",
                    {"session_id": sid, "code": "import time\nstarted = time.time()\n1"},
                )

        cell = _run(main)  # the client leaves; its session stays open in the server
        assert "output: 1" in _text(cell)
        below = _descendants(server.proc.pid)
        assert len(below) >= 2, "the fork server and the session's processes run below"
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0, server.log.read_text()
        assert _wait_gone(below) == set()


# --- in process: the same server object over the SDK's in-memory client --------------------


def _inproc(executor: execbox.Executor, body: Callable[[Client], Awaitable[_T]]) -> _T:
    from execbox.mcp.server import build_server

    async def main() -> _T:
        async with Client(build_server(executor), read_timeout_seconds=60) as client:
            return await body(client)

    return _run(main)


def test_binary_inputs_and_files_round_trip_and_images_read_back_as_images(
    executor: execbox.Executor,
) -> None:
    blob = bytes(range(256))

    async def body(client: Client) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["run"] = await client.call_tool(
            "run_python",
            {
                "code": "data = open('b.bin', 'rb').read()\nprint(len(data), data[255])",
                "files_base64": {"b.bin": base64.b64encode(blob).decode()},
            },
        )
        sid = (await client.call_tool("session_create", {})).structured_content["session_id"]
        out["write"] = await client.call_tool(
            "session_write_file",
            {
                "session_id": sid,
                "path": "raw.bin",
                "encoding": "base64",
                "content": base64.b64encode(blob).decode(),
            },
        )
        await client.call_tool("session_run", {"session_id": sid, "code": CHART})
        out["png"] = await client.call_tool(
            "session_read_file", {"session_id": sid, "path": "chart.png"}
        )
        out["bin"] = await client.call_tool(
            "session_read_file", {"session_id": sid, "path": "raw.bin"}
        )
        out["missing"] = await client.call_tool(
            "session_read_file", {"session_id": sid, "path": "nope.txt"}
        )
        out["bad"] = await client.call_tool(
            "session_write_file",
            {"session_id": sid, "path": "x", "content": "%%%", "encoding": "base64"},
        )
        return out

    out = _inproc(executor, body)
    assert "stdout:\n256 255" in _text(out["run"])
    assert "wrote raw.bin (256 bytes" in _text(out["write"])
    images = _images(out["png"])
    assert len(images) == 1 and images[0].startswith(PNG_MAGIC)
    text = _text(out["bin"])
    assert "binary; base64" in text
    assert base64.b64decode(text.split(":\n", 1)[1]) == blob
    assert out["missing"].is_error is True and "nope.txt" in _text(out["missing"])
    assert out["bad"].is_error is True and "not valid base64" in _text(out["bad"])


def test_a_run_with_many_charts_attaches_at_most_the_cap_and_names_the_rest(
    executor: execbox.Executor,
) -> None:
    from execbox.mcp.server import MAX_IMAGES

    count = MAX_IMAGES + 2
    code = (
        "import matplotlib.pyplot as plt\n"
        f"for i in range({count}):\n"
        "    plt.figure(figsize=(1, 1)); plt.plot([0, i]); plt.savefig(f'c{i:02d}.png')\n"
    )

    async def body(client: Client) -> Any:
        return await client.call_tool("run_python", {"code": code})

    result = _inproc(executor, body)
    assert len(_images(result)) == MAX_IMAGES
    text = _text(result)
    assert "images not attached" in text
    assert text.count(".png (image/png") == count  # every chart is still listed


def test_sessions_the_server_opened_are_closed_when_it_shuts_down(
    executor: execbox.Executor,
) -> None:
    async def body(client: Client) -> str:
        created = await client.call_tool("session_create", {})
        sid: str = created.structured_content["session_id"]
        return sid

    sid = _inproc(executor, body)
    with pytest.raises(execbox.UsageError, match="no open session"):
        executor.get_session(sid)


def test_files_a_run_wrote_can_be_read_back_but_only_from_runs_of_this_server(
    executor: execbox.Executor,
) -> None:
    elsewhere = executor.run("open('secret.txt', 'w').write('not yours')")
    assert elsewhere.ok and elsewhere.artifacts

    async def body(client: Client) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["run"] = run = await client.call_tool(
            "run_python",
            {
                "code": "import pandas as pd\n"
                "pd.DataFrame({'a': [1, 2]}).to_csv('out.csv', index=False)\n"
            },
        )
        run_id = run.structured_content["run_id"]
        out["csv"] = await client.call_tool("read_artifact", {"run_id": run_id, "path": "out.csv"})
        out["absent"] = await client.call_tool(
            "read_artifact", {"run_id": run_id, "path": "other.csv"}
        )
        out["foreign"] = await client.call_tool(
            "read_artifact", {"run_id": elsewhere.run_id, "path": "secret.txt"}
        )
        return out

    out = _inproc(executor, body)
    run_id = out["run"].structured_content["run_id"]
    assert f"run_id: {run_id} (read_artifact" in _text(out["run"])
    assert _text(out["csv"]) == "a\n1\n2\n"
    assert out["absent"].is_error is True and "it wrote: out.csv" in _text(out["absent"])
    assert out["foreign"].is_error is True and "not yours" not in _text(out["foreign"])


def test_tool_calls_hold_the_result_budget_and_refuse_past_it(executor: execbox.Executor) -> None:
    """Runs and cells hold their results in memory: a call whose limits could return more than
    the server's budget is refused (a review attack grew an MCP server by 400 MB with one call
    of 3 x 80 MiB artifacts); one within it runs, and gives its reservation back."""
    from execbox.mcp.server import build_server

    server = build_server(executor, max_result_bytes=32 << 20)

    async def main() -> tuple[Any, Any]:
        async with Client(server, read_timeout_seconds=60) as client:
            big = await client.call_tool(
                "run_python", {"code": "print(1)", "limits": {"artifact_bytes": 32 << 20}}
            )
            # 22 MiB each (two outputs of 1 MiB, six copies each, 10 MiB of artifacts): a
            # second fits only once the first gave its reservation back.
            fine = [await client.call_tool("run_python", {"code": f"print({i})"}) for i in (2, 3)]
            return big, fine

    big, fine = _run(main)
    assert big.is_error and "over_result_budget" in _text(big), _text(big)
    for result, shown in zip(fine, "23", strict=True):
        assert not result.is_error and shown in _text(result), _text(result)


def test_a_cached_run_python_result_is_redacted_with_secrets_registered_later(
    tmp_path: Path,
) -> None:
    """run_python answers from the cache; an executor given the secret after a result was
    cached in clear runs afresh (the secrets are in the cache key), then answers from the
    cache redacted, escaped forms included."""
    secret = "k\\e\"y 'é-" + os.urandom(6).hex()
    code = f"import json\nv = {secret!r}\nprint(repr(v), json.dumps(v))"
    db = f"sqlite:///{tmp_path}/runs.db"

    async def call(client: Client) -> Any:
        return await client.call_tool("run_python", {"code": code})

    with execbox.Executor(cache=True, records=db) as before:
        assert secret[-12:] in _text(_inproc(before, call))
    with execbox.Executor(cache=True, records=db, secrets=[secret]) as after:
        fresh, hit = _inproc(after, call), _inproc(after, call)
    assert fresh.structured_content["cached"] is False
    assert hit.structured_content["cached"] is True
    for answer in (fresh, hit):
        assert secret[-12:] not in _text(answer)
        assert _text(answer).count("[REDACTED:secret]") == 2
        assert secret[-12:] not in str(answer.structured_content)


def test_run_python_names_code_holding_a_secret_by_its_redacted_digest(tmp_path: Path) -> None:
    """The `code_sha256` of a result was the plain sha256 of code holding a registered
    secret: a 4-digit one came back in 10,000 tries. run_python answers with the digest of
    the code as recorded, redacted."""
    import hashlib

    pin = "4821"
    code = f"pin = {pin!r}\nprint('ok')\n"

    async def call(client: Client) -> Any:
        return await client.call_tool("run_python", {"code": code})

    with execbox.Executor(records=f"sqlite:///{tmp_path}/runs.db", secrets=[pin]) as ex:
        answer = _inproc(ex, call)
    digest = answer.structured_content["code_sha256"]
    redacted = code.replace(repr(pin), "'[REDACTED:secret]'")
    assert digest == hashlib.sha256(redacted.encode()).hexdigest()
    assert digest != hashlib.sha256(code.encode()).hexdigest()


def test_file_tools_say_that_files_are_not_redacted(executor: execbox.Executor) -> None:
    async def body(client: Client) -> dict[str, str]:
        return {t.name: t.description or "" for t in (await client.list_tools()).tools}

    described = _inproc(executor, body)
    for tool in ("read_artifact", "session_read_file"):
        assert "not redacted" in described[tool], described[tool]
