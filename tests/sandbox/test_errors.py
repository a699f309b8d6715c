"""How a run's failure is reported: structured errors, exit codes, signals and limit messages.

Benign failing programs use `executor`; anything that forks, floods, signals itself or tampers
with the sandbox's descriptors uses `jailed`.
"""

from __future__ import annotations

import json

import pytest

from execbox import Executor, RunResult, Status
from execbox.sandbox.inside.jail import RunSpec
from execbox.sandbox.inside.outcome import classify

INTERNALS = ("execbox", "runner.py", "supervisor.py", "zygote.py", "jail.py", "_program", "_init")
LIBRARY_INTERNALS = ("execbox/sandbox", "runner.py", "supervisor.py", "zygote.py", "jail.py")


def assert_clean_traceback(text: str | None, forbidden: tuple[str, ...] = INTERNALS) -> None:
    assert text is not None
    for word in forbidden:
        assert word not in text, f"{word!r} leaks into the traceback:\n{text}"


def assert_json_roundtrip(r: RunResult) -> None:
    assert json.loads(r.model_dump_json())["status"] == r.status.value


# ---- uncaught exceptions ----------------------------------------------------------------------


@pytest.mark.parametrize("prelude", ["", "import numpy\n"], ids=["light", "heavy"])
def test_a_failed_assert_is_reported_whole_and_the_zygotes_exercise_left_nothing(
    executor: Executor, prelude: str
) -> None:
    # Program zygotes take an error through this path before they fork (see
    # runner.exercise_errors): the report is the code's own, and nothing of the exercise shows.
    code = prelude + (
        "import linecache\n"
        "assert not [k for k in linecache.cache if 'exercise' in k], list(linecache.cache)\n"
        "def check(candidate):\n"
        "    assert candidate([1, 2], 3) == [3, 2, 1]\n"
        "check(lambda xs, n: None)\n"
    )
    r = executor.run(code)
    assert r.status is Status.error, r
    assert r.error is not None
    line = code.splitlines().index("    assert candidate([1, 2], 3) == [3, 2, 1]") + 1
    assert (r.error.type, r.error.message, r.error.line) == ("AssertionError", "", line)
    assert r.error.traceback is not None
    assert r.error.traceback.startswith('Traceback (most recent call last):\n  File "main.py"')
    assert r.error.traceback.endswith(
        f'  File "main.py", line {line}, in check\n'
        "    assert candidate([1, 2], 3) == [3, 2, 1]\n"
        f"           {'^' * len('candidate([1, 2], 3) == [3, 2, 1]')}\nAssertionError\n"
    )
    assert r.stderr == r.error.traceback
    assert_clean_traceback(r.error.traceback)


# ---- syntax errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code, kind, message, line, column",
    [
        pytest.param(
            "x = 1\ny = 2\nz = (3 +)\n", "SyntaxError", "invalid syntax", 3, 9, id="invalid-syntax"
        ),
        pytest.param(
            "x = 1\ny = 2\nz = 'abc\n",
            "SyntaxError",
            "unterminated string literal (detected at line 3)",
            3,
            5,
            id="unterminated",
        ),
        pytest.param(
            "if True:\nprint(1)\n",
            "IndentationError",
            "expected an indented block after 'if' statement on line 1",
            2,
            1,
            id="expected-indent",
        ),
        pytest.param(
            "if True:\n    x = 1\n      y = 2\n",
            "IndentationError",
            "unexpected indent",
            3,
            6,
            id="unexpected-indent",
        ),
    ],
)
def test_syntax_error_reports_type_message_line_and_column(
    executor: Executor, code: str, kind: str, message: str, line: int, column: int
) -> None:
    r = executor.run(code)
    assert r.status is Status.error, r
    assert r.exit_code == 1 and r.signal is None
    assert r.error is not None
    assert (r.error.type, r.error.message, r.error.line, r.error.column) == (
        kind,
        message,
        line,
        column,
    )
    assert 'File "main.py", line ' + str(line) in (r.error.traceback or "")
    assert_clean_traceback(r.error.traceback)
    assert_clean_traceback(r.stderr)
    assert r.stdout == ""


def test_syntax_error_means_no_line_of_the_program_ran(executor: Executor) -> None:
    r = executor.run("print('ran')\nx = = 1\n")
    assert r.status is Status.error
    assert r.stdout == ""
    assert r.error is not None and (r.error.type, r.error.line) == ("SyntaxError", 2)


# ---- uncaught exceptions ---------------------------------------------------------------------

NESTED = (
    "import os\n"
    "def scale(x):\n"
    "    y = x * 2\n"
    "    raise ValueError(f'bad value {y}')\n"
    "z = 0\n"
    "scale(21)\n"
)


def test_uncaught_exception_reports_deepest_user_line_and_only_user_frames(
    executor: Executor,
) -> None:
    r = executor.run(NESTED)
    assert r.status is Status.error, r
    assert r.exit_code == 1 and r.signal is None
    assert r.error is not None
    assert (r.error.type, r.error.message, r.error.line) == ("ValueError", "bad value 42", 4)
    tb = r.error.traceback or ""
    assert tb.startswith("Traceback (most recent call last):\n")
    assert 'File "main.py", line 6, in <module>\n    scale(21)' in tb
    assert 'File "main.py", line 4, in scale\n    raise ValueError' in tb
    assert tb.rstrip().endswith("ValueError: bad value 42")
    assert tb.count('File "') == 2  # exactly the two user frames
    assert_clean_traceback(tb)
    assert r.stderr == tb  # what the program's stderr shows is the same clean traceback


@pytest.mark.parametrize(
    "code, kind, line",
    [
        pytest.param("import json\n\ndata = json.loads('{bad')\n", "JSONDecodeError", 3, id="json"),
        pytest.param(
            "import io\nimport pandas as pd\n"
            "df = pd.read_csv(io.StringIO('a,b\\n1,2\\n'))\n"
            "print(df['nope'])\n",
            "KeyError",
            4,
            id="pandas-keyerror",
        ),
        pytest.param(
            "import pandas as pd\n\n\npd.read_csv('missing.csv')\n",
            "FileNotFoundError",
            4,
            id="pandas-missing-file",
        ),
        pytest.param(
            "import numpy as np\na = np.ones(3)\nb = np.ones(4)\nc = a @ b\n",
            "ValueError",
            4,
            id="numpy-shape",
        ),
    ],
)
def test_exception_inside_a_library_reports_the_users_line(
    executor: Executor, code: str, kind: str, line: int
) -> None:
    r = executor.run(code)
    assert r.status is Status.error, r
    assert r.error is not None
    assert (r.error.type, r.error.line) == (kind, line)
    assert f'File "main.py", line {line}, in <module>' in (r.error.traceback or "")
    assert_clean_traceback(r.error.traceback, LIBRARY_INTERNALS)


def test_chained_exception_reports_the_final_exception_and_its_line(executor: Executor) -> None:
    code = "try:\n    1/0\nexcept ZeroDivisionError:\n    raise KeyError('k')\n"
    r = executor.run(code)
    assert r.status is Status.error
    assert r.error is not None
    assert (r.error.type, r.error.message, r.error.line) == ("KeyError", "'k'", 4)
    assert "During handling of the above exception" in (r.error.traceback or "")
    assert_clean_traceback(r.error.traceback)


def test_recursion_error_reports_the_recursive_line_and_a_bounded_traceback(
    executor: Executor,
) -> None:
    r = executor.run("def f(n):\n    return f(n + 1)\nf(0)\n")
    assert r.status is Status.error
    assert r.error is not None
    assert (r.error.type, r.error.line) == ("RecursionError", 2)
    assert len(r.error.traceback or "") <= 32 * 1024 + 8
    assert_clean_traceback(r.error.traceback)


def test_exception_with_a_long_message_still_reports_type_and_line(executor: Executor) -> None:
    r = executor.run("def f():\n    raise ValueError('m' * 100_000)\nf()\n")
    assert r.status is Status.error, r
    assert r.error is not None
    assert (r.error.type, r.error.line) == ("ValueError", 2), r.error
    assert r.error.message.startswith("mmmm")


def test_exception_with_a_non_ascii_message_of_60_kb_still_reports_type_and_line(
    executor: Executor,
) -> None:
    # 20,000 euro signs: 60 KB of UTF-8, 120 KB once json.dumps escapes them.
    r = executor.run("def f():\n    raise ValueError('\\u20ac' * 20_000)\nf()\n")
    assert r.status is Status.error, r
    assert r.error is not None
    assert (r.error.type, r.error.line) == ("ValueError", 2), r.error


def test_exception_whose_str_raises_still_reports_type_and_line(executor: Executor) -> None:
    code = (
        "class Weird(Exception):\n"
        "    def __str__(self):\n"
        "        raise RuntimeError('no str for you')\n"
        "def f():\n"
        "    raise Weird()\n"
        "f()\n"
    )
    r = executor.run(code)
    assert r.status is Status.error, r
    assert r.exit_code == 1
    assert r.error is not None
    assert (r.error.type, r.error.line) == ("Weird", 5), r.error
    assert "Weird" in r.stderr


@pytest.mark.parametrize(
    "code",
    [
        pytest.param("raise ValueError('bad \\udcff name')\n", id="message"),
        pytest.param(
            "class E(Exception):\n    pass\nE.__module__ = 'mod\\udcff'\nraise E('x')\n",
            id="traceback-only",
        ),
    ],
)
def test_exception_text_with_a_lone_surrogate_still_gives_a_json_serializable_result(
    executor: Executor, code: str
) -> None:
    r = executor.run(code)
    assert r.status is Status.error, r
    assert r.error is not None and r.error.line in (1, 4)
    decoded = json.loads(r.model_dump_json())  # must not raise PydanticSerializationError
    assert decoded["error"]["line"] == r.error.line


def test_exception_in_a_forked_child_is_not_the_runs_error(jailed: Executor) -> None:
    code = (
        "import os\n"
        "if os.fork() == 0:\n"
        "    raise ValueError('child only')\n"
        "os.wait()\n"
        "print('parent ok')\n"
    )
    r = jailed.run(code)
    assert r.status is Status.ok, r
    assert r.error is None and r.exit_code == 0
    assert r.stdout == "parent ok\n"
    assert "ValueError: child only" in r.stderr


def test_exception_in_a_thread_does_not_fail_the_run(executor: Executor) -> None:
    code = (
        "import threading\n"
        "def boom():\n"
        "    raise ValueError('in thread')\n"
        "t = threading.Thread(target=boom)\n"
        "t.start(); t.join()\n"
        "print('main fine')\n"
    )
    r = executor.run(code)
    assert r.status is Status.ok and r.error is None
    assert r.stdout == "main fine\n"
    assert "ValueError: in thread" in r.stderr


# ---- exit codes and signals ------------------------------------------------------------------


@pytest.mark.parametrize(
    "code, status, exit_code, stderr",
    [
        pytest.param("import sys\nsys.exit(0)\n", Status.ok, 0, "", id="exit-0"),
        pytest.param("raise SystemExit\n", Status.ok, 0, "", id="systemexit-none"),
        pytest.param("import sys\nsys.exit(3)\n", Status.error, 3, "", id="exit-3"),
        pytest.param("import sys\nsys.exit('bye')\n", Status.error, 1, "bye\n", id="exit-message"),
        pytest.param("import os\nos._exit(5)\n", Status.error, 5, "", id="os-exit-5"),
        pytest.param("import os\nos._exit(0)\n", Status.ok, 0, "", id="os-exit-0"),
    ],
)
def test_exit_code_is_reported_and_nonzero_is_an_error(
    executor: Executor, code: str, status: Status, exit_code: int, stderr: str
) -> None:
    r = executor.run(code)
    assert r.status is status, r
    assert r.exit_code == exit_code and r.signal is None
    assert r.stderr == stderr
    if status is Status.ok:
        assert r.error is None
    else:
        assert r.error is not None
        assert r.error.type == "ProcessError"
        assert r.error.message == f"the program ended with exit code {exit_code}"
        assert r.error.line is None


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL", "SIGSEGV", "SIGABRT"])
def test_program_killed_by_its_own_signal_reports_the_signal_as_an_error(
    jailed: Executor, sig: str
) -> None:
    r = jailed.run(f"import os, signal\nos.kill(os.getpid(), signal.{sig})\n")
    assert r.status is Status.error, r
    assert r.signal == sig and r.exit_code is None
    assert r.error is not None
    assert r.error.type == "ProcessError"
    assert r.error.message == f"the program ended with signal {sig}"


def test_keyboard_interrupt_from_sigint_is_a_structured_error(jailed: Executor) -> None:
    r = jailed.run("import os, signal\n\nos.kill(os.getpid(), signal.SIGINT)\n")
    assert r.status is Status.error, r
    assert r.exit_code == 1
    assert r.error is not None and (r.error.type, r.error.line) == ("KeyboardInterrupt", 3)


# ---- limits in errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code, limits, status, kind, words",
    [
        pytest.param(
            "import time\ntime.sleep(60)\n",
            {"timeout_s": 0.5},
            Status.timeout,
            "TimeoutError",
            ["wall time", "0.5 s", "limits.timeout_s", "--timeout"],
            id="timeout",
        ),
        pytest.param(
            "while True:\n    pass\n",
            {"cpu_s": 0.5, "timeout_s": 10},
            Status.cpu_limit,
            "CPULimitExceeded",
            ["CPU time", "0.5 s", "limits.cpu_s", "--cpu"],
            id="cpu",
        ),
        pytest.param(
            "x = bytearray(200 << 20)\nfor i in range(0, len(x), 4096):\n    x[i] = 1\n",
            {"memory_mib": 48},
            Status.memory_limit,
            "MemoryLimitExceeded",
            ["memory", "48 MiB", "limits.memory_mib", "--memory"],
            id="memory",
        ),
        pytest.param(
            "while True:\n    print('o' * 1000)\n",
            {"output_bytes": 4096},
            Status.output_limit,
            "OutputLimitExceeded",
            ["4096 bytes", "limits.output_bytes", "--output-bytes"],
            id="output",
        ),
        pytest.param(
            "open('f', 'wb').write(b'd' * (4 << 20))\n",
            {"disk_mib": 2},
            Status.disk_limit,
            "DiskLimitExceeded",
            ["disk", "2 MiB", "/workspace", "limits.disk_mib", "--disk"],
            id="disk",
        ),
    ],
)
def test_limit_error_names_the_limit_and_the_setting_to_raise(
    jailed: Executor,
    code: str,
    limits: dict[str, float],
    status: Status,
    kind: str,
    words: list[str],
) -> None:
    r = jailed.run(code, limits=limits)
    assert r.status is status, r
    assert r.error is not None
    assert r.error.type == kind
    for word in words:
        assert word in r.error.message, (word, r.error.message)
    assert r.error.line is None and r.error.column is None
    assert_json_roundtrip(r)


def test_explicit_memory_error_is_reported_as_memory_limit(executor: Executor) -> None:
    r = executor.run("x = 1\nraise MemoryError('made up')\n", limits={"memory_mib": 256})
    assert r.status is Status.memory_limit, r
    assert r.exit_code == 1 and r.signal is None
    assert r.error is not None
    assert r.error.type == "MemoryLimitExceeded"
    assert "256 MiB" in r.error.message and "limits.memory_mib" in r.error.message
    assert "MemoryError: made up" in (r.error.traceback or "")


def _spec(**overrides: float) -> RunSpec:
    values = {
        "timeout_s": 10.0,
        "cpu_s": 1.0,
        "memory_bytes": 64 << 20,
        "pids": 16,
        "disk_bytes": 8 << 20,
        "output_bytes": 65536,
        "artifact_bytes": 1 << 20,
        "artifact_files": 10,
    }
    values.update(overrides)
    return RunSpec(**values)  # type: ignore[arg-type]


def test_classify_explicit_memory_error_is_memory_limit() -> None:
    meta = classify(
        _spec(),
        None,
        1 << 8,
        {"type": "MemoryError", "message": "x", "traceback": "tb"},
        0,
        10.0,
        [],
    )
    assert meta["status"] == "memory_limit"
    assert meta["error"]["traceback"] == "tb"
    assert "memory_mib" in meta["error"]["message"]


def test_classify_run_that_used_its_whole_cpu_allowance_and_failed_is_cpu_limit() -> None:
    # A child killed by its own RLIMIT_CPU (SIGXCPU) just before the supervisor's cgroup check
    # fired; the parent then exits 1. The cgroup says the whole allowance was used.
    meta = classify(_spec(cpu_s=1.0), None, 1 << 8, None, 0, 1010.0, [])
    assert meta["status"] == "cpu_limit", meta
    assert "cpu_s" in meta["error"]["message"]


def test_classify_plain_failure_with_little_cpu_is_an_error() -> None:
    meta = classify(_spec(cpu_s=1.0), None, 1 << 8, None, 0, 200.0, [])
    assert meta["status"] == "error"
    assert meta["exit_code"] == 1
    assert meta["error"]["message"] == "the program ended with exit code 1"


def test_self_sigkill_with_little_cpu_is_not_reported_as_a_limit(jailed: Executor) -> None:
    r = jailed.run(
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
        limits={"cpu_s": 1, "timeout_s": 5},
    )
    assert r.status is Status.error, r
    assert r.error is not None and r.error.type == "ProcessError"


# ---- tampering with the reporting channel ----------------------------------------------------


def test_program_cannot_forge_a_sandbox_error(jailed: Executor) -> None:
    # The program inherits the write end of the supervisor's error pipe; whatever it writes
    # there must not make the run look like execbox's own failure.
    code = (
        "import json, os, stat\n"
        "hits = []\n"
        "for name in os.listdir('/proc/self/fd'):\n"
        "    fd = int(name)\n"
        "    try:\n"
        "        st = os.fstat(fd)\n"
        "    except OSError:\n"
        "        continue\n"
        "    if fd > 2 and stat.S_ISFIFO(st.st_mode):\n"
        "        try:\n"
        "            os.write(fd, json.dumps({'sandbox_error': 'forged by the program'}).encode())\n"
        "            hits.append(fd)\n"
        "        except OSError:\n"
        "            pass\n"
        "print('wrote to', hits)\n"
    )
    r = jailed.run(code)
    assert r.status is not Status.sandbox_error, r
    assert r.error is None or "forged" not in r.error.message, r.error
    assert r.stdout.startswith("wrote to ")


@pytest.mark.serial
def test_junk_in_inherited_pipes_only_changes_the_programs_own_outcome(jailed: Executor) -> None:
    # The program holds the write ends of its own report pipes (error record, exit report): it
    # can lie about its own outcome, as `sys.exit(n)` could, but never make the run look like
    # execbox's failure or stall the supervisor.
    code = (
        "import json, os, stat\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        "        if stat.S_ISFIFO(os.fstat(fd).st_mode):\n"
        "            os.write(fd, json.dumps({'type': 'MemoryError', 'message': 'fake'}).encode())\n"
        "    except OSError:\n"
        "        pass\n"
    )
    r = jailed.run(code)
    assert r.status is not Status.sandbox_error, r
    assert r.metrics.wall_ms < 2000
    again = jailed.run("print('next')")
    assert again.status is Status.ok and again.stdout == "next\n"


def test_a_flood_of_its_report_pipes_leaves_the_programs_exit_status_to_its_zygote(
    jailed: Executor,
) -> None:
    # Far more than the supervisor reads of the exit-report pipe before it stops listening
    # (64 KiB): its real exit status then comes from its zygote, whatever it wrote.
    code = (
        "import os, stat, time\n"
        "junk = b'x' * 65536\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        "        if not stat.S_ISFIFO(os.fstat(fd).st_mode):\n"
        "            continue\n"
        "        os.set_blocking(fd, False)\n"
        "        written, until = 0, time.monotonic() + 0.5\n"
        "        while written < (512 << 10) and time.monotonic() < until:\n"
        "            try:\n"
        "                written += os.write(fd, junk)\n"
        "            except BlockingIOError:\n"
        "                time.sleep(0.01)\n"
        "    except OSError:\n"
        "        pass\n"
        "os._exit(7)\n"
    )
    r = jailed.run(code)
    assert r.status is Status.error and r.exit_code == 7, r
    assert r.error is not None and r.error.type == "ProcessError"
    assert r.metrics.wall_ms < 5000
    again = jailed.run("print('next')")
    assert again.status is Status.ok and again.stdout == "next\n"


def test_signals_behave_normally_even_when_the_host_ignores_them() -> None:
    # A background job inherits SIGINT and SIGQUIT ignored; the code must not.
    import signal

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with Executor(cache=False) as ex:
            r = ex.run("import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n")
            q = ex.run("import os, signal\nos.kill(os.getpid(), signal.SIGQUIT)\n")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert r.status is Status.error and r.error is not None
    assert r.error.type == "KeyboardInterrupt"
    assert q.status is Status.error and q.signal == "SIGQUIT"


def test_classify_a_run_that_ended_without_any_exit_status_is_a_sandbox_error() -> None:
    meta = classify(_spec(), None, None, None, 0, 1.0, [])
    assert meta["status"] == "sandbox_error"
    assert "without an exit status" in meta["error"]["message"]
