"""Each slot's program has a uid of its own: per-user kernel limits are never shared by two
runs at once (pipe buffer pages and pending signals here; message queue bytes and inotify
instances are counted the same way, but the syscall filter refuses those calls)."""

from __future__ import annotations

import errno
import json
import textwrap
import threading

import pytest

from execbox import Cancel, Executor, Limits, RunResult, Status
from execbox.sandbox.inside import jail

# Holds the whole per-user allowance, says so, then holds it until the host cancels the run.
HOLD = textwrap.dedent("""
    import ctypes, fcntl, json, os, signal, time
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
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
    queued = 0
    while libc.sigqueue(os.getpid(), signal.SIGRTMIN, 0) == 0:  # pending: RLIMIT_SIGPENDING
        queued += 1
    print(json.dumps({"uid": os.getuid(), "pipes": len(pipes), "queued": queued,
                      "sigqueue_errno": ctypes.get_errno(),
                      "small_pipe": fcntl.fcntl(os.pipe()[1], F_GETPIPE_SZ)}), flush=True)
    time.sleep(60)
""")

PROBE = textwrap.dedent("""
    import ctypes, fcntl, json, os, signal
    libc = ctypes.CDLL(None, use_errno=True)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
    queued = libc.sigqueue(os.getpid(), signal.SIGRTMIN, 0) == 0
    print(json.dumps({"uid": os.getuid(), "pipe": fcntl.fcntl(os.pipe()[1], 1032),
                      "sigqueue": queued or os.strerror(ctypes.get_errno())}))
""")


@pytest.mark.hostile
def test_a_run_holding_every_per_user_allowance_leaves_a_concurrent_runs_intact(
    jailed: Executor,
) -> None:
    held = threading.Event()
    said: list[bytes] = []

    def seen(data: bytes) -> None:
        said.append(data)
        if b"\n" in data:
            held.set()

    results: dict[str, RunResult] = {}
    cancel = Cancel()  # the holder holds until the probe is done, however long that takes
    holder = threading.Thread(
        target=lambda: results.setdefault(
            "hold",
            jailed.run(
                HOLD, limits=Limits(timeout_s=20), on_stdout=seen, cancel=cancel, cache=False
            ),
        )
    )
    holder.start()
    try:
        assert held.wait(15), f"the holder never said it holds: {said}"
        probe = jailed.run(PROBE, cache=False)
    finally:
        cancel.cancel()
        holder.join(30)
    hold = results["hold"]
    assert hold.error is not None and hold.error.type == "Cancelled", hold  # still holding
    holding = json.loads(b"".join(said))
    # Control: the holder used up its allowance (its own next pipe is small, its next signal
    # refused by RLIMIT_SIGPENDING), so a uid shared with it would have starved the probe.
    assert holding["small_pipe"] < 65536 and holding["sigqueue_errno"] == errno.EAGAIN, holding
    assert probe.status is Status.ok, probe
    seen_probe = json.loads(probe.stdout)
    assert seen_probe["uid"] != holding["uid"], (seen_probe, holding)
    assert {seen_probe["uid"], holding["uid"]} <= set(
        range(jail.UID_FIRST, jail.UID_FIRST + jail.UID_COUNT)
    )
    assert seen_probe["pipe"] == 65536 and seen_probe["sigqueue"] is True, seen_probe
