"""A run's outcome: what the program, init and the cgroup say of how it ended, read with care
(the program can write anything to its pipes), and `classify`, which maps it to a contract
status, exit code, signal and error. Shared by the run supervisor and the session's (`cells`).
Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

from . import jail, runner


def read_available(fd: int) -> bytes:
    """What is in the pipe now, without waiting for its writers to close it."""
    os.set_blocking(fd, False)
    chunks = []
    try:
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    except BlockingIOError:
        pass
    return b"".join(chunks)


def parse_json(data: bytes) -> dict[str, Any] | None:
    if not data:
        return None
    try:
        obj = json.loads(data[: 128 * 1024].decode("utf-8", "replace"))
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def clean_error(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    """The program can write anything to its error pipe: keep only a well-formed record."""
    if not obj or not isinstance(obj.get("type"), str) or not isinstance(obj.get("message"), str):
        return None

    def opt_int(v: Any) -> int | None:
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    tb = obj.get("traceback")
    kind = obj["type"] if len(obj["type"]) <= 200 else obj["type"][:200] + runner.CUT_TAIL
    return {
        "type": kind,
        "message": obj["message"],
        "line": opt_int(obj.get("line")),
        "column": opt_int(obj.get("column")),
        "traceback": tb if isinstance(tb, str) else None,
    }


def read_status(fd: int) -> tuple[int | None, str | None]:
    obj = parse_json(read_available(fd)) or {}
    status = obj.get("status")
    return (status if isinstance(status, int) else None), obj.get("error")


def disk_full(path: str) -> bool:
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 64 * 1024


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"SIG{num}"


def _hint(setting: str, flag: str) -> str:
    return f"raise limits.{setting} (CLI {flag})"


# Complex on purpose: one decision table over how a run ended; the check order is the priority.
def classify(  # noqa: C901
    spec: jail.RunSpec,
    killed: str | None,
    wait_status: int | None,
    user_error: dict[str, Any] | None,
    oom: int,
    cpu_ms: float,
    full: list[str],
) -> dict[str, Any]:
    """Map how the run ended to a contract status, exit code, signal and error."""
    exit_code: int | None = None
    sig: str | None = None
    if wait_status is not None:
        if os.WIFEXITED(wait_status):
            exit_code = os.WEXITSTATUS(wait_status)
        elif os.WIFSIGNALED(wait_status):
            sig = _signal_name(os.WTERMSIG(wait_status))
    elif killed:
        sig = "SIGKILL"

    if wait_status is None and not killed:
        return {
            "status": "sandbox_error",
            "exit_code": None,
            "signal": None,
            "error": {
                "type": "SandboxError",
                "line": None,
                "column": None,
                "traceback": None,
                "message": "the run ended without an exit status (was the executor "
                "closed while it ran?)",
            },
        }

    def limit(status: str, kind: str, message: str) -> dict[str, Any]:
        return {
            "status": status,
            "exit_code": exit_code,
            "signal": sig,
            "error": {
                "type": kind,
                "message": message,
                "line": None,
                "column": None,
                "traceback": user_error.get("traceback") if user_error else None,
            },
        }

    mib = 1024 * 1024
    if killed == "timeout":
        return limit(
            "timeout",
            "TimeoutError",
            f"wall time limit of {spec.timeout_s:g} s exceeded; " + _hint("timeout_s", "--timeout"),
        )
    if killed == "output_limit":
        return limit(
            "output_limit",
            "OutputLimitExceeded",
            f"output exceeded {spec.output_bytes} bytes on stdout or stderr; "
            + _hint("output_bytes", "--output-bytes"),
        )
    if killed == "host_gone":
        return limit("sandbox_error", "SandboxError", "the executor went away during the run")
    if killed == "cancelled":  # see execbox.cancel.Cancel
        return limit("error", "Cancelled", "the run was cancelled by its caller")
    failed = exit_code != 0
    if not failed:
        user_error = None  # a clean exit has no uncaught exception: ignore whatever is in the pipe
    # A process killed by its own RLIMIT_CPU just before the cgroup check fired: the tree has
    # used its whole allowance and the run failed, so the CPU limit is what ended it.
    cpu_hit = (
        killed == "cpu_limit" or sig == "SIGXCPU" or (failed and cpu_ms >= spec.cpu_s * 1000 * 0.98)
    )
    if cpu_hit:
        return limit(
            "cpu_limit",
            "CPULimitExceeded",
            f"CPU time limit of {spec.cpu_s:g} s exceeded; " + _hint("cpu_s", "--cpu"),
        )
    err = user_error or {}
    mem_error = err.get("type") == "MemoryError"
    if (oom and failed) or mem_error:
        return limit(
            "memory_limit",
            "MemoryLimitExceeded",
            f"memory limit of {spec.memory_bytes // mib} MiB exceeded; "
            + _hint("memory_mib", "--memory"),
        )
    if sig == "SIGSYS":
        return limit(
            "forbidden",
            "ForbiddenSyscall",
            "the program made a system call the sandbox forbids and was killed",
        )
    enospc = "No space left on device" in str(err.get("message"))
    if failed and (full or enospc):
        return limit(
            "disk_limit",
            "DiskLimitExceeded",
            f"disk limit of {spec.disk_bytes // mib} MiB reached in "
            f"{', '.join(full) or 'the workspace'}; " + _hint("disk_mib", "--disk"),
        )
    error = None
    if user_error:
        error = {k: user_error.get(k) for k in ("type", "message", "line", "column", "traceback")}
    elif failed:
        what = f"signal {sig}" if sig else f"exit code {exit_code}"
        error = {
            "type": "ProcessError",
            "message": f"the program ended with {what}",
            "line": None,
            "column": None,
            "traceback": None,
        }
    return {
        "status": "ok" if not failed else "error",
        "exit_code": exit_code,
        "signal": sig,
        "error": error,
    }
