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


def _rebind_stdio() -> None:
    """Fresh text streams on fds 0-2, set up as CPython does for pipes."""
    sys.stdin = io.TextIOWrapper(
        io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8", errors="strict"
    )
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8", errors="strict"
    )
    sys.stderr = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
        encoding="utf-8", errors="backslashreplace", line_buffering=True,
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
    _rebind_stdio()
    compile("x = [i for i in range(3)]\nprint(x, end='')\n", "<prepare>", "exec",
            dont_inherit=True)
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
    if record.get("traceback") and len(record["traceback"]) > MAX_TRACEBACK:
        record["traceback"] = "...\n" + record["traceback"][-MAX_TRACEBACK:]
    data = json.dumps(record, ensure_ascii=False).encode("utf-8", "replace")
    while len(data) > MAX_RECORD:
        key = max(("message", "traceback"), key=lambda k: len(record.get(k) or ""))
        text = record[key] or ""
        record[key] = text[: len(text) // 2] + " …(truncated)"
        data = json.dumps(record, ensure_ascii=False).encode("utf-8", "replace")
    try:
        os.write(err_fd, data)
    except OSError:
        pass


def _user_line(tb: types.TracebackType | None) -> int | None:
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == FILENAME:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _safe_str(exc: BaseException) -> str:
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
        _rebind_stdio()
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
        text = "".join(traceback.format_exception_only(type(exc), exc))
        sys.stderr.write(text)
        _report(err_fd, {
            "type": type(exc).__name__,
            "message": getattr(exc, "msg", None) or str(exc),
            "line": getattr(exc, "lineno", None),
            "column": getattr(exc, "offset", None),
            "traceback": text,
        })
        _finish(1, done_fd, my_pid, token)
    try:
        exec(compiled, main.__dict__)
        _run_pending_signal_handlers()
    except SystemExit as exc:
        status = _exit_code(exc)
    except BaseException as exc:  # noqa: BLE001 - everything the code raises is data
        tb = exc.__traceback__.tb_next if exc.__traceback__ else None
        exc.__traceback__ = tb
        text = "".join(traceback.format_exception(type(exc), exc, tb))
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - stderr may be closed by the code
            pass
        if os.getpid() == my_pid:
            _report(err_fd, {
                "type": type(exc).__name__,
                "message": _safe_str(exc),
                "line": _user_line(tb),
                "column": None,
                "traceback": text,
            })
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
