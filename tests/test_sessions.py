"""Sessions: a stateful sandboxed interpreter. Real sandbox, real IPython, real cgroups."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from execbox import Executor, Limits, SessionClosed, Status, UsageError
from execbox.contract import StreamEvent
from execbox.errors import Overloaded
from execbox.records import RunStore
from execbox.sandbox.inside.cgroup import Hierarchy
from tests.probes import host_stats, wait_until

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SMALL = Limits(timeout_s=5, memory_mib=256, pids=32)


@pytest.fixture
def session(executor: Executor) -> Iterator[object]:
    with executor.session(limits=SMALL) as s:
        yield s


def last_text(result: object) -> str:
    outputs = [o for o in result.outputs if o.mime_type == "text/plain"]  # type: ignore[attr-defined]
    assert outputs, f"no text/plain output in {result}"
    return outputs[-1].data  # type: ignore[no-any-return]


def _session_cgroups(executor: Executor) -> set[str]:
    hier = Hierarchy.discover()
    prefix = host_stats(executor).slot_prefix
    return {
        name
        for parent in hier.parent_paths.values()
        for name in os.listdir(parent)
        if name.startswith(prefix) and os.path.isdir(os.path.join(parent, name))
    }


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


# ---- notebook semantics ---------------------------------------------------------------------


def test_variable_set_in_cell_one_is_read_in_cell_three(session: object) -> None:
    assert session.run("x = 40").ok  # type: ignore[attr-defined]
    assert session.run("y = 2").ok  # type: ignore[attr-defined]
    r = session.run("print(x + y)")  # type: ignore[attr-defined]
    assert r.status is Status.ok, r
    assert r.stdout == "42\n"


def test_a_cell_larger_than_the_pipe_buffer_arrives_whole(session: object) -> None:
    # The host writes a cell's code to the interpreter without blocking: a cell bigger than
    # the pipe (64 KiB) is fed as the interpreter reads it, and the next cell is in step.
    body = "".join(secrets.choice("abcdef") for _ in range(300_000))
    r = session.run(f"s = {body!r}\nimport hashlib; hashlib.sha256(s.encode()).hexdigest()")  # type: ignore[attr-defined]
    import hashlib

    assert r.ok, r
    assert last_text(r) == repr(hashlib.sha256(body.encode()).hexdigest())
    assert last_text(session.run("len(s)")) == "300000"  # type: ignore[attr-defined]


def test_last_expression_value_is_a_text_plain_output(session: object) -> None:
    r = session.run("a = 6\nprint('side effect')\na * 7")  # type: ignore[attr-defined]
    assert r.status is Status.ok
    assert r.stdout == "side effect\n"  # the value is an output, not printed
    assert [(o.mime_type, o.data) for o in r.outputs] == [("text/plain", "42")]
    assert session.run("a * 7;").outputs == []  # type: ignore[attr-defined]  # ';' hides it


def test_dataframe_renders_as_text_and_html_then_plots_as_a_valid_png(session: object) -> None:
    r = session.run(  # type: ignore[attr-defined]
        "import pandas as pd\ndf = pd.DataFrame({'x': [1, 2, 3], 'y': [2, 4, 8]})\ndf"
    )
    assert r.status is Status.ok, r
    kinds = [o.mime_type for o in r.outputs]
    assert kinds == ["text/plain", "text/html"]
    assert "<table" in r.outputs[1].data and "x" in r.outputs[0].data
    r = session.run("ax = df.plot(x='x', y='y')\nax.set_title('growth')")  # type: ignore[attr-defined]
    assert r.status is Status.ok, r
    pngs = [o for o in r.outputs if o.mime_type == "image/png"]
    assert len(pngs) == 1, r.outputs
    data = base64.b64decode(pngs[0].data)
    assert data.startswith(PNG_MAGIC) and len(data) > 1000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > 100 and height > 100
    # The figure was closed: the next cell does not send it again.
    assert session.run("1").outputs[0].data == "1"  # type: ignore[attr-defined]
    assert last_text(session.run("import matplotlib.pyplot as plt\nlen(plt.get_fignums())")) == "0"  # type: ignore[attr-defined]


def test_plt_show_and_display_outputs_are_captured_in_order(session: object) -> None:
    r = session.run(  # type: ignore[attr-defined]
        "import matplotlib.pyplot as plt\nfrom IPython.display import display, HTML\n"
        "display(HTML('<b>first</b>'))\nplt.plot([1, 2])\nplt.show()\n"
        "display({'k': 1}, raw=False)\n'last'"
    )
    assert r.status is Status.ok, r
    kinds = [o.mime_type for o in r.outputs]
    assert kinds[:3] == ["text/plain", "text/html", "image/png"], kinds
    assert r.outputs[1].data == "<b>first</b>"
    assert r.outputs[-1].data == "'last'"


def test_exception_reports_type_and_cell_line_and_next_cell_works(session: object) -> None:
    session.run("def f(v):\n    return 1 / v")  # type: ignore[attr-defined]
    r = session.run("z = 3\n\nf(0)")  # type: ignore[attr-defined]
    assert r.status is Status.error
    assert r.error is not None and r.error.type == "ZeroDivisionError"
    assert r.error.line == 3
    assert "ZeroDivisionError" in r.stderr and "ZeroDivisionError" in (r.error.traceback or "")
    assert last_text(session.run("z")) == "3"  # type: ignore[attr-defined]


def test_syntax_error_has_line_and_column_and_session_stays_usable(session: object) -> None:
    r = session.run("ok = 1\nx = (1,\n  2))")  # type: ignore[attr-defined]
    assert r.status is Status.error
    assert r.error is not None and r.error.type == "SyntaxError"
    assert r.error.line == 3 and r.error.column is not None
    assert session.run("print('still here')").stdout == "still here\n"  # type: ignore[attr-defined]


def test_cell_files_are_artifacts_only_when_new_or_changed(session: object) -> None:
    r = session.run("open('a.csv', 'w').write('x\\n1\\n')")  # type: ignore[attr-defined]
    assert [a.path for a in r.artifacts] == ["a.csv"]
    assert r.artifacts[0].data == b"x\n1\n"
    assert session.run("print(open('a.csv').read())").artifacts == []  # type: ignore[attr-defined]
    r = session.run("open('a.csv', 'a').write('2\\n')")  # type: ignore[attr-defined]
    assert [(a.path, a.data) for a in r.artifacts] == [("a.csv", b"x\n1\n2\n")]


# ---- per-cell limits ----------------------------------------------------------------------------


@pytest.mark.serial
def test_runaway_cell_is_interrupted_and_the_session_still_answers(session: object) -> None:
    session.run("kept = 'state'")  # type: ignore[attr-defined]
    started = time.monotonic()
    r = session.run("while True:\n    pass", timeout_s=1)  # type: ignore[attr-defined]
    assert time.monotonic() - started < 4
    assert r.status is Status.timeout
    assert r.error is not None and "timeout_s" in r.error.message
    assert "KeyboardInterrupt" in (r.error.traceback or "")
    assert last_text(session.run("kept")) == "'state'"  # type: ignore[attr-defined]


def test_cell_that_ignores_the_interrupt_ends_the_session_clearly(executor: Executor) -> None:
    with executor.session(limits=SMALL) as s:
        r = s.run(
            "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)",
            timeout_s=1,
        )
        assert r.status is Status.timeout
        assert r.error is not None and "session was ended" in r.error.message
        assert s.closed
        with pytest.raises(SessionClosed, match="ended"):
            s.run("1")


def test_cell_cpu_limit_interrupts_and_session_survives(executor: Executor) -> None:
    with executor.session(limits=Limits(timeout_s=10, cpu_s=0.5)) as s:
        r = s.run("n = 0\nwhile True:\n    n += 1")
        assert r.status is Status.cpu_limit, r
        assert r.error is not None and "cpu_s" in r.error.message
        assert int(last_text(s.run("n"))) > 0


def test_output_flood_in_a_cell_is_capped_and_session_survives(executor: Executor) -> None:
    with executor.session(limits=Limits(output_bytes=4096)) as s:
        r = s.run("while True:\n    print('x' * 1000)")
        assert r.status is Status.output_limit, r
        assert r.stdout_truncated and len(r.stdout) == 4096
        assert s.run("print('after')").stdout == "after\n"


@pytest.mark.hostile
def test_memory_bomb_ends_the_session_with_memory_limit(jailed: Executor) -> None:
    with jailed.session(limits=Limits(memory_mib=128)) as s:
        s.run("kept = 1")
        r = s.run("blocks = []\nwhile True:\n    blocks.append(bytearray(8 << 20))")
        assert r.status is Status.memory_limit, r
        assert r.error is not None and "memory_mib" in r.error.message
        assert s.closed
        with pytest.raises(SessionClosed, match="memory_limit"):
            s.run("kept")
        with pytest.raises(SessionClosed):
            s.files.list()


@pytest.mark.hostile
def test_forbidden_syscall_in_a_cell_ends_the_session(jailed: Executor) -> None:
    with jailed.session() as s:
        r = s.run("import ctypes\nctypes.CDLL(None).ptrace(0, 0, 0, 0)")
        assert r.status is Status.forbidden, r
        with pytest.raises(SessionClosed, match="forbidden"):
            s.run("1")


def test_os_exit_in_a_cell_ends_the_session_and_later_calls_say_so(session: object) -> None:
    r = session.run("import os\nos._exit(3)")  # type: ignore[attr-defined]
    assert r.status is Status.error
    assert r.error is not None and "session has ended" in r.error.message
    with pytest.raises(SessionClosed, match="ended"):
        session.run("1")  # type: ignore[attr-defined]


# ---- files ----------------------------------------------------------------------------------------


def test_files_write_read_list_remove(session: object) -> None:
    files = session.files  # type: ignore[attr-defined]
    art = files.write("data/in.csv", b"a,b\n1,2\n")
    assert art.size == 8 and art.path == "data/in.csv"
    r = session.run("import pandas as pd\nint(pd.read_csv('data/in.csv').b.sum())")  # type: ignore[attr-defined]
    assert last_text(r) == "2"
    assert r.artifacts == []  # what the caller uploaded is not the cell's doing
    session.run("open('out.bin', 'wb').write(bytes(range(256)))")  # type: ignore[attr-defined]
    assert files.read("out.bin") == bytes(range(256))
    assert [(a.path, a.size) for a in files.list()] == [("data/in.csv", 8), ("out.bin", 256)]
    files.remove("out.bin")
    assert [a.path for a in files.list()] == ["data/in.csv"]
    with pytest.raises(UsageError, match="no file"):
        files.read("out.bin")
    with pytest.raises(UsageError, match="clean relative path"):
        files.read("../etc/passwd")


def test_session_input_files_are_read_only(executor: Executor) -> None:
    with executor.session(files={"in.txt": b"given"}) as s:
        r = s.run("print(open('in.txt').read())\nopen('in.txt', 'w')")
        assert r.stdout == "given\n"
        assert r.error is not None and r.error.type == "PermissionError"


@pytest.mark.hostile
def test_files_api_never_follows_links_or_opens_fifos(jailed: Executor) -> None:
    with jailed.session() as s:
        r = s.run(
            "import os\nos.symlink('/etc/passwd', 'link')\nos.mkfifo('fifo')\n"
            "os.symlink('/etc', 'dirlink')"
        )
        assert r.ok, r
        with pytest.raises(UsageError, match="not a regular file"):
            s.files.read("link")
        with pytest.raises(UsageError, match="not a regular file"):
            s.files.read("fifo")  # would block forever if it were opened
        with pytest.raises(UsageError, match="not a directory"):
            s.files.write("dirlink/owned", b"x")
        with pytest.raises(UsageError, match="not a directory"):
            s.files.read("dirlink/passwd")
        # Writing over a link replaces the link; the target is untouched.
        s.files.write("link", b"replaced")
        r = s.run(
            "import os\nprint(os.path.islink('link'), open('link').read(), "
            "os.stat('link').st_uid == os.getuid())"
        )
        assert r.stdout == "False replaced True\n", r
        assert [a.path for a in s.files.list()] == ["link"]


def test_cell_filling_the_disk_gets_disk_limit_and_session_survives(executor: Executor) -> None:
    with executor.session(limits=Limits(disk_mib=2)) as s:
        r = s.run("open('big.bin', 'wb').write(b'\\0' * (4 << 20))")
        assert r.status is Status.disk_limit, r
        assert r.error is not None and "disk_mib" in r.error.message
        assert s.run("import os\nos.remove('big.bin')\nprint('freed')").stdout == "freed\n"


def test_files_write_past_the_disk_limit_fails_clearly(executor: Executor) -> None:
    with executor.session(limits=Limits(disk_mib=1)) as s:
        with pytest.raises(UsageError, match="disk_mib"):
            s.files.write("big.bin", b"\0" * (3 << 20))
        assert s.files.list() == []
        assert s.run("print('alive')").stdout == "alive\n"


# ---- isolation between sessions -------------------------------------------------------------


@pytest.mark.hostile
def test_two_sessions_cannot_see_each_others_state(jailed: Executor) -> None:
    mark = str(10**8 + secrets.randbelow(10**8))
    with jailed.session() as a, jailed.session() as b:
        ra = a.run(
            f"secret_{mark} = 1\nopen('/workspace/{mark}', 'w').write('a')\n"
            f"open('/tmp/{mark}', 'w').write('a')\n"
            "import socket, subprocess\n"
            f"u = socket.socket(socket.AF_UNIX)\nu.bind('\\0execbox-{mark}')\nu.listen()\n"
            f"child = subprocess.Popen(['sleep', '{mark}'])"
        )
        assert ra.ok, ra
        rb = b.run(
            "import os, socket, json\n"
            f"names = [n for n in dir() if n.startswith('secret_')]\n"
            f"files = [os.path.exists(p) for p in ('/workspace/{mark}', '/tmp/{mark}')]\n"
            "procs = []\n"
            "for p in os.listdir('/proc'):\n"
            "    if p.isdigit():\n"
            "        procs.append(open(f'/proc/{p}/cmdline', 'rb').read())\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            f"try:\n    s.connect('\\0execbox-{mark}'); sock = 'connected'\n"
            "except OSError as e:\n    sock = type(e).__name__\n"
            "print(json.dumps({'names': names, 'files': files, 'sock': sock,\n"
            "                  'sleep_seen': any(c.startswith(b'sleep') for c in procs)}))"
        )
        assert rb.ok, rb
        assert json.loads(rb.stdout) == {
            "names": [],
            "files": [False, False],
            "sock": "ConnectionRefusedError",
            "sleep_seen": False,
        }
        # Control: the first session does have all of it.
        rc = a.run(
            "import os\nprint(os.path.exists('/workspace/" + mark + "'), "
            "any(open(f'/proc/{p}/cmdline','rb').read().startswith(b'sleep') "
            "for p in os.listdir('/proc') if p.isdigit()))"
        )
        assert rc.stdout == "True True\n", rc


def test_a_session_state_never_reaches_a_run(executor: Executor) -> None:
    with executor.session() as s:
        s.run("leak = 'yes'\nopen('left.txt', 'w').write('x')")
        r = executor.run("import os\nprint('leak' in dir(), os.listdir('/workspace'))")
        assert r.stdout == "False []\n"


# ---- lifecycle --------------------------------------------------------------------------------


def test_idle_session_expires_and_frees_its_processes_and_cgroup(executor: Executor) -> None:
    before = _session_cgroups(executor)
    marker = f"9{secrets.randbelow(10**8)}"
    s = executor.session(idle_timeout_s=1.0)
    s.run(f"import subprocess\np = subprocess.Popen(['sleep', '{marker}'])")
    mine = _session_cgroups(executor) - before
    # Popen returns before the exec'd program's argv shows in /proc: poll for it.
    wait_until(lambda: _processes_with(f"sleep\0{marker}"), 5)
    assert _processes_with(f"sleep\0{marker}"), "control: the session's child is visible"
    wait_until(lambda: s.closed, 10)
    assert s.closed and "idle" in (s.end_reason or "")
    with pytest.raises(SessionClosed, match="idle"):
        s.run("1")
    wait_until(
        lambda: not (_processes_with(f"sleep\0{marker}") or _session_cgroups(executor) & mine), 5
    )
    assert not _processes_with(f"sleep\0{marker}"), "the session's process outlived it"
    assert not (_session_cgroups(executor) & mine - host_stats(executor).idle_slots), (
        "the session's cgroup outlived it"
    )


def test_session_maximum_lifetime_ends_it(executor: Executor) -> None:
    s = executor.session(max_lifetime_s=1.0)
    assert s.run("1").ok
    r = s.run("import time\ntime.sleep(8)", timeout_s=10)
    assert r.status is Status.timeout and r.error is not None
    assert "maximum lifetime" in r.error.message
    with pytest.raises(SessionClosed, match="lifetime"):
        s.run("1")


def test_session_cap_gives_a_clear_error(executor: Executor) -> None:
    old = executor.max_sessions
    executor.max_sessions = len(executor.live_sessions()) + 1
    try:
        with executor.session():
            with pytest.raises(Overloaded, match="max_sessions"):
                executor.session()
        with executor.session():  # the closed one's place is free again
            pass
    finally:
        executor.max_sessions = old


def test_closing_the_executor_kills_every_session() -> None:
    with Executor(cache=False) as ex:
        s = ex.session()
        marker = f"8{secrets.randbelow(10**8)}"
        s.run(f"import subprocess\np = subprocess.Popen(['sleep', '{marker}'])")
        box: list[object] = []
        running = threading.Event()
        t = threading.Thread(
            target=lambda: box.append(
                s.run(
                    "import time\nprint('on', flush=True)\ntime.sleep(30)",
                    timeout_s=60,
                    on_stdout=lambda _: running.set(),
                )
            )
        )
        t.start()
        assert running.wait(10), "the cell never ran"  # the executor closes mid-cell
    t.join(10)
    assert not t.is_alive()
    assert s.closed
    wait_until(lambda: not _processes_with(f"sleep\0{marker}"), 3)  # killed: may still show
    assert not _processes_with(f"sleep\0{marker}")


def test_get_session_and_closed_session_errors(executor: Executor) -> None:
    s = executor.session()
    assert executor.get_session(s.id) is s
    s.close()
    with pytest.raises(UsageError, match="no open session"):
        executor.get_session(s.id)
    with pytest.raises(SessionClosed, match="closed by the caller"):
        s.run("1")
    with pytest.raises(SessionClosed):
        s.files.write("a", b"b")
    s.close()  # closing twice is fine


def test_bad_session_arguments_are_usage_errors(executor: Executor) -> None:
    with pytest.raises(UsageError, match="idle_timeout_s"):
        executor.session(idle_timeout_s=0)
    with pytest.raises(UsageError, match="profile"):
        executor.session(profile="no-such-profile")
    with executor.session() as s, pytest.raises(UsageError, match="timeout_s"):
        s.run("1", timeout_s=-1)


# ---- live output ----------------------------------------------------------------------------


def test_live_output_arrives_before_the_cell_ends(session: object) -> None:
    stamps: list[tuple[float, bytes]] = []
    started = time.monotonic()
    r = session.run(  # type: ignore[attr-defined]
        "import time\nprint('first', flush=True)\ntime.sleep(1.0)\nprint('second')",
        on_stdout=lambda b: stamps.append((time.monotonic(), b)),
    )
    ended = time.monotonic()
    assert r.stdout == "first\nsecond\n"
    assert stamps and stamps[0][1].startswith(b"first")
    assert stamps[0][0] - started < 0.8 and ended - stamps[0][0] > 0.5


def test_async_stream_yields_output_then_result(executor: Executor) -> None:
    async def collect(source: AsyncIterator[StreamEvent]) -> list[tuple[StreamEvent, float]]:
        events = []
        async for event in source:
            events.append((event, time.monotonic()))
        return events

    with executor.session() as s:
        events = asyncio.run(
            collect(
                s.astream("import time\nprint('a', flush=True)\ntime.sleep(0.8)\nprint('b')\n7")
            )
        )
    kinds = [e.kind for e, _ in events]
    assert kinds[0] == "stdout" and kinds[-1] == "result"
    assert events[-1][1] - events[0][1] > 0.5  # the first chunk came while it slept
    result = events[-1][0].result
    assert result is not None and result.stdout == "a\nb\n" and result.outputs[0].data == "7"
    run_events = asyncio.run(collect(executor.astream("print('x')")))
    assert [e.kind for e, _ in run_events] == ["stdout", "result"]


# ---- the pipeline -------------------------------------------------------------------------------


def test_cells_are_policy_checked_redacted_and_recorded(executor: Executor) -> None:
    secret = "sk-" + secrets.token_hex(16)
    with executor.session(profile="minimal", secrets=[secret]) as s:
        denied = s.run("import socket")
        assert denied.status is Status.policy_denied and denied.error is not None
        assert denied.error.rule
        r = s.run(f"print('{secret}')\n'{secret}'")
        assert secret not in r.stdout and secret not in json.dumps([o.data for o in r.outputs])
        store: RunStore = executor.store
        records = store.list(session_id=s.id, limit=10)
        assert {rec.run_id for rec in records} == {denied.run_id, r.run_id}
        assert all(rec.kind == "cell" and rec.session_id == s.id for rec in records)
        assert all(secret not in rec.result.model_dump_json() for rec in records)
        assert r.session_id == s.id


def test_a_budget_shared_by_cells_runs_out(executor: Executor) -> None:
    from execbox.budget import Budget

    budget = Budget(exec_s=1.5)  # the first cell has 1.2 s of room on a loaded machine
    with executor.session() as s:
        assert s.run("import time\ntime.sleep(0.3)", budget=budget).ok
        r = s.run("time.sleep(2)", budget=budget)
        assert r.status is Status.budget_exceeded, r
        assert s.run("print('budget is per call')").ok


def test_session_environment_is_exactly_what_was_given(executor: Executor) -> None:
    with executor.session(env={"GREETING": "hello"}) as s:
        r = s.run("import os\nprint(sorted(os.environ.items()))")
        assert r.stdout == "[('GREETING', 'hello')]\n", r


def test_a_dataframe_showing_a_secret_cut_or_html_escaped_is_redacted(executor: Executor) -> None:
    """pandas shows a long cell's first 47 characters then "...", in print() and in both
    displays, and escapes only & < > in its HTML: neither the start nor the escaped value
    is left."""
    long = "ghx_" + os.urandom(26).hex()
    quoted = "p&ss\"w'rd<9>" + os.urandom(4).hex()
    with executor.session(limits=SMALL, secrets=[long, quoted]) as s:
        shown = s.run(
            "import pandas as pd\n"
            f"df = pd.DataFrame({{'token': [{long!r}], 'pw': [{quoted!r}]}})\n"
            "print(df['token'])\n"
            "df\n"
        )
    assert shown.status is Status.ok, shown.error
    mimes = [o.mime_type for o in shown.outputs]
    assert "text/html" in mimes and "text/plain" in mimes, mimes
    texts = [shown.stdout, *(o.data for o in shown.outputs)]
    assert all("[REDACTED:secret]..." in text for text in texts), texts
    for text in texts:
        assert long[:20] not in text and quoted[-8:] not in text, text


def test_ipython_display_of_a_secret_in_a_dict_or_list_is_redacted(executor: Executor) -> None:
    """The notebook's ordinary display of a container (text/plain: its repr) and a JSON
    display (application/json) show a value escaped; both are redacted, as are repr() and
    json.dumps() printed, in the outputs and in the cell's record."""
    secret = "k\\e\"y 'é-" + os.urandom(6).hex()
    with executor.session(limits=SMALL, secrets=[secret]) as s:
        s.run(f"v = {secret!r}")
        shown = s.run(
            "from IPython.display import JSON, display\n"
            "import json\n"
            "print(repr(v), json.dumps(v))\n"
            "display(JSON({'token': v}))\n"
            "{'token': v, 'list': [v]}\n"
        )
    assert shown.status is Status.ok, shown.error
    mimes = [o.mime_type for o in shown.outputs]
    assert "application/json" in mimes and "text/plain" in mimes, mimes
    for text in [shown.stdout, *(o.data for o in shown.outputs)]:
        assert secret[-12:] not in text, text
    json_out = next(o.data for o in shown.outputs if o.mime_type == "application/json")
    assert shown.stdout.count("[REDACTED:secret]") == 2
    assert json.loads(json_out) == {"token": "[REDACTED:secret]"}
    assert last_text(shown).count("[REDACTED:secret]") == 2
    executor.store.settle()
    record = executor.store.get(shown.run_id)
    assert record is not None and secret[-12:] not in record.model_dump_json()


def test_a_caller_holding_a_thousand_descriptors_runs_and_closes_sessions() -> None:
    """A busy server holds more than a thousand descriptors: the host's pidfds then have
    numbers select() refuses (a suite that leaked descriptors failed this way)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the hard limit on open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        assert held[-1] >= 1024
        with Executor(cache=False) as ex:
            assert ex.run("print(1)").stdout == "1\n"
            with ex.session() as session:
                assert session.run("print(2)").stdout == "2\n"
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
