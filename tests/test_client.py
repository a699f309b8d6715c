"""execbox.Client against a real server passes the same tests as the local Executor: code moves
between local and remote by changing one line."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import execbox
from execbox.server import Settings, create_app
from execbox.server.background import serving


@contextmanager
def _server_over(executor: execbox.Executor, name: str) -> Iterator[tuple[str, str, str]]:
    """A real server over `executor`: (url, a key, a key allowed one run a minute)."""
    app = create_app(executor, Settings())
    keys = app.state.execbox.keys
    key = keys.create(name, max_sessions=8)
    limited = keys.create(f"{name}-limited", rpm=1)
    with serving(app) as url:
        yield url, key, limited


@pytest.fixture(scope="module")
def server(executor: execbox.Executor) -> Iterator[tuple[str, str, str]]:
    with _server_over(executor, "client-tests") as served:
        yield served


@pytest.fixture(scope="module")
def fake_server(fake_executor: execbox.Executor) -> Iterator[tuple[str, str, str]]:
    """For claims about the client and the server alone: the fake sandbox runs the code."""
    with _server_over(fake_executor, "client-fake-tests") as served:
        yield served


@pytest.fixture(params=["local", "remote"])
def ex(request: pytest.FixtureRequest, executor: execbox.Executor) -> Iterator[Any]:
    if request.param == "local":
        yield executor
        return
    url, key, _ = request.getfixturevalue("server")
    with execbox.Client(url, key) as client:
        yield client


def test_run_result_has_output_inputs_and_artifact_bytes(ex: Any) -> None:
    r = ex.run(
        "import sys\nd = open('in.csv').read()\nopen('out.txt', 'w').write(d.upper())\n"
        "print(sys.stdin.read(), end='')",
        files={"in.csv": b"a,b\n"},
        stdin="piped",
        limits={"timeout_s": 5},
    )
    assert isinstance(r, execbox.RunResult)
    assert r.ok and r.stdout == "piped"
    assert r.artifact("out.txt").data == b"A,B\n"
    assert r.limits.timeout_s == 5


def test_limits_and_errors_are_statuses(ex: Any) -> None:
    slow = ex.run("while True: pass", limits=execbox.Limits(timeout_s=0.5))
    assert slow.status in ("timeout", "cpu_limit")
    assert slow.error is not None
    assert "timeout_s" in slow.error.message or "cpu_s" in slow.error.message
    bad = ex.run("def f(:\n  pass")
    assert bad.status == "error" and bad.error.type == "SyntaxError" and bad.error.line == 1


@pytest.fixture(params=["local", "remote"])
def fake_ex(request: pytest.FixtureRequest, fake_executor: execbox.Executor) -> Iterator[Any]:
    """`ex` over the fake sandbox, for claims about arguments and errors alone."""
    if request.param == "local":
        yield fake_executor
        return
    url, key, _ = request.getfixturevalue("fake_server")
    with execbox.Client(url, key) as client:
        yield client


def test_bad_arguments_raise_usage_error(fake_ex: Any) -> None:
    ex = fake_ex
    with pytest.raises(execbox.UsageError):
        ex.run("print(1)", limits={"timeout_s": -1})
    with pytest.raises(execbox.UsageError):
        ex.run("print(1)", profile="no-such-profile")
    with pytest.raises(execbox.UsageError):  # raised mid-stream on the server: still a UsageError
        ex.run("print(1)", profile="no-such-profile", on_stdout=lambda _chunk: None)


def test_output_streams_to_callbacks(ex: Any) -> None:
    out: list[bytes] = []
    err: list[bytes] = []
    r = ex.run(
        "import sys\nprint('to out')\nprint('to err', file=sys.stderr)",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert b"".join(out) == b"to out\n" and b"".join(err) == b"to err\n"
    assert r.stdout == "to out\n"


def test_session_keeps_state_files_and_ends_closed(ex: Any) -> None:
    with ex.session(files={"seed.txt": b"40"}) as s:
        assert s.run("n = int(open('seed.txt').read())").ok
        r = s.run("open('n.txt', 'w').write(str(n + 2))\nn + 2")
        assert r.session_id == s.id
        assert r.outputs[-1].mime_type == "text/plain" and r.outputs[-1].data == "42"
        assert r.artifact("n.txt").data == b"42"
        art = s.files.write("up/loaded.bin", b"\x00\xff")
        assert isinstance(art, execbox.Artifact) and art.size == 2
        assert s.files.read("up/loaded.bin") == b"\x00\xff"
        assert {"seed.txt", "n.txt", "up/loaded.bin"} <= {a.path for a in s.files.list()}
        s.files.remove("n.txt")
        assert "n.txt" not in {a.path for a in s.files.list()}
        with pytest.raises(execbox.UsageError):
            s.files.read("no/such/file")
    assert s.closed and s.end_reason
    with pytest.raises(execbox.SessionClosed):
        s.run("n")


def test_async_client_matches_the_sync_one(server: tuple[str, str, str]) -> None:
    url, key, _ = server

    async def main() -> tuple[execbox.RunResult, execbox.RunResult, list[bytes]]:
        async with execbox.AsyncClient(url, key) as client:
            seen: list[bytes] = []
            run = await client.run(
                "open('a.txt','w').write('x')\nprint('hi')", on_stdout=seen.append
            )
            async with await client.session() as s:
                await s.run("y = 5")
                cell = await s.run("y * 2")
            info = await s.info()
            assert info["closed"] is True
            return run, cell, seen

    run, cell, seen = asyncio.run(main())
    assert run.ok and run.artifact("a.txt").data == b"x" and b"".join(seen) == b"hi\n"
    assert cell.outputs[-1].data == "10"


def test_client_fetches_its_own_run_records(fake_server: tuple[str, str, str]) -> None:
    url, key, _ = fake_server
    with execbox.Client(url, key) as client:
        run = client.run("print('recorded')")
        record = client.get(run.run_id)
        assert record["run_id"] == run.run_id and record["result"]["stdout"] == "recorded\n"
        with pytest.raises(execbox.UsageError, match="run_not_found"):
            client.get("f" * 32)


def test_client_errors_map_to_execbox_exceptions(fake_server: tuple[str, str, str]) -> None:
    url, _, limited = fake_server
    with execbox.Client(url, limited) as client:
        assert client.run("print(1)").ok
        with pytest.raises(execbox.Overloaded, match="rate_limited.*retry after"):
            client.run("print(2)")
    with (
        execbox.Client(url, "ebx_wrong") as client,
        pytest.raises(execbox.UsageError, match="invalid_api_key"),
    ):
        client.run("print(1)")
    with (
        execbox.Client("http://127.0.0.1:9", "k") as client,
        pytest.raises(execbox.SandboxUnavailable),
    ):
        client.run("print(1)")


def test_a_record_that_cannot_be_written_reaches_a_remote_caller_as_records_error(
    server: tuple[str, str, str], poisoned_records: Callable[[], None]
) -> None:
    """The next run is refused before its code runs, with its own error code (500
    records_error) and the client's RecordsError."""
    url, key, _ = server
    with execbox.Client(url, key) as client:
        assert client.run("print('poisoned')").ok  # its record cannot be written
        poisoned_records()
        with pytest.raises(
            execbox.RecordsError, match="database refused it.*records_error, HTTP 500"
        ):
            client.run("print(3)")
        assert client.run("print(4)").ok
