"""Attack tests for how a session's cell travels: the supervisor hands the host the write end
of the interpreter's cell pipe ("go" pipe) with SRDY, the host writes each cell's code straight
to the interpreter and only then sends CELL (which starts the supervisor's clocks); a report
that beats CELL waits for it up to `cells.CELL_WAIT_S`. The cell's code shares a process with
the interpreter loop, so it can read, watch and close the go pipe's read end, and leave threads
that do so between cells. What must hold whatever it does:

- each cell gets its own result and output, never an earlier cell's (or the session ends);
- the host and supervisor never hang past a cell's limits and return a status, not an exception
  (and never `sandbox_error` for something the code did);
- nothing of a session (descriptors, processes, cgroup) outlives it;
- run records stay one correct row per cell under threads.

Hostile programs run only through `jailed` (see tests/conftest.py), as cells of a session.

At e6fe597 five of these failed (a forged or forked report shifted every later cell's result;
a forged report during a large cell was a sandbox_error; the cell pipe reached the host's
children; a lone surrogate raised); cc4a537 fixed them and they stay as regression tests.
"""

from __future__ import annotations

import array
import fcntl
import os
import select
import termios
import threading
import time
from collections.abc import Callable

import pytest

from execbox import Executor, Limits, SessionClosed, Status, UsageError
from execbox.sessions import Session
from tests.probes import alive, host_internals, peak_of, wait_until
from tests.sandbox.session_probes import (
    KERNEL,
    cgroup_dirs,
    run_or_closed,
    session_channel,
    sup_pid,
)

pytestmark = pytest.mark.hostile

MIB = 1 << 20

# A thread left running: when the next cell's code lands in the go pipe, do `action`.
ON_NEXT_CELL = (
    KERNEL
    + """
def _armed():
    select.select([K['go_r']], [], [])
{action}
threading.Thread(target=_armed, daemon=True).start()
"""
)

# The loop stops taking cells (SIGINT is ignored between cells): it sleeps where it reads.
STOP_READING_CELLS = (
    KERNEL
    + """
import execbox.sandbox.inside.protocol as P
P.read_frame = lambda *args, **kwargs: time.sleep(10 ** 6)
"""
)

FORGED_OK = (
    "    write_all(K['report_w'], forge(b'CRES', json.dumps({'status': 'ok', "
    "'error': None, 'markers': {'stdout': False, 'stderr': False}}).encode()))"
)


# ---- host-side observation -----------------------------------------------------------------


def _host_links() -> set[str]:
    """What the host's descriptors point at (pipe:[inode], socket:[inode], files)."""
    links = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return links


def _session_links(s: Session) -> set[str]:
    """The host's descriptors of one session: its cell pipe, control socket, output pipes."""
    ch = session_channel(s)
    fds = [ch.cells_w, ch.slot.ctrl.fileno(), ch.slot.stdout_r, ch.slot.stderr_r]
    return {os.readlink(f"/proc/self/fd/{fd}") for fd in fds}


# ---- each cell gets its own result ---------------------------------------------------------------


def test_a_forged_report_never_shifts_later_cells_results(hostile: Executor) -> None:
    """e6fe597: a report with no cell running waited for the next CELL (cells.py _reports),
    so one forged report shifted every later cell (and its record) by one."""
    with hostile.session() as s:
        assert s.run(ON_NEXT_CELL.format(action=FORGED_OK)).ok
        # The thread answers for cell 2 (a cell's own result may be forged, or refused), so
        # cell 2's real report comes with no cell running. No cell may show another's.
        for i in range(2, 7):
            r = run_or_closed(s, f"print('out{i}')\n'val{i}'")
            if isinstance(r, SessionClosed):
                return  # ending the session is a correct answer
            shown = [o.data for o in r.outputs]
            others = [
                j for j in range(2, 7) if j != i and (f"'val{j}'" in shown or f"out{j}" in r.stdout)
            ]
            assert not others, f"cell {i} shows cell {others}'s result: {shown} {r.stdout!r}"
            if i > 2:
                record = hostile.store.get(r.run_id)
                assert record is not None and f"'val{i}'" in record.code
                assert [o.data for o in record.result.outputs] in ([f"'val{i}'"], []), record


def test_a_cell_that_forks_answers_with_the_interpreters_result_and_later_cells_their_own(
    hostile: Executor,
) -> None:
    """e6fe597: a plain os.fork() left two loops answering, and whichever copy reported first
    was the cell's result (CI saw 'child'). The forked copy now ends once its copy of the cell
    does, without a report: the cell is the interpreter's, every later cell its own."""
    with hostile.session() as s:
        for round_ in range(3):  # the race was lost about one time in a few hundred; ask often
            first = s.run("import os\npid = os.fork()\n'parent' if pid else 'child'")
            assert [o.data for o in first.outputs] == ["'parent'"], first
            for i in range(2, 5):
                r = s.run(f"print('out{i}')\n'val{i}'")
                assert r.ok and [o.data for o in r.outputs] == [f"'val{i}'"], (round_, i, r)
                assert r.stdout == f"out{i}\n", (round_, i, r.stdout)


def test_a_report_forged_between_cells_ends_the_session_when_no_cell_follows(
    hostile: Executor,
) -> None:
    """Control for the tests above: with no cell within CELL_WAIT_S, the same forgery ends the
    session (the supervisor's rule for reports while no cell runs)."""
    with hostile.session() as s:
        sup = sup_pid(s)
        r = s.run(
            KERNEL + "def later():\n    time.sleep(0.2)\n" + FORGED_OK + "\n"
            "threading.Thread(target=later, daemon=True).start()"
        )
        assert r.ok, r
        assert wait_until(lambda: not alive(sup), 5.0), "the supervisor is still running"
        with pytest.raises(SessionClosed, match="reported while no cell was running"):
            s.run("1")


@pytest.mark.serial
def test_a_report_forged_before_a_files_call_ends_the_session_without_a_hang(
    hostile: Executor,
) -> None:
    """A report while no cell runs, then a files call (not a CELL) within CELL_WAIT_S: the call
    is answered, then the session ends; nothing hangs or raises past SessionClosed."""
    with hostile.session() as s:
        sup = sup_pid(s)
        r = s.run(
            KERNEL + "def later():\n    time.sleep(0.3)\n" + FORGED_OK + "\n"
            "threading.Thread(target=later, daemon=True).start()"
        )
        assert r.ok, r
        time.sleep(0.4)
        started = time.monotonic()
        try:
            s.files.write("a.txt", b"x" * MIB)
        except SessionClosed:
            pass
        assert time.monotonic() - started < 2.5
        assert wait_until(lambda: not alive(sup), 3.0)
        with pytest.raises(SessionClosed):
            s.files.list()


def test_calls_after_the_session_ended_raise_session_closed_in_every_thread(
    hostile: Executor,
) -> None:
    with hostile.session() as s:
        r = s.run("import os\nos._exit(0)")
        assert r.status is not Status.ok, r  # control: the cell ended the session
        box: list[BaseException | None] = []

        def call() -> None:
            try:
                s.run("1")
                box.append(None)
            except BaseException as exc:  # noqa: BLE001 - what was raised is the check
                box.append(exc)

        threads = [threading.Thread(target=call) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(box) == 4 and all(isinstance(e, SessionClosed) for e in box), box


def test_many_quick_cells_each_get_their_own_result(hostile: Executor) -> None:
    """A quick cell's report often beats its CELL to the supervisor: it must wait for it, and
    be charged to that cell, never end the session."""
    with hostile.session() as s:
        for i in range(150):
            r = s.run(f"print({i})\n{i} * 2")
            assert (r.status, r.stdout, [o.data for o in r.outputs]) == (
                Status.ok,
                f"{i}\n",
                [str(i * 2)],
            ), (i, r)


def test_a_forged_report_during_a_large_cell_is_not_a_sandbox_error(hostile: Executor) -> None:
    """e6fe597: _CellPump.run raised HostError ('stopped reading its cells'): sandbox_error,
    which the contract reserves for execbox failing."""
    with hostile.session() as s:
        # The loop takes no more cells; a thread answers for the next one as it arrives.
        assert s.run(STOP_READING_CELLS + ON_NEXT_CELL.format(action=FORGED_OK)).ok
        r = run_or_closed(s, "x = 1\n" + "#" * (300 << 10), timeout_s=2)
        if isinstance(r, SessionClosed):
            return
        assert r.status is not Status.sandbox_error, r


# ---- the code plays with its end of the go pipe -----------------------------------------------------


@pytest.mark.serial
@pytest.mark.parametrize(
    "action",
    [
        "    os.read(K['go_r'], 1)",  # one byte of the next cell: the frame is torn
        "    os.read(K['go_r'], 1 << 20)",  # the whole next cell: the loop never gets it
        "    os._exit(3)",  # dies as the next cell arrives
        "    os.close(K['go_r'])",  # closes the loop's cell pipe under it
        "    r, w = os.pipe()\n    os.dup2(r, K['go_r'])\n    time.sleep(60)",  # swaps in a pipe
    ],
    ids=["tear", "steal", "exit", "close", "swap"],
)
def test_a_thread_left_on_the_go_pipe_ends_at_most_the_session_within_its_limits(
    hostile: Executor, action: str
) -> None:
    with hostile.session() as s:
        sup = sup_pid(s)
        assert s.run(ON_NEXT_CELL.format(action=action)).ok
        started = time.monotonic()
        r = run_or_closed(s, "print('next')", timeout_s=1)
        took = time.monotonic() - started
        assert took < 1 + 2 + 1.5, f"the host waited {took:.1f} s"
        if not isinstance(r, SessionClosed):
            assert r.status is not Status.sandbox_error, r
            assert r.stdout in ("", "next\n"), r
        later = run_or_closed(s, "print('later')", timeout_s=1)
        if not isinstance(later, SessionClosed):
            assert later.stdout == "later\n" or later.status is not Status.ok, later
        s.close()
        assert wait_until(lambda: not alive(sup), 3.0)


def test_a_shrunken_go_pipe_still_carries_a_large_cell(hostile: Executor) -> None:
    with hostile.session() as s:
        r = s.run(KERNEL + "import fcntl\nprint(fcntl.fcntl(K['go_r'], 1031, 4096))")  # SETPIPE_SZ
        assert r.stdout == "4096\n", r  # control: the pipe now holds one page
        payload = "x" * (MIB - 100)  # the 'data' profile's code cap is 1 MiB
        r = s.run(f"s = '{payload}'\nlen(s)", timeout_s=10)
        assert r.ok and [o.data for o in r.outputs] == [str(len(payload))], r.status
        assert s.run("print('after')").stdout == "after\n"


def test_huge_cells_back_to_back_keep_the_session_in_step(hostile: Executor) -> None:
    with hostile.session(limits=Limits(memory_mib=512)) as s:
        for i, size in enumerate((60 << 10, 64 << 10, 65 << 10, 200 << 10, MIB - 100)):
            r = s.run(f"print({i})\n{i}\n#" + "#" * (size - 16), timeout_s=20)
            assert (r.status, r.stdout, [o.data for o in r.outputs]) == (
                Status.ok,
                f"{i}\n",
                [str(i)],
            ), (size, r)


# ---- descriptors and processes --------------------------------------------------------------------------


def test_the_cell_pipe_does_not_leak_into_host_children(
    hostile: Executor, host_child_fds: Callable[[], str]
) -> None:
    """e6fe597: socket.recv_fds (3.11 drops its flags) left the cell pipe inheritable."""
    with hostile.session() as s:
        fd = session_channel(s).cells_w
        pipe = os.readlink(f"/proc/self/fd/{fd}")
        out = host_child_fds()
        assert pipe not in out, f"a host child inherited the session's cell pipe ({pipe})"


def test_a_session_on_a_slot_that_offered_the_short_way_leaves_no_descriptor_behind(
    hostile: Executor,
) -> None:
    """A staged slot offers runs the short way (PRK, with a copy of the program's go pipe)
    before the host asks it for anything; a session takes the slot all the same: the offer is
    not taken for its cell pipe, and its copy of the pipe is closed."""
    # Every staged heavy slot's program waits for its code: each has sent its offer (unread).
    pool = host_internals(hostile).pool
    assert wait_until(
        lambda: (
            len(ready := list(pool._ready["heavy"])) >= hostile.pool_size
            and all(select.select([slot.ctrl], [], [], 0)[0] for slot in ready)
        ),
        10,
    )
    with hostile.session() as s:
        links = _session_links(s)
        assert [o.data for o in s.run("x = 2\nx").outputs] == ["2"]
    wait_until(lambda: not links & _host_links(), 2)
    held = _host_links()
    assert not links & held, f"still open after the session: {links & held}"


def test_sessions_leave_no_host_descriptor_behind(hostile: Executor) -> None:
    held: set[str] = set()
    for _ in range(3):
        with hostile.session() as s:
            held |= _session_links(s)
            assert s.run("x = 1").ok and s.run("x").ok
    s = hostile.session()  # one whose interpreter dies as its next cell arrives
    held |= _session_links(s)
    assert s.run(ON_NEXT_CELL.format(action="    os._exit(3)")).ok
    run_or_closed(s, "1")
    s.close()
    s = hostile.session()  # one whose supervisor is killed mid-cell
    held |= _session_links(s)
    box: list[object] = []
    running = threading.Event()
    t = threading.Thread(
        target=lambda: box.append(
            run_or_closed(
                s,
                "import time\nprint('on', flush=True)\ntime.sleep(5)",
                timeout_s=10,
                on_stdout=lambda _: running.set(),
            )
        )
    )
    t.start()
    assert running.wait(10), "the cell never started"
    session_channel(s).kill()
    t.join(10)
    assert box and not t.is_alive()
    s.close()
    assert len(held) == 5 * 4  # control: every one of them was seen open
    left = held & _host_links()
    assert not left, f"the host still holds {left} of closed sessions"


def _pipe_full(fd: int) -> bool:
    """Whether the pipe `fd` (either end) holds as much as it can."""
    unread = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, unread)
    return unread[0] >= fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)


@pytest.mark.serial
def test_executor_close_while_a_large_cell_is_being_fed(hostile: Executor) -> None:
    ex = Executor(cache=False, pool_size=1)
    closed = False
    try:
        s = ex.session()
        name, sup = session_channel(s).slot.name, sup_pid(s)
        assert s.run(STOP_READING_CELLS).ok
        box: list[object] = []
        t = threading.Thread(
            target=lambda: box.append(run_or_closed(s, "x = 1\n" + "#" * (MIB - 100), timeout_s=30))
        )
        t.start()
        cells_w = session_channel(s).cells_w
        assert wait_until(lambda: _pipe_full(cells_w), 10), "the cell pipe never filled"
        assert t.is_alive()  # control: the host is still feeding the cell
        started = time.monotonic()
        ex.close()
        closed = True
        took = time.monotonic() - started
        t.join(10)
        assert box and not t.is_alive(), "the cell's caller got no answer"
        assert not isinstance(box[0], BaseException) or isinstance(box[0], SessionClosed)
        assert took < 3, f"Executor.close took {took:.1f} s"
        assert wait_until(lambda: not alive(sup), 3.0)
        assert wait_until(lambda: not cgroup_dirs(name), 3.0), cgroup_dirs(name)
    finally:
        if not closed:
            ex.close()


# ---- cgroup counters read with pread -----------------------------------------------------------------


def test_cell_counters_are_fresh_and_per_cell(hostile: Executor) -> None:
    with hostile.session(limits=Limits(memory_mib=256)) as s:
        spin = s.run(
            "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3:\n    pass"
        )
        assert spin.metrics.cpu_ms >= 250, spin.metrics
        idle = s.run("1")
        assert idle.metrics.cpu_ms < 150, idle.metrics
        big = s.run("b = bytearray(120 << 20)\nfor i in range(0, len(b), 4096):\n    b[i] = 1")
        assert peak_of(big) >= 120 * MIB, big.metrics
        freed = s.run("del b\nimport gc\ngc.collect()")
        after = s.run("1")
        assert freed.ok and peak_of(after) < 100 * MIB, after.metrics


# ---- threads and records -------------------------------------------------------------------------------


def test_threads_sharing_sessions_get_their_own_results_and_records(hostile: Executor) -> None:
    sessions = [hostile.session(), hostile.session()]
    errors: list[str] = []
    results: list[tuple[str, str, str]] = []  # (run_id, session id, token)

    def worker(n: int) -> None:
        s = sessions[n % 2]
        for i in range(25):
            token = f"t{n}x{i}"
            r = s.run(f"print('{token}')\n'{token}'")
            if r.stdout != f"{token}\n" or [o.data for o in r.outputs] != [f"'{token}'"]:
                errors.append(f"{token}: {r.stdout!r} {r.outputs}")
            results.append((r.run_id, s.id, token))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        for s in sessions:
            s.close()
    assert not errors, errors[:5]
    assert len(results) == 150
    for run_id, session_id, token in results:
        record = hostile.store.get(run_id)
        assert record is not None, f"no record for {token}"
        assert record.session_id == session_id and f"'{token}'" in record.code
        assert record.result.stdout == f"{token}\n", (token, record.result.stdout)
    for s in sessions:
        assert len(hostile.store.list(session_id=s.id, limit=1000)) == 75


def test_a_cell_with_a_lone_surrogate_in_its_code_is_refused_not_an_exception(
    hostile: Executor,
) -> None:
    """Caught at e6fe597: UnicodeEncodeError from deep in the pipeline (the code's sha256 and
    record). A usage error (the code is not text) or a status is the answer; the session goes
    on."""
    with hostile.session() as s:
        try:
            r = s.run("x = '\udcff'\nx")  # the code itself holds U+DCFF: it never runs
        except UsageError as exc:
            assert "surrogate" in str(exc)
        else:
            assert r.status in (Status.error, Status.policy_denied), r
        assert s.run("print('alive')").stdout == "alive\n"
