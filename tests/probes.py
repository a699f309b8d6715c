"""Host-side probes shared by the tests: whether a process still runs, and polling for what
happens in other processes."""

from __future__ import annotations

import time
from collections.abc import Callable


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
