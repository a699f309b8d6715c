"""Each slot's program has a uid of its own: per-user kernel limits are never shared by two
runs at once (pipe buffer pages, POSIX message queue bytes; inotify instances and pending
signals are counted the same way)."""

from __future__ import annotations

import errno
import json
import textwrap
import threading

import pytest

from execbox import Executor, Limits, Status
from execbox.sandbox import jail

# Holds the whole per-user allowance, says so, then waits for the host to let it end.
HOLD = textwrap.dedent("""
    import ctypes, fcntl, json, os, time
    F_SETPIPE_SZ, F_GETPIPE_SZ = 1031, 1032
    with open('/proc/sys/fs/pipe-user-pages-soft') as fh:
        soft = int(fh.read())
    pipes = []
    while sum(fcntl.fcntl(w, F_GETPIPE_SZ) for _, w in pipes) // 4096 <= soft:
        r, w = os.pipe()
        pipes.append((r, w))
        try:
            fcntl.fcntl(w, F_SETPIPE_SZ, 1 << 20)
        except OSError:
            break  # past the soft limit already
    libc = ctypes.CDLL(None, use_errno=True)
    class Attr(ctypes.Structure):
        _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long),
                    ("msgsize", ctypes.c_long), ("curmsgs", ctypes.c_long),
                    ("pad", ctypes.c_long * 4)]
    queues, errno_ = 0, 0
    while True:
        attr = Attr(0, 10, 8192, 0)
        q = libc.mq_open(b"/q%d" % queues, os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(attr))
        if q < 0:
            errno_ = ctypes.get_errno()
            break
        queues += 1
    print(json.dumps({"uid": os.getuid(), "pipes": len(pipes), "queues": queues,
                      "mq_errno": errno_, "small_pipe": fcntl.fcntl(os.pipe()[1], F_GETPIPE_SZ)}),
          flush=True)
    time.sleep(6)  # the host's probe runs meanwhile
""")

PROBE = textwrap.dedent("""
    import ctypes, fcntl, json, os
    class Attr(ctypes.Structure):
        _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long),
                    ("msgsize", ctypes.c_long), ("curmsgs", ctypes.c_long),
                    ("pad", ctypes.c_long * 4)]
    libc = ctypes.CDLL(None, use_errno=True)
    attr = Attr(0, 10, 8192, 0)
    q = libc.mq_open(b"/probe", os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(attr))
    print(json.dumps({"uid": os.getuid(), "pipe": fcntl.fcntl(os.pipe()[1], 1032),
                      "mq": q >= 0 or os.strerror(ctypes.get_errno())}))
""")


@pytest.mark.hostile
def test_a_run_holding_every_per_user_allowance_leaves_a_concurrent_runs_intact(
        jailed: Executor) -> None:
    held = threading.Event()
    said: list[bytes] = []

    def seen(data: bytes) -> None:
        said.append(data)
        if b"\n" in data:
            held.set()

    results = {}
    holder = threading.Thread(target=lambda: results.setdefault("hold", jailed.run(
        HOLD, limits=Limits(timeout_s=20), on_stdout=seen, cache=False)))
    holder.start()
    try:
        assert held.wait(15), f"the holder never said it holds: {said}"
        probe = jailed.run(PROBE, cache=False)
    finally:
        holder.join(30)
    assert results["hold"].status is Status.ok, results["hold"]
    holding = json.loads(b"".join(said))
    # Control: the holder used up its allowance (its own next pipe is small, its next queue
    # refused by RLIMIT_MSGQUEUE), so a uid shared with it would have starved the probe.
    assert holding["small_pipe"] < 65536 and holding["mq_errno"] == errno.EMFILE, holding
    assert probe.status is Status.ok, probe
    seen_probe = json.loads(probe.stdout)
    assert seen_probe["uid"] != holding["uid"], (seen_probe, holding)
    assert {seen_probe["uid"], holding["uid"]} <= set(
        range(jail.UID_FIRST, jail.UID_FIRST + jail.UID_COUNT))
    assert seen_probe["pipe"] == 65536 and seen_probe["mq"] is True, seen_probe
