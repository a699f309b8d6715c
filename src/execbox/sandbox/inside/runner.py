"""Inside the jail: run the user's Python code as `__main__` and report a structured error.

The code runs in the forked, pre-imported interpreter, so `import pandas` is already done. The
traceback shown on stderr and in the result starts at the user's code, not at ours.
Standard library only.
"""

from __future__ import annotations

import io
import json
import linecache
import os
import sys
import traceback
import types
from typing import Any

FILENAME = "main.py"
WORKSPACE = "/workspace"
MAX_TRACEBACK = 32 * 1024
MAX_RECORD = 60 * 1024  # below the pipe's 64 KiB: one write to the error pipe never blocks
# What marks a text cut to a cap: CUT_HEAD where its start was dropped, CUT_TAIL where its end
# was. The host redacts a secret cut in two at such a mark (`scrub.redact_cut`).
CUT_HEAD = "...\n"
CUT_TAIL = " …(truncated)"


def keep_tail(text: str) -> str:
    """`text`, or its last MAX_TRACEBACK characters after CUT_HEAD."""
    return text if len(text) <= MAX_TRACEBACK else CUT_HEAD + text[-MAX_TRACEBACK:]


def rebind_stdio() -> None:
    """Fresh text streams on fds 0-2, set up as CPython does for pipes."""
    sys.stdin = io.TextIOWrapper(
        io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8", errors="strict"
    )
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8", errors="strict"
    )
    sys.stderr = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )
    for name in ("stdin", "stdout", "stderr"):
        setattr(sys, f"__{name}__", getattr(sys, name))


_prepared = False


def prepare() -> None:
    """While the program waits for its code: what every run does first (fresh stdio streams),
    done ahead, and the compiler and JSON decoder exercised once. The program is a fresh fork:
    the first use of any memory copies its page, and this moves those copies off the request
    path. Nothing of it is visible to the code."""
    global _prepared
    rebind_stdio()
    compile("x = [i for i in range(3)]\nprint(x, end='')\n", "<prepare>", "exec", dont_inherit=True)
    json.loads('{"code": "", "spec": {"timeout_s": 1.0, "env": {}}, "token": "00"}')
    _prepared = True


def after_fork() -> None:
    """What CPython's own after-fork hooks would have done that a program can tell apart (the
    fork was C's, see `program`): fresh randomness, since the zygote's generator state is
    shared by every fork, and the main thread's native id, the child's own."""
    import random
    import threading

    random.seed()
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()
    threading.main_thread()._set_native_id()  # type: ignore[attr-defined]


def _report(err_fd: int, record: dict[str, Any]) -> None:
    """Send the structured error in one write that fits the pipe (so it can never block)."""
    try:
        os.write(err_fd, _encoded(record))
    except OSError:
        pass


def _encoded(record: dict[str, Any]) -> bytes:
    """`record` as JSON of at most MAX_RECORD bytes (its longest texts cut)."""
    if record.get("traceback"):
        record["traceback"] = keep_tail(record["traceback"])
    data = json.dumps(record, ensure_ascii=False).encode("utf-8", "replace")
    while len(data) > MAX_RECORD:
        # The type too: a class name can be as long as the code likes.
        key = max(("type", "message", "traceback"), key=lambda k: len(record.get(k) or ""))
        text = record[key] or ""
        record[key] = text[: len(text) // 2] + CUT_TAIL
        data = json.dumps(record, ensure_ascii=False).encode("utf-8", "replace")
    return data


def _uncaught(exc: BaseException, tb: types.TracebackType | None) -> dict[str, Any]:
    """The record of `exc`, uncaught, its traceback starting at `tb` (the code's own frame)."""
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return {
        "type": type(exc).__name__,
        "message": safe_str(exc),
        "line": _user_line(tb),
        "column": None,
        "traceback": text,
    }


EXERCISE_ROUNDS = 24  # past CPython 3.11's warm-up (8 calls) and its specializing
_EXERCISE_FILE = "<execbox-exercise>"
_EXERCISE_CODE = """\
def check(candidate):
    assert candidate([1, 2], 3) == [3, 2, 1]
check(lambda xs, n: None)
"""


def exercise_errors() -> None:
    """In a program zygote, before it forks: take an uncaught error through the path a failing
    program takes (its traceback formatted, its record built and encoded), enough times for
    the interpreter to specialize that code. A fork that first runs code its zygote never ran
    writes the warm-up counters of that code's objects and fills what it builds on first use,
    each write a page copied: a failing program's error path faulted ~225 pages and took
    ~0.75 ms of CPU, ~133 and ~0.55 ms after this in its zygote. Nothing of it stays: the
    source lines are dropped from linecache, the rest is garbage."""
    source_lines = _EXERCISE_CODE.splitlines(keepends=True)
    linecache.cache[_EXERCISE_FILE] = (len(_EXERCISE_CODE), None, source_lines, _EXERCISE_FILE)
    try:
        compiled = compile(_EXERCISE_CODE, _EXERCISE_FILE, "exec", dont_inherit=True)
        for _ in range(EXERCISE_ROUNDS):
            try:
                exec(compiled, {"__name__": "__exercise__"})
            except AssertionError as exc:
                _encoded(_uncaught(exc, exc.__traceback__))
    finally:
        del linecache.cache[_EXERCISE_FILE]


def compile_error_record(exc: SyntaxError | ValueError) -> dict[str, Any]:
    """The error record of code that does not compile; its traceback is also the program's
    stderr, as CPython prints it. The host uses it too, for source bytes that do not decode."""
    text = "".join(traceback.format_exception_only(type(exc), exc))
    return {
        "type": type(exc).__name__,
        "message": getattr(exc, "msg", None) or str(exc),
        "line": getattr(exc, "lineno", None),
        "column": getattr(exc, "offset", None),
        "traceback": text,
    }


def _user_line(tb: types.TracebackType | None) -> int | None:
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == FILENAME:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - a hostile __str__ must not cost the report
        return f"<{type(exc).__name__}: str() failed>"


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def run(code: str, err_fd: int, src_paths: list[str], done_fd: int, token: bytes) -> None:
    """Execute `code`; never returns (the process exits with the program's status)."""
    if not _prepared:
        rebind_stdio()
    my_pid = os.getpid()
    sys.argv = [FILENAME]
    sys.path[:] = [WORKSPACE] + [p for p in sys.path if p not in src_paths]
    main = types.ModuleType("__main__")
    main.__dict__.update({"__file__": FILENAME, "__builtins__": __builtins__})
    sys.modules["__main__"] = main
    source_lines = code.splitlines(keepends=True)
    linecache.cache[FILENAME] = (len(code), None, source_lines, FILENAME)
    status = 0
    try:
        compiled = compile(code, FILENAME, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        record = compile_error_record(exc)
        sys.stderr.write(record["traceback"])
        _report(err_fd, record)
        _finish(1, done_fd, my_pid, token)
    try:
        exec(compiled, main.__dict__)
        _run_pending_signal_handlers()
    except SystemExit as exc:
        status = _exit_code(exc)
    except BaseException as exc:  # noqa: BLE001 - everything the code raises is data
        tb = exc.__traceback__.tb_next if exc.__traceback__ else None
        exc.__traceback__ = tb
        record = _uncaught(exc, tb)
        try:
            sys.stderr.write(record["traceback"])
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - stderr may be closed by the code
            pass
        if os.getpid() == my_pid:
            _report(err_fd, record)
        status = 1
    _finish(status, done_fd, my_pid, token)


def _run_pending_signal_handlers() -> None:
    """Entering a Python function runs handlers of signals that arrived during the code's last
    instructions (say, `os.kill(os.getpid(), SIGINT)` as its final line), so their exceptions
    are raised here, inside the code's try block, and not later in our shutdown."""


def _finish(status: int, done_fd: int, main_pid: int, token: bytes) -> None:
    """Shut down like the interpreter does (join threads, run atexit, flush), then report the
    exit status and exit. The report comes before the exit because tearing down a forked
    interpreter takes milliseconds the caller need not wait for; closing stdout and stderr
    first lets the caller see their end at once."""
    import atexit
    import threading

    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except BaseException:  # noqa: BLE001
        pass
    try:
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - as CPython: a failed flush gives status 120
            if status == 0:
                status = 120
    for fd in (0, 1, 2):
        try:
            os.close(fd)
        except OSError:
            pass
    if os.getpid() == main_pid:  # a forked child's exit is not the program's
        try:
            os.write(done_fd, token + bytes([status & 0xFF]))
        except OSError:
            pass
    os._exit(status)
