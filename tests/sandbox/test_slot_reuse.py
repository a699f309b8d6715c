"""Slots serve run after run: nothing of one run may reach the next one in the same slot.

Each executor here has one slot of each kind (`jailed_one_slot`), so consecutive runs of a kind
meet in the same slot (same supervisor, cgroup, mount and network namespaces); the tests check
that it really was the same slot, then attack what a slot keeps between runs.
"""

from __future__ import annotations

import array
import fcntl
import json
import os
import signal
import subprocess
import termios
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from execbox import Executor, Limits, RunResult, Status
from execbox.backend import sandbox_spec
from execbox.image import Image
from execbox.request import make_request
from execbox.routing import program_kind
from execbox.sandbox.host.errors import HostError
from execbox.sandbox.host.slot import Slot
from execbox.sandbox.inside import linux, protocol
from execbox.sandbox.inside.cgroup import Hierarchy
from tests.probes import (
    host_internals,
    host_stats,
    peak_of,
    peak_resets,
    wait_heavy,
    wait_until,
)

LEAVE_BEHIND = textwrap.dedent("""
    import ctypes, os, socket, time
    for path in ('/workspace/left.txt', '/tmp/left.txt', '/dev/shm/left'):
        with open(path, 'w') as fh:
            fh.write('left')
    libc = ctypes.CDLL(None, use_errno=True)
    made = [libc.shmget(0x5eed, 4096, 0o1666), libc.semget(0x5eee, 1, 0o1666),
            libc.msgget(0x5eef, 0o1666)]
    pid = os.fork()
    if pid == 0:  # a daemon: double fork, new session, an abstract socket, a late write
        os.setsid()
        if os.fork() == 0:
            s = socket.socket(socket.AF_UNIX)
            s.bind('\\0execbox-left-behind')
            s.listen()
            time.sleep(0.5)
            try:
                with open('/workspace/late.txt', 'w') as fh:
                    fh.write('late')
            except OSError:
                pass
            time.sleep(60)
        os._exit(0)
    os.waitpid(pid, 0)
    time.sleep(0.1)
    print(min(made), os.getpid())
""")

LOOK_AROUND = textwrap.dedent("""
    import json, os, socket, time
    time.sleep(0.8)  # past the daemon's late write, had it survived
    s = socket.socket(socket.AF_UNIX)
    s.bind('\\0execbox-left-behind')  # free again: its holder is gone
    def rows(kind):
        with open(f'/proc/sysvipc/{kind}') as fh:
            return fh.read().splitlines()[1:]
    print(json.dumps({
        "pid": os.getpid(),
        "procs": sorted(int(p) for p in os.listdir('/proc') if p.isdigit()),
        "files": {d: os.listdir(d) for d in ('/workspace', '/tmp', '/dev/shm')},
        "ipc": {k: rows(k) for k in ('shm', 'sem', 'msg')},
    }))
""")


@pytest.mark.hostile
def test_a_reused_slot_starts_every_run_clean(jailed_one_slot: Executor) -> None:
    ex = jailed_one_slot
    ex.run("pass")
    slots = host_stats(ex).idle_slots
    assert len(slots) == 3, slots  # one light, one heavy, one pandas
    first = ex.run(LEAVE_BEHIND)
    assert first.status is Status.ok, first
    made, pid = (int(x) for x in first.stdout.split())
    assert made >= 0, "control: the SysV IPC objects were created"
    assert pid == 2
    second = ex.run(LOOK_AROUND)
    assert second.status is Status.ok, second
    assert host_stats(ex).idle_slots == slots, "control: both runs were in the same slot"
    seen = json.loads(second.stdout)
    assert seen["pid"] == 2 and seen["procs"] == [1, 2], seen
    assert seen["files"] == {"/workspace": [], "/tmp": [], "/dev/shm": []}, seen
    assert seen["ipc"] == {"shm": [], "sem": [], "msg": []}, seen
    assert second.artifacts == []


@pytest.mark.hostile
def test_a_slot_is_reused_after_a_run_killed_for_its_time(jailed_one_slot: Executor) -> None:
    ex = jailed_one_slot
    ex.run("pass")
    slots = host_stats(ex).idle_slots
    r = ex.run("import os, time\nos.fork()\ntime.sleep(60)\n", limits={"timeout_s": 0.3})
    assert r.status is Status.timeout, r
    after = ex.run("import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    assert after.status is Status.ok and after.stdout == "[1, 2]\n", after
    assert host_stats(ex).idle_slots == slots


@pytest.mark.hostile
def test_limits_of_one_run_do_not_stay_with_its_slot(jailed_one_slot: Executor) -> None:
    ex = jailed_one_slot
    small = ex.run("x = bytearray(40 << 20)", limits={"memory_mib": 16, "disk_mib": 1})
    assert small.status is Status.memory_limit, small
    big = ex.run(
        "x = bytearray(100 << 20)\nopen('/tmp/f', 'wb').write(bytes(5 << 20))\nprint(len(x))"
    )
    assert big.status is Status.ok and big.stdout == str(100 << 20) + "\n", big
    again = ex.run("x = bytearray(40 << 20)", limits={"memory_mib": 16})
    assert again.status is Status.memory_limit, again  # the earlier OOM kill is not counted twice
    fine = ex.run("print(1)", limits={"memory_mib": 16})
    assert fine.status is Status.ok, fine


def _offered(slot: Slot) -> Slot:
    """The slot once its supervisor has offered the short way (PRK)."""
    deadline = time.monotonic() + 5
    while not slot.take_offer():
        assert time.monotonic() < deadline, "the slot never offered the short way"
        time.sleep(0.01)
    return slot


def _ready_slot(ex: Executor, kind: str) -> Slot:
    """The (one) slot of `kind`, once it is staged (again)."""
    deadline = time.monotonic() + 5
    while not host_stats(ex).staged[kind]:
        assert time.monotonic() < deadline, f"the {kind} slot was not staged again"
        time.sleep(0.01)
    [slot] = host_internals(ex).pool._ready[kind]
    return slot


def _staged_light_memory(ex: Executor) -> int:
    """The memory limit the (one) staged light slot has: what a run needs to take the short
    way, the code straight to the program (see `protocol`)."""
    return int(_offered(_ready_slot(ex, "light")).staged["memory_bytes"])


@pytest.mark.hostile
def test_runs_sent_straight_to_the_program_have_the_limits_the_slot_kept(
    jailed_one_slot: Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's memory and pids limits stay applied, so the next run with the same ones takes
    the short way (its code is never seen by the supervisor before it runs): it must be held
    to them all the same, and a run asking for others goes the long way and gets its own."""
    ex = jailed_one_slot
    sent: list[bytes] = []  # the kinds of frame the host sends its supervisors
    json_frame = protocol.json_frame
    monkeypatch.setattr(
        protocol, "json_frame", lambda kind, obj: sent.append(kind) or json_frame(kind, obj)
    )

    def way(code: str, **limits: int) -> RunResult:
        sent.clear()
        result = ex.run(code, limits=limits)
        assert len(sent) == 1, sent
        return result

    hog = "x = bytearray(40 << 20)\nprint('allocated')"
    ex.run("pass")  # the slot has the defaults now, whatever an earlier test left applied
    assert _staged_light_memory(ex) == 512 << 20
    assert way(hog, memory_mib=16).status is Status.memory_limit
    assert sent == [protocol.REQ]  # control: other limits than the slot's go the long way
    assert _staged_light_memory(ex) == 16 << 20
    again = way(hog, memory_mib=16)
    assert sent == [protocol.RUN] and again.status is Status.memory_limit, again
    assert _staged_light_memory(ex) == 16 << 20
    default = way(hog)  # the long way: 512 MiB applied before the code is sent
    assert sent == [protocol.REQ], sent
    assert default.status is Status.ok and default.stdout == "allocated\n", default
    assert _staged_light_memory(ex) == 512 << 20
    short = way(hog + "\nimport time\ntime.sleep(0.2)")
    assert sent == [protocol.RUN], sent
    assert short.status is Status.ok and short.stdout == "allocated\n", short
    assert short.metrics.wall_ms >= 200, short.metrics  # the clocks run from the host's send
    assert peak_of(short) >= 40 << 20, short.metrics
    assert short.metrics.cpu_ms > 0, short.metrics


def test_a_supervisor_refuses_code_sent_straight_with_limits_its_slot_does_not_have(
    jailed_one_slot: Executor,
) -> None:
    """The host decides which way a run goes; the supervisor checks it: a RUN whose limits are
    not the slot's ends the slot (a sandbox error), never runs under the wrong limits."""
    ex = jailed_one_slot
    ex.run("pass")
    host = host_internals(ex)
    slot = _offered(host.pool.take("light", 5.0))
    request = make_request("print(1)", limits=Limits(memory_mib=64))
    spec = sandbox_spec(request.limits, request.env, [(f.name, f.data) for f in request.files])
    slot.staged = dict(slot.staged, memory_bytes=64 << 20)  # the host's bookkeeping is wrong
    with pytest.raises(HostError, match="protocol: a RUN with limits"):
        host.execute(
            slot, {"code": "print(1)", "run_id": "refused", "spec": spec}, [], b"", 1 << 20, 10.0
        )
    after = ex.run("print(2)")  # the pool stages a new slot in its place
    assert after.status is Status.ok and after.stdout == "2\n", after


def test_a_reused_slot_takes_large_input_files(jailed_one_slot: Executor) -> None:
    # The first run leaves the slot's control socket as its pump left it: the next request's
    # 20 MiB file must still go through whole.
    for _ in range(3):
        r = jailed_one_slot.run(
            "import os\nprint(os.path.getsize('big.bin'))",
            files={"big.bin": bytes(20 << 20)},
            limits={"disk_mib": 64},
        )
        assert r.status is Status.ok and r.stdout == f"{20 << 20}\n", r


def test_the_between_runs_check_sees_a_process_left_in_the_cgroup() -> None:
    # The supervisor's own check (`SlotSteps.end_run` makes it after each run, in C).
    cg = Hierarchy.discover().create(f"x{os.getpid()}-emptycheck")
    steps = linux.SlotSteps(
        f"{Image.load().libexec}/libexecbox-contain.so",
        cg.counter_files(),
        list(cg.dirs.values()),
        RuntimeError,
    )
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert not steps.has_processes()
        for dir_fd in cg.dirs.values():
            fd = os.open("cgroup.procs", os.O_WRONLY, dir_fd=dir_fd)
            try:
                os.write(fd, str(sleeper.pid).encode())
            finally:
                os.close(fd)
        assert steps.has_processes(), "a process in the cgroup went unseen"
        assert steps.has_processes(), "a second look went blind"
        sleeper.kill()
        sleeper.wait()
        deadline = time.monotonic() + 5
        while steps.has_processes() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not steps.has_processes()
    finally:
        sleeper.kill()
        sleeper.wait()
        wait_until(lambda: not steps.has_processes(), 5, every_s=0.01)  # else remove says why
        cg.remove()


def test_standard_library_code_runs_in_a_light_program(executor: Executor) -> None:
    probe = "print(open('/proc/self/maps').read().count('/numpy/') > 0)"
    light = executor.run("import json\n" + probe)
    assert light.status is Status.ok and light.stdout == "False\n", light
    heavy = executor.run("import numpy\n" + probe)
    assert heavy.status is Status.ok and heavy.stdout == "True\n", heavy


def test_a_light_program_carries_none_of_the_supervisors_or_ctypes_util_modules(
    executor: Executor,
) -> None:
    """A light program is a fork of a zygote kept small (its size is every fork's and every
    exit's cost): the supervisor's modules, what only they use (`fcntl`, for the slot's uid)
    and what `ctypes.util` pulls in stay out of it."""
    r = executor.run(
        "import sys\nprint(sorted(m for m in ('execbox.sandbox.inside.supervisor', "
        "'execbox.sandbox.inside.cells', 'ctypes.util', 'subprocess', 'tempfile', "
        "'platform', 'fcntl') if m in sys.modules))"
    )
    assert r.status is Status.ok and r.stdout == "[]\n", r


def test_an_import_the_policy_cannot_see_still_works_in_a_light_program(executor: Executor) -> None:
    r = executor.run(
        "name = 'pan' + 'das'\nm = __import__(name)\nprint(m.DataFrame({'a': [1]}).shape)",
        limits={"timeout_s": 30},
    )
    assert r.status is Status.ok and r.stdout == "(1, 1)\n", r


@pytest.mark.parametrize(
    "imports, kind",
    [
        (frozenset(), "light"),
        (frozenset({"json", "collections", "os"}), "light"),
        (None, "light"),  # not parsed: it fails to compile in the sandbox too
        (frozenset({"numpy"}), "heavy"),
        (frozenset({"json", "pandas"}), "pandas"),
        (frozenset({"numpy", "matplotlib", "pandas"}), "pandas"),
        (frozenset({"helper"}), "heavy"),  # a module of the workspace: not known to be small
    ],
)
def test_program_kind_follows_the_imports(imports: frozenset[str] | None, kind: str) -> None:
    assert program_kind(imports) == kind


def test_slots_are_staged_again_soon_after_a_run(executor: Executor) -> None:
    executor.run("pass")
    deadline = time.monotonic() + 5
    while host_stats(executor).staged["light"] < executor.pool_size:
        assert time.monotonic() < deadline, "the light slots were not staged again"
        time.sleep(0.01)


def test_a_staged_slots_pipes_do_not_leak_into_host_children(
    executor: Executor, host_child_fds: Callable[[], str]
) -> None:
    """RDY's stdio and PRK's go pipe arrive close-on-exec (3.11's socket.recv_fds dropped
    the flag): a child the host application starts must not hold a run's pipes, or a program
    reading its stdin would wait for an end of file that never comes."""
    executor.run("pass")
    deadline = time.monotonic() + 5
    while not host_stats(executor).staged["light"]:
        assert time.monotonic() < deadline, "no light slot was staged"
        time.sleep(0.01)
    slot = _offered(host_internals(executor).pool._ready["light"][0])
    fds = [slot.stdin_w, slot.stdout_r, slot.stderr_r, slot.go_w]
    pipes = {os.readlink(f"/proc/self/fd/{fd}") for fd in fds}
    out = host_child_fds()
    leaked = [pipe for pipe in pipes if pipe in out]
    assert not leaked, f"a host child inherited a staged run's pipes: {leaked}"


def test_a_run_sent_the_short_way_is_timed_from_the_hosts_send(jailed_one_slot: Executor) -> None:
    """On the short way the code may run before the supervisor reads RUN: its clocks start at
    the host's send, not when it gets around to it. The supervisor is stopped while the code
    runs, so it reads RUN late."""
    ex = jailed_one_slot
    ex.run("pass")
    program = _staged_program(ex)
    host = host_internals(ex)
    slot = _offered(host.pool.take("light", 5.0))
    request = make_request("import time\ntime.sleep(0.1)\nprint('slept')")
    spec = sandbox_spec(request.limits, request.env, [(f.name, f.data) for f in request.files])
    assert slot.staged_for(spec), "control: this run takes the short way"
    box: list[object] = []
    sending = threading.Event()

    def run() -> None:
        sending.set()
        box.append(
            host.execute(
                slot, {"code": request.code, "run_id": "late", "spec": spec}, [], b"", 1 << 20, 20.0
            )
        )

    signal.pidfd_send_signal(slot.sup_pidfd, signal.SIGSTOP)
    try:
        thread = threading.Thread(target=run)
        thread.start()
        assert sending.wait(10)
        sent = time.monotonic()
        _wait_gone(program, "the code never ended")  # its supervisor, stopped, saw nothing
        # The point: RUN is read 0.6 s after the send, which the run's wall time must include.
        time.sleep(max(0.0, sent + 0.6 - time.monotonic()))
    finally:
        signal.pidfd_send_signal(slot.sup_pidfd, signal.SIGCONT)
    thread.join(20)
    [raw] = box
    assert raw.stdout == b"slept\n", raw  # type: ignore[attr-defined]
    assert raw.meta["metrics"]["wall_ms"] >= 500, raw.meta  # type: ignore[attr-defined]


READ_FILES = textwrap.dedent("""
    import os, sys
    # Page cache a run reads in is charged to the slot's cgroup and outlives the run.
    total = 0
    for base in dict.fromkeys([sys.prefix, *sys.path]):
        for root, _dirs, names in os.walk(base):
            for name in names:
                if total >= 64 << 20:
                    break
                try:
                    fd = os.open(os.path.join(root, name), os.O_RDONLY | os.O_NONBLOCK)
                except OSError:
                    continue
                try:
                    if not os.path.isfile(f'/proc/self/fd/{fd}'):
                        continue
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    while chunk := os.read(fd, 1 << 20):
                        total += len(chunk)
                except OSError:
                    pass
                finally:
                    os.close(fd)
    print(total >> 20)
""")


@pytest.mark.hostile
def test_a_run_that_lowers_the_memory_limit_reports_its_own_peak(jailed_one_slot: Executor) -> None:
    """The long way lowers the slot's memory limit after the baselines were taken: what the
    cgroup held beyond the new limit (a last run's page cache) is reclaimed then, and must not
    show as this run's peak."""
    ex = jailed_one_slot
    first = ex.run(READ_FILES, limits={"timeout_s": 30, "cpu_s": 30})
    assert first.status is Status.ok, first
    if int(first.stdout) < 64:
        pytest.skip(f"only {first.stdout.strip()} MiB of files to read in the sandbox")
    small = ex.run("print(1)", limits={"memory_mib": 32})
    assert small.status is Status.ok, small
    assert peak_of(small) <= 32 << 20, small.metrics


def _slot_file_bytes(ex: Executor, kind: str) -> int:
    """Page cache charged to the (one) staged slot of `kind`, read from its cgroup."""
    slot = _ready_slot(ex, kind)
    hierarchy = Hierarchy.discover()
    try:
        parent = hierarchy.parent_paths["" if hierarchy.version == 2 else "memory"]
        with open(os.path.join(parent, slot.name, "memory.stat")) as fh:
            stat = dict(line.split() for line in fh)
    finally:
        for fd in hierarchy.parents.values():
            os.close(fd)
    return int(stat["active_file"]) + int(stat["inactive_file"])


@pytest.mark.hostile
def test_a_runs_page_cache_does_not_count_in_later_runs_of_its_slot(
    jailed_one_slot: Executor,
) -> None:
    """Page cache a run reads in stays charged to its slot's cgroup after the run: it must not
    show in a later run's peak (nor tell it how much the earlier run read), in a run or in a
    session's cell (a session takes a heavy slot that may have served runs)."""
    ex = jailed_one_slot
    # Where the peak cannot be reset (v2 before 6.12) each run has a cgroup of its own: the
    # pages stay with the last one's, and the slot's holds none of them.
    renewed = not peak_resets()
    with ex.session() as s:
        fresh = s.run("x = 1")
    assert fresh.status is Status.ok, fresh
    for kind in ("light", "heavy"):
        first = ex.run(
            ("import numpy\n" if kind == "heavy" else "") + READ_FILES,
            limits={"timeout_s": 30, "cpu_s": 30},
        )
        assert first.status is Status.ok, first
        if int(first.stdout) < 64:
            pytest.skip(f"only {first.stdout.strip()} MiB of files to read in the sandbox")
        left = _slot_file_bytes(ex, kind)
        if renewed:
            assert left < 16 << 20, f"the slot's new cgroup holds {left} bytes of page cache"
        else:
            assert left >= 48 << 20, f"control: the slot holds {left} bytes of the run's reads"
        if kind == "light":
            later = ex.run("print(1)")
            assert later.status is Status.ok, later
            assert peak_of(later) < 16 << 20, later.metrics
            # One that reaches its limit has the kernel reclaim those pages for it: its peak
            # is all its own, not less the pages it took the place of.
            if not renewed:
                assert _slot_file_bytes(ex, kind) >= 48 << 20, "control: the pages are still there"
            hog = ex.run(  # the time a loaded user-mode Linux guest may need to reclaim
                "x = bytearray(200 << 20)",
                limits={"memory_mib": 128, "timeout_s": 60, "cpu_s": 60},
            )
            assert hog.status is Status.memory_limit, hog
            assert peak_of(hog) > 112 << 20, hog.metrics
        else:
            with ex.session() as s:  # the heavy slot that has just read the files
                cell = s.run("x = 1")
            assert cell.status is Status.ok, cell
            assert peak_of(cell) < peak_of(fresh) + (16 << 20), (
                cell.metrics,
                fresh.metrics,
            )


def _staged_program(ex: Executor, kind: str = "light") -> int:
    """The pid of the (one) staged slot of `kind`'s program, once it waits for its code: the
    child of its program zygote in the slot's cgroup."""
    slot = _offered(_ready_slot(ex, kind))  # its program has said it waits
    host = host_stats(ex)
    zygote = host.light_zygote_pid if kind == "light" else host.heavy_zygote_pid
    [pid] = [p for p in _children(zygote) if f"/{slot.name}\n" in _read_text(f"/proc/{p}/cgroup")]
    return pid


def _unread(fd: int) -> int:
    """Bytes in the pipe `fd` (either end) that its reader has not read."""
    n = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, n)
    return n[0]


def _unsent(fd: int) -> int:
    """Bytes sent on the unix socket `fd` that its peer has not read yet (SIOCOUTQ)."""
    n = array.array("i", [0])
    fcntl.ioctl(fd, termios.TIOCOUTQ, n)
    return n[0]


def _read_text(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def _children(pid: int) -> set[int]:
    return {int(p) for p in _read_text(f"/proc/{pid}/task/{pid}/children").split()}


def _wait_gone(pid: int, what: str) -> None:
    """Until the process `pid` has exited (a zombie counts)."""
    deadline = time.monotonic() + 5
    while True:
        try:
            if _read_text(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return
        except (FileNotFoundError, ProcessLookupError):  # reaped, before or while we read
            return
        assert time.monotonic() < deadline, f"control: {what}"
        time.sleep(0.01)


@pytest.mark.parametrize("files", [{}, {"in.txt": b"x"}], ids=["short_way", "long_way"])
def test_a_program_killed_while_it_waits_is_not_the_codes_fault(
    jailed_one_slot: Executor, files: dict[str, bytes], caplog: pytest.LogCaptureFixture
) -> None:
    """A staged program killed from outside (the machine's OOM killer, an operator) before
    its code came ran none of it: the request goes to the slot's next program, and no result
    says the code was killed. The short way finds the go pipe without a reader; the long way
    is told by the supervisor, whose write found none."""
    ex = jailed_one_slot
    ex.run("pass")
    victim = _staged_program(ex)
    os.kill(victim, signal.SIGKILL)
    _wait_gone(victim, "the staged program did not die")
    with caplog.at_level("WARNING", logger="execbox"):
        r = ex.run("print('ran')", files=files)
    assert r.status is Status.ok and r.stdout == "ran\n", r
    assert "gone before it took the code (try 1 of 3)" in caplog.text, "control: sent again"
    assert ex.run("print(2)").stdout == "2\n"


def test_a_program_killed_with_its_code_unread_is_not_the_codes_fault(
    jailed_one_slot: Executor, caplog: pytest.LogCaptureFixture
) -> None:
    """The code is in the program's go pipe, written whole, but the program (stopped) never
    read it when it is killed: the supervisor sees the unread bytes and says so (LOST)."""
    ex = jailed_one_slot
    ex.run("pass")
    victim = _staged_program(ex)
    slot = _offered(_ready_slot(ex, "light"))  # the victim's
    # The host closes its end of the go pipe once the code is in: look through a copy.
    go, ctrl = os.dup(slot.go_w), slot.ctrl.fileno()
    os.kill(victim, signal.SIGSTOP)
    box: list[RunResult] = []

    def taken() -> bool:  # the code is in the pipe, and the supervisor has read RUN
        return _unread(go) > 0 and _unsent(ctrl) == 0

    with caplog.at_level("WARNING", logger="execbox"):
        thread = threading.Thread(target=lambda: box.append(ex.run("print('ran')")))
        thread.start()
        try:
            assert wait_until(taken, 10, every_s=0.01), "the request never reached the slot"
        finally:
            os.kill(victim, signal.SIGKILL)
            os.close(go)
        thread.join(30)
    [r] = box
    assert r.status is Status.ok and r.stdout == "ran\n", r
    assert "gone before it took the code (try 1 of 3)" in caplog.text, "control: sent again"


def test_a_supervisor_killed_while_its_slot_waits_is_not_the_codes_fault(
    jailed_one_slot: Executor, caplog: pytest.LogCaptureFixture
) -> None:
    """A staged slot whose supervisor was killed (its init and program die with it) took none
    of the request: it goes to a new slot, not back as a sandbox error."""
    ex = jailed_one_slot
    ex.run("pass")
    program = _staged_program(ex)
    [slot] = host_internals(ex).pool._ready["light"]
    signal.pidfd_send_signal(slot.sup_pidfd, signal.SIGKILL)
    assert slot.wait_gone(5), "control: the supervisor did not die"
    # init dies with its supervisor, and the program with init
    _wait_gone(program, "the program outlived its supervisor")
    with caplog.at_level("WARNING", logger="execbox"):
        r = ex.run("print('ran')")
    assert r.status is Status.ok and r.stdout == "ran\n", r
    assert "did not take the request" in caplog.text, "control: sent again"


def test_a_session_whose_program_was_killed_while_it_waited_starts_in_another_slot(
    jailed_one_slot: Executor, caplog: pytest.LogCaptureFixture
) -> None:
    ex = jailed_one_slot
    wait_heavy(ex)
    victim = _staged_program(ex, "heavy")
    os.kill(victim, signal.SIGKILL)
    _wait_gone(victim, "the staged program did not die")
    with caplog.at_level("WARNING", logger="execbox"), ex.session() as s:
        r = s.run("x = 41\nprint(x + 1)")
    assert r.status is Status.ok and r.stdout == "42\n", r
    assert "gone before it took the session's request (try 1 of 3)" in caplog.text


def test_a_request_too_big_for_its_memory_limit_is_that_runs_memory_limit(
    jailed_one_slot: Executor, caplog: pytest.LogCaptureFixture
) -> None:
    """A program killed by its own memory limit while it reads a large request (each \\x01 is
    six bytes of JSON) did not die from outside: the run's status is memory_limit, and the
    request is not sent again."""
    code = "#" + "\x01" * ((4 << 20) - 64) + "\nprint('ran')\n"
    with caplog.at_level("WARNING", logger="execbox"):
        r = jailed_one_slot.run(code, limits={"memory_mib": 16}, profile="extended")
    assert r.status is Status.memory_limit, r
    assert "gone before it took" not in caplog.text


def _kill_the_next(zygote: int, before: set[int], cgroup: str, stop: threading.Event) -> None:
    """Kill the first child of `zygote` not in `before` that is in `cgroup`, at once."""
    while not stop.is_set():
        for pid in _children(zygote) - before:
            try:
                if f"/{cgroup}\n" in _read_text(f"/proc/{pid}/cgroup"):
                    os.kill(pid, signal.SIGKILL)
                    return
            except (FileNotFoundError, ProcessLookupError):  # reaped before or while we read
                pass


@pytest.mark.serial
def test_a_program_killed_before_it_said_it_waits_is_not_the_codes_fault(
    jailed_one_slot: Executor, caplog: pytest.LogCaptureFixture
) -> None:
    """Killed while it readies itself, before it says it waits for its code: the slot never
    offers the short way, the request comes the long way, and the supervisor, seeing its
    program ended by SIGKILL in set-up, says LOST. A pandas slot's program copies ~10 MB of
    warm pages before it says so: a watcher kills it in that time."""
    ex = jailed_one_slot
    wait_heavy(ex)
    zygote = host_stats(ex).heavy_zygote_pid
    code = "import pandas\nprint('ran')"
    for _ in range(5):
        _staged_program(ex, "pandas")  # parked, and long since: its next one is staged warm
        slot = _ready_slot(ex, "pandas")
        before = _children(zygote)
        stop = threading.Event()
        watcher = threading.Thread(target=_kill_the_next, args=(zygote, before, slot.name, stop))
        watcher.start()
        try:
            assert ex.run(code).status is Status.ok  # its slot then stages the victim
            slot = _ready_slot(ex, "pandas")
        finally:
            stop.set()
            watcher.join(5)
        time.sleep(0.3)
        if not slot.take_offer():  # it never said it waits: killed in time
            break
    else:
        pytest.fail("the watcher never killed a pandas program before it said it waits")
    with caplog.at_level("WARNING", logger="execbox"):
        r = ex.run(code)
    assert r.status is Status.ok and r.stdout == "ran\n", r
    assert "gone before it took the code (try 1 of 3)" in caplog.text


# What a run can read of its network namespace's past (sockstat's machine-wide fields left
# out: memory pages, orphans and sockets allocated count every namespace's).
NET_STATE = textwrap.dedent("""
    import json, os, re
    def read(name):
        with open('/proc/net/' + name) as fh:
            text = fh.read()
        return (re.sub(r' (mem|orphan|alloc) \\d+', '', text) if name.startswith('sockstat')
                else text)
    names = ('tcp', 'tcp6', 'udp', 'udp6', 'dev', 'snmp', 'snmp6', 'netstat', 'sockstat',
             'sockstat6', 'unix', 'ip6_flowlabel')
    print(json.dumps({"uid": os.getuid(), "net": os.readlink('/proc/self/ns/net'),
                      "state": {n: read(n) for n in names}}))
""")

USE_THE_NETWORK = (
    textwrap.dedent("""
    import socket
    for family, host in ((socket.AF_INET, '127.0.0.1'), (socket.AF_INET6, '::1')):
        server = socket.socket(family)
        server.bind((host, 0))
        server.listen()
        client = socket.create_connection(server.getsockname()[:2])
        conn, _ = server.accept()
        client.sendall(b'from an earlier run')
        conn.recv(100)
        client.close()  # the closing side keeps the connection in TIME_WAIT
        conn.close()
        server.close()
        with socket.socket(family, socket.SOCK_DGRAM) as udp:
            udp.sendto(b'x', (host, 9))  # nobody listens: an ICMP error, counted
    for address in (('192.0.2.1', 80), ('2001:db8::1', 80)):  # no route: counted
        with socket.socket(socket.AF_INET6 if ':' in address[0] else socket.AF_INET) as s:
            try:
                s.connect(address)
            except OSError:
                pass
""")
    + NET_STATE
)


@pytest.mark.hostile
def test_no_network_state_reaches_the_next_runs_of_a_slot(jailed_one_slot: Executor) -> None:
    """A run that used loopback (TCP over IPv4 and IPv6 left in TIME_WAIT, UDP to a closed
    port, connects with no route) leaves nothing the ten runs after it in its slot can read in
    /proc/net: each sees what a run saw before any use of the network."""
    ex = jailed_one_slot

    def state(code: str) -> dict[str, Any]:
        r = ex.run(code)
        assert r.status is Status.ok, r
        seen: dict[str, Any] = json.loads(r.stdout)
        return seen

    before = state(NET_STATE)
    slots = host_stats(ex).idle_slots
    used = state(USE_THE_NETWORK)
    assert used["uid"] == before["uid"], "control: the runs were in the same slot"
    # Control: the run itself sees what it did, so the comparison below can fail.
    changed = {n for n, text in before["state"].items() if used["state"][n] != text}
    assert {"tcp", "tcp6", "dev", "snmp", "snmp6", "netstat"} <= changed, changed
    after = [state(NET_STATE) for _ in range(10)]
    assert host_stats(ex).idle_slots == slots, "control: every run was in the same slot"
    for i, seen in enumerate(after):
        assert seen["uid"] == before["uid"], "control: the runs were in the same slot"
        leaked = {n: text for n, text in seen["state"].items() if text != before["state"][n]}
        assert leaked == {}, f"run {i + 1} after the network use saw {leaked}"
    # A new namespace only after the run that used one: the ten after it share theirs.
    assert len({seen["net"] for seen in after}) == 1 and after[0]["net"] != used["net"]


@pytest.mark.hostile
def test_slots_stage_with_fresh_network_state_on_a_host_without_ipv6(
    jailed_one_slot: Executor,
) -> None:
    """A kernel booted with ipv6.disable=1 has no /proc/net/snmp6 nor ip6_flowlabel: they
    hold no state a run could leave, and every slot must still stage (a missing file failed
    it: "fresh network state: No such file or directory"), each run's IPv4 state fresh."""
    if os.path.exists("/proc/net/snmp6"):
        pytest.skip("this host has IPv6: `EXECBOX_UML_IPV6=0 tests/uml/boot` runs this test")
    ex = jailed_one_slot
    present = NET_STATE.replace(
        "for n in names}", "for n in names if os.path.exists('/proc/net/' + n)}"
    )
    use_ipv4 = textwrap.dedent("""
        import socket
        server = socket.create_server(('127.0.0.1', 0))
        client = socket.create_connection(server.getsockname())
        conn, _ = server.accept()
        client.sendall(b'from an earlier run')
        conn.recv(100)
        client.close()  # the closing side keeps the connection in TIME_WAIT
        conn.close()
        server.close()
    """)

    def state(code: str) -> dict[str, Any]:
        r = ex.run(code)
        assert r.status is Status.ok, r
        seen: dict[str, Any] = json.loads(r.stdout)
        return seen

    before = state(present)
    assert "snmp6" not in before["state"] and {"tcp", "snmp", "dev"} <= set(before["state"])
    used = state(use_ipv4 + present)
    changed = {n for n, text in before["state"].items() if used["state"][n] != text}
    assert {"tcp", "snmp", "dev"} <= changed, f"control: the run saw only {changed} change"
    for i in range(3):
        seen = state(present)
        assert seen["uid"] == before["uid"], "control: the runs were in the same slot"
        leaked = {n for n, text in seen["state"].items() if text != before["state"][n]}
        assert leaked == set(), f"run {i + 1} after the network use saw {leaked} change"
