"""Host-side probes shared by the tests: whether a process still runs, and polling for what
happens in other processes."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from execbox import Executor, RunResult
    from execbox.sandbox.host.zygotes import ZygoteProcess
    from execbox.stats import HostStats


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(predicate: Callable[[], object], timeout_s: float, every_s: float = 0.05) -> bool:
    """Whether `predicate()` became true within `timeout_s`, asked every `every_s` and once
    more at the end."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every_s)
    return bool(predicate())


def host_stats(ex: Executor, tenant: str | None = None) -> HostStats:
    """`ex.stats().host`, which must be running."""
    host = ex.stats(tenant).host
    assert host is not None, "no sandbox host runs"
    return host


def wait_heavy(ex: Executor, timeout_s: float = 60.0) -> None:
    """Wait until `ex`'s heavy zygote serves (it starts in the background)."""
    assert wait_until(lambda: host_stats(ex).heavy_ready, timeout_s, every_s=0.02), (
        "the heavy zygote did not start"
    )


def host_internals(ex: Executor) -> ZygoteProcess:
    """The shared sandbox host itself, for the tests that must act on it (take a staged slot,
    kill or wrap what it holds); tests that only read its state use `Executor.stats()`."""
    return ex._host


# A cell that leaves threads running in the session: they keep turning `p` into a link, a
# FIFO, a directory (with `p/x`) and nothing, remove it as a directory, and delete the files
# API's temporary upload files, so that any system call of a files API call on `p` or `p/x`
# may find the workspace changed since the one before.
WORKSPACE_SWAPPER = r"""
import os, shutil, threading

def _swap():
    while True:
        for kind in ("link", "fifo", "dir", "none"):
            try:
                if kind == "link":
                    os.symlink("/etc", "p")
                elif kind == "fifo":
                    os.mkfifo("p")
                elif kind == "dir":
                    os.mkdir("p")
                    open("p/x", "w").write("x")
                if os.path.isdir("p") and not os.path.islink("p"):
                    shutil.rmtree("p", ignore_errors=True)
                else:
                    os.unlink("p")
            except OSError:
                pass

def _drop_uploads():
    while True:
        for entry in os.scandir("."):
            if entry.name.startswith(".execbox"):
                try:
                    os.unlink(entry.name)
                except OSError:
                    pass

def _rmdir():
    while True:
        try:
            os.rmdir("p")
        except OSError:
            pass

for _target in (_swap, _drop_uploads, _rmdir):
    threading.Thread(target=_target, daemon=True).start()
"""


def peak_resets() -> bool:
    """Whether this kernel lets a cgroup's memory peak be reset (v1; v2 from Linux 6.12)."""
    from execbox.sandbox.inside.cgroup import Hierarchy

    hier = Hierarchy.discover()
    try:
        if hier.version == 1:
            return True
        probe = os.path.join(hier.parent_paths[""], f"peak-probe-{os.getpid()}")
        os.mkdir(probe)
        try:
            fd = os.open(os.path.join(probe, "memory.peak"), os.O_RDWR)
            try:
                os.pwrite(fd, b"0", 0)
            finally:
                os.close(fd)
            return True
        except OSError:
            return False
        finally:
            os.rmdir(probe)
    finally:
        for fd in hier.parents.values():
            os.close(fd)


def peak_of(result: RunResult) -> int:
    """A run's memory peak, on a kernel that keeps one (None only on cgroup v2 before 5.19)."""
    peak = result.metrics.memory_peak_bytes
    assert peak is not None, "this kernel keeps no memory peak"
    return peak
