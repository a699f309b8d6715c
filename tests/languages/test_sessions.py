"""JavaScript sessions: one Node process in the session's jail, cell by cell, through the real
sandbox; their faces (HTTP on loopback, MCP in memory)."""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

import anyio
import pytest

from execbox import Executor, Limits, SessionClosed, Status, UsageError
from execbox.sessions import Session

SMALL = Limits(timeout_s=5, memory_mib=256, pids=32)


@pytest.fixture
def js(executor: Executor) -> Any:
    with executor.session(language="javascript", limits=SMALL) as s:
        yield s


def _value(result: Any) -> str:
    assert result.ok, result
    texts = [o.data for o in result.outputs if o.mime_type == "text/plain"]
    assert texts, f"no text/plain output in {result}"
    return str(texts[-1])


def test_let_const_class_and_functions_persist_and_the_last_value_is_the_output(
    js: Session,
) -> None:
    first = js.run("let n = 40; const o = {k: [1, 2]}; class C { two() { return 2 } }")
    assert first.ok and first.outputs == [], first  # a declaration's value is not shown
    assert _value(js.run("function add(a) { return a + n }\nadd(new C().two())")) == "42"
    assert _value(js.run("n += 1; o.k.push(n); o")) == "{ k: [ 1, 2, 41 ] }"
    r = js.run("console.log('printed', n); undefined")
    assert (r.stdout, r.outputs) == ("printed 41\n", [])
    # A declared name stays declared, as in Node's REPL.
    again = js.run("let n = 0")
    assert again.error is not None and again.error.type == "SyntaxError", again
    assert "already been declared" in again.error.message


def test_top_level_await_keeps_its_declarations_for_later_cells(js: Session) -> None:
    r = js.run(
        "const wait = (ms) => new Promise((r) => setTimeout(r, ms));\n"
        "await wait(20);\n"
        "let got = await Promise.resolve(6);\n"
        "class K { get v() { return got * 7 } }\n"
        "function twice(x) { return 2 * x }\n"
        "new K().v"
    )
    assert _value(r) == "42"
    assert _value(js.run("twice(got) + new K().v")) == "54"
    assert _value(js.run("const { sep } = await import('node:path'); sep")) == "'/'"


def test_uncaught_error_reports_type_message_and_line_and_the_session_lives(js: Session) -> None:
    r = js.run("function f() {\n  return g()\n}\nfunction g() { return null.x }\nf()")
    assert r.status is Status.error and r.error is not None, r
    assert (r.error.type, r.error.line, r.error.column) == ("TypeError", 4, 28), r.error
    assert "reading 'x'" in r.error.message
    assert r.stderr.startswith("TypeError:") and "cell-" in r.stderr, r.stderr
    thrown = js.run("class Oops extends Error {}\n\nthrow new Oops('mine')")
    assert thrown.error is not None and (thrown.error.type, thrown.error.message) == (
        "Oops",
        "mine",
    )
    assert thrown.error.line == 3
    # In a rewritten cell too: the line is the cell's, not the rewrite's.
    awaited = js.run("await 0;\nconst q = 1;\nq.call()")
    assert awaited.error is not None and (awaited.error.type, awaited.error.line) == (
        "TypeError",
        3,
    ), awaited.error
    bad = js.run("const z =\n  1 +")
    assert bad.error is not None and (bad.error.type, bad.error.line) == ("SyntaxError", 2)
    rejected = js.run("await Promise.reject(new RangeError('no'))")
    assert rejected.error is not None and rejected.error.type == "RangeError", rejected
    assert _value(js.run("[typeof f, typeof Oops]")) == "[ 'function', 'function' ]"


def test_process_exit_ends_the_session_clearly(executor: Executor) -> None:
    with executor.session(language="javascript") as s:
        s.run("globalThis.kept = 1")
        r = s.run("process.exit(3)")
        assert r.status is Status.error and r.error is not None, r
        assert "exit code 3" in r.error.message and "session has ended" in r.error.message
        assert s.closed
        with pytest.raises(SessionClosed, match="ended"):
            s.run("kept")


@pytest.mark.parametrize(
    ("language", "exit_code"),
    [("javascript", "process.exit(3)"), ("python", "import os; os._exit(3)")],
)
def test_an_exit_before_the_supervisor_takes_the_cell_still_ends_it_clearly(
    executor: Executor, monkeypatch: pytest.MonkeyPatch, language: str, exit_code: str
) -> None:
    """The code reaches the interpreter before the supervisor gets the cell: a cell that
    exits at once can end the session first. Held back here until it has, the cell still
    gets the session's own ending, not a sandbox error."""
    from execbox.sandbox.host import channel
    from execbox.sandbox.inside import cells

    send = channel.SessionChannel._send

    def late(self: channel.SessionChannel, data: bytes) -> None:
        if data[:4] == cells.CELL and b'"timeout_s"' in data:
            time.sleep(1.0)  # the program exits and its supervisor reports it and leaves
        send(self, data)

    with executor.session(language=language) as s:
        s.run("1")
        monkeypatch.setattr(channel.SessionChannel, "_send", late)
        r = s.run(exit_code)
        assert r.status is Status.error and r.error is not None, r
        assert "exit code 3" in r.error.message and "session has ended" in r.error.message
        assert s.closed


@pytest.mark.serial
def test_sync_and_async_cells_past_their_time_are_interrupted_and_state_survives(
    js: Session,
) -> None:
    js.run("let kept = 7")
    for code in ("while (true) {}", "await new Promise(() => {})"):
        start = time.monotonic()
        r = js.run(code, timeout_s=1)
        assert r.status is Status.timeout, r
        assert time.monotonic() - start < 3, "interrupted at its time, not the grace's end"
        assert not js.closed
    assert _value(js.run("kept")) == "7"


def test_console_output_streams_while_the_cell_runs(js: Session) -> None:
    seen: list[tuple[float, bytes]] = []
    start = time.monotonic()
    r = js.run(
        "console.log('early');\nawait new Promise((r) => setTimeout(r, 1500));\nconsole.log('late')",
        on_stdout=lambda chunk: seen.append((time.monotonic() - start, chunk)),
    )
    assert r.stdout == "early\nlate\n", r
    early = [t for t, chunk in seen if b"early" in chunk]
    assert early and early[0] < 1.0, seen


def test_files_api_and_artifacts_work_for_javascript_cells(js: Session) -> None:
    js.files.write("in.json", b'{"x": [1, 2, 3]}')
    r = js.run(
        "const fs = require('fs');\n"
        "const data = JSON.parse(fs.readFileSync('in.json', 'utf8'));\n"
        "fs.writeFileSync('out.txt', String(data.x.reduce((a, b) => a + b)));\n"
        "data.x.length"
    )
    assert _value(r) == "3"
    assert [a.path for a in r.artifacts] == ["out.txt"]
    assert js.files.read("out.txt") == b"6"


def test_a_profile_denies_a_cells_modules_as_it_denies_a_runs(executor: Executor) -> None:
    with executor.session(language="javascript", profile="minimal") as s:
        assert _value(s.run("const path = require('path'); path.basename('/a/b')")) == "'b'"
        r = s.run("const cp = require('child_process')\ncp.execSync('id')")
        assert r.status is Status.policy_denied and r.error is not None, r
        assert r.error.rule == "js.module_denied", r.error
        assert _value(s.run("typeof cp")) == "'undefined'"  # the denied cell never ran


@pytest.mark.parametrize(
    "code",
    [
        # A cell is a script: its `this` is the global object, where `require` is.
        "this['req' + 'uire']('child_process').execSync('id').toString()",
        "await 0\nthis['req' + 'uire']('child_process').execSync('id').toString()",
        "const g = this\ng['req' + 'uire']('child_process').execSync('id').toString()",
    ],
)
def test_minimal_refuses_the_global_object_reached_as_this(executor: Executor, code: str) -> None:
    with executor.session(language="javascript", profile="minimal") as s:
        r = s.run(code)
        assert r.status is Status.policy_denied and r.error is not None, r
        assert r.error.rule == "js.dynamic", r.error
        assert _value(s.run("this.x = 1; x")) == "1"  # `this.name` stays allowed


def test_a_multi_line_secret_inside_an_object_is_redacted_line_by_line(executor: Executor) -> None:
    # Node's util.inspect shows a multi-line string inside an object one quoted line at a time.
    body = [secrets.token_urlsafe(36) for _ in range(3)]
    pem = "-----BEGIN PRIVATE KEY-----\n" + "\n".join(body) + "\n-----END PRIVATE KEY-----\n"
    code = f"const pem = {json.dumps(pem)}\nconsole.log({{ pem }});\n({{ pem }})"
    with executor.session(language="javascript", secrets=[pem]) as s:
        r = s.run(code)
    shown = r.stdout + "".join(o.data for o in r.outputs)
    assert r.ok and shown.count("[REDACTED:secret]") >= 2, r
    assert not [line for line in body if line in shown], shown


def test_a_cell_filling_the_disk_is_a_disk_limit_as_a_run_is(executor: Executor) -> None:
    code = "const b = Buffer.alloc(1 << 20)\n"
    code += "for (let i = 0; i < 64; i++) require('fs').appendFileSync('/workspace/big', b)"
    with executor.session(language="javascript", limits=Limits(disk_mib=8)) as s:
        r = s.run(code)
        assert r.status is Status.disk_limit and r.error is not None, r
        assert "ENOSPC" in r.error.message or "EFBIG" in r.error.message, r.error
        assert _value(s.run("1 + 1")) == "2"


def test_a_javascript_session_refuses_what_it_cannot_honour(executor: Executor) -> None:
    with pytest.raises(UsageError, match="NODE_OPTIONS"):
        executor.session(language="javascript", env={"NODE_OPTIONS": "--inspect"})
    with pytest.raises(UsageError, match="sessions run python or javascript"):
        executor.session(language="bash")


@pytest.mark.hostile
def test_memory_bomb_in_a_cell_ends_the_session_with_memory_limit(jailed: Executor) -> None:
    with jailed.session(language="javascript", limits=Limits(memory_mib=128)) as s:
        s.run("const keep = []")
        r = s.run("while (true) keep.push(Buffer.alloc(8 << 20, 1))")
        assert r.status is Status.memory_limit, r
        assert r.error is not None and "memory_mib" in r.error.message
        assert s.closed
        with pytest.raises(SessionClosed, match="memory_limit"):
            s.run("1")


@pytest.mark.hostile
def test_two_javascript_sessions_do_not_share_state(jailed: Executor) -> None:
    mark = str(10**8 + secrets.randbelow(10**8))
    with (
        jailed.session(language="javascript") as a,
        jailed.session(language="javascript") as b,
    ):
        assert a.run(
            f"let secret_{mark} = 1; globalThis.g_{mark} = 2;\n"
            f"require('fs').writeFileSync('/workspace/{mark}', 'a');\n"
            f"require('fs').writeFileSync('/tmp/{mark}', 'a');\n"
            f"const timer = setInterval(() => {{}}, 1000)"
        ).ok
        rb = b.run(
            "const fs = require('fs');\n"
            "const procs = fs.readdirSync('/proc').filter((p) => /^\\d+$/.test(p));\n"
            "console.log(JSON.stringify({\n"
            f"  lexical: typeof secret_{mark}, global: typeof g_{mark},\n"
            f"  files: ['/workspace/{mark}', '/tmp/{mark}'].map((p) => fs.existsSync(p)),\n"
            "  nodes: procs.filter((p) => fs.readFileSync(`/proc/${p}/cmdline`, 'latin1')"
            ".startsWith('/')).length,\n"
            "}))"
        )
        assert rb.ok, rb
        assert json.loads(rb.stdout) == {
            "lexical": "undefined",
            "global": "undefined",
            "files": [False, False],
            "nodes": 1,  # its own Node only
        }
        assert _value(a.run(f"secret_{mark} + g_{mark}")) == "3"  # control


def test_a_javascript_session_over_mcp(executor: Executor) -> None:
    from mcp import Client
    from mcp_types import TextContent

    from execbox.mcp.server import build_server

    async def main() -> list[str]:
        async with Client(build_server(executor), read_timeout_seconds=60) as client:
            made = await client.call_tool("session_create", {"language": "javascript"})
            sid = made.structured_content["session_id"]
            texts = []
            for code in ("const a = [1, 2, 3]", "a.map((v) => v * 2)"):
                out = await client.call_tool("session_run", {"session_id": sid, "code": code})
                texts.append("\n".join(c.text for c in out.content if isinstance(c, TextContent)))
            await client.call_tool("session_close", {"session_id": sid})
            return texts

    texts = anyio.run(main)
    assert "[ 2, 4, 6 ]" in texts[1], texts


def test_output_flood_in_a_cell_is_capped_and_the_session_goes_on(executor: Executor) -> None:
    limits = Limits(timeout_s=10, output_bytes=4096)
    with executor.session(language="javascript", limits=limits) as s:
        r = s.run("while (true) console.log('x'.repeat(1000))")
        assert r.status is Status.output_limit, r
        assert r.stdout_truncated and len(r.stdout) == 4096
        assert s.run("console.log('after')").stdout == "after\n"


def test_errors_no_cell_awaits_are_shown_and_the_session_goes_on(js: Session) -> None:
    r = js.run(
        "setTimeout(() => { throw new TypeError('in a timer') }, 0);\n"
        "Promise.reject(new Error('unhandled'));\n"
        "await new Promise((r) => setTimeout(r, 50));\n"
        "'still here'"
    )
    assert _value(r) == "'still here'"
    assert "Uncaught TypeError: in a timer" in r.stderr, r.stderr
    assert "Unhandled promise rejection: Error: unhandled" in r.stderr, r.stderr
    thrown = js.run("throw 42")
    assert thrown.error is not None and thrown.error.type == "ThrownValue", thrown
    assert _value(js.run("1 + 1")) == "2"


def test_cell_cpu_limit_interrupts_and_the_session_survives(executor: Executor) -> None:
    with executor.session(language="javascript", limits=Limits(timeout_s=20, cpu_s=1)) as s:
        r = s.run("let spins = 0; while (true) spins++")
        assert r.status is Status.cpu_limit, r
        assert _value(s.run("spins > 0")) == "true"
