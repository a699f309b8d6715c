"""What the hostile session tests share: the cell prologue that reaches the interpreter loop's
own descriptors, and the host-side probes of a session's processes and cgroups."""

from __future__ import annotations

import os
import select

from execbox import RunResult, SessionClosed
from execbox.sandbox.host.channel import SessionChannel
from execbox.sandbox.host.pump import OutputCallback
from execbox.sandbox.inside.cgroup import Hierarchy
from execbox.sessions import Session

# What a hostile cell starts with: the interpreter loop's own locals (kernel.serve's frame):
# go_r, report_w, outputs, the current cell's request with its end marker.
KERNEL = """
import os, sys, json, struct, threading, time, select
def _kernel_locals():
    f = sys._getframe()
    while f is not None:
        if 'report_w' in f.f_locals and 'go_r' in f.f_locals:
            return f.f_locals
        f = f.f_back
    raise RuntimeError('kernel frame not found')
K = _kernel_locals()
def forge(kind, payload):
    return struct.pack('!4sQ', kind, len(payload)) + payload
def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
"""


def cgroup_dirs(name: str) -> list[str]:
    """The directories of cgroup `name` that still exist, in every controller's hierarchy."""
    return [
        os.path.join(parent, name)
        for parent in Hierarchy.discover().parent_paths.values()
        if os.path.isdir(os.path.join(parent, name))
    ]


def session_channel(s: Session) -> SessionChannel:
    """The session's channel to its supervisor: always the real one under the jailed fixture."""
    ch = s._channel
    assert isinstance(ch, SessionChannel), ch
    return ch


def supervisor_spoke(s: Session) -> bool:
    """Whether the session's supervisor has sent something the host has not read yet: between
    cells, the end of a cell the host stopped waiting for, or the end of the session."""
    ch = session_channel(s)
    return bool(ch._pending) or bool(select.select([ch.slot.ctrl], [], [], 0)[0])


def sup_pid(s: Session) -> int:
    """The pid of the session's supervisor."""
    pid = session_channel(s).slot.sup_pid
    assert pid > 0
    return pid


def run_or_closed(
    s: Session, code: str, timeout_s: float | None = None, on_stdout: OutputCallback | None = None
) -> RunResult | SessionClosed:
    """The cell's result, or the SessionClosed its run raised."""
    try:
        return s.run(code, timeout_s=timeout_s, on_stdout=on_stdout)
    except SessionClosed as exc:
        return exc
