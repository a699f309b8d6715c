"""The run store on a real SQLite file: durable, concurrent, deduplicated."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from execbox.contract import Artifact, InputFile, RunRequest, RunResult, Status
from execbox.errors import RecordsError
from execbox.records import PolicyInfo, RunStore
from execbox.records.sqlite import COMMIT_LOCK, ForkSafeConnection, SQLiteRunRows
from tests.probes import wait_until


def _run(i: int, art: bytes = b"") -> tuple[RunRequest, RunResult]:
    req = RunRequest(
        code=f"print({i})", stdin=b"in", files=[InputFile(name="a.csv", data=b"x,y\n")]
    )
    arts = [Artifact(path="out.bin", size=len(art), sha256=f"{i:064x}", mime_type="x/y", data=art)]
    res = RunResult(
        run_id=f"run{i:05d}",
        status=Status.ok,
        stdout=f"{i}\n",
        code_sha256="c" * 64,
        image_digest="sha256:img",
        artifacts=arts if art else [],
    )
    return req, res


def test_record_survives_a_restart_of_the_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    req, res = _run(1)
    store = RunStore(url)
    store.save(req, res, policy=PolicyInfo(), env={"A": "1"})
    store.close()
    again = RunStore(url).get("run00001")
    assert again is not None
    assert again.result == res and again.code == "print(1)" and again.env == {"A": "1"}
    assert again.inputs == [{"name": "a.csv", "size": 4, "sha256": again.inputs[0]["sha256"]}]
    assert RunStore(url).request_of(again).files[0].data == b"x,y\n"


def test_sqlite_store_uses_wal(tmp_path: Path) -> None:
    store = RunStore(f"sqlite:///{tmp_path}/runs.db")
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_eight_threads_of_a_hundred_writers_lose_no_record(tmp_path: Path) -> None:
    store = RunStore(f"sqlite:///{tmp_path}/runs.db")
    errors: list[BaseException] = []

    def writer(t: int) -> None:
        try:
            for i in range(100):
                req, res = _run(t * 1000 + i, art=b"same bytes in every run")
                store.save(req, res, policy=PolicyInfo(), env={})
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert store.count() == 800
    with store.engine.connect() as conn:
        # inputs, stdin and the shared artifact bytes are stored once, however often they recur
        assert conn.execute(sa.text("select count(*) from blobs")).scalar() == 3


def test_artifact_bytes_beyond_the_cap_are_not_stored(tmp_path: Path) -> None:
    store = RunStore(f"sqlite:///{tmp_path}/runs.db", artifact_bytes_cap=10)
    req, res = _run(7, art=b"more than ten bytes")
    store.save(req, res, policy=PolicyInfo(), env={})
    assert store.artifact_data("run00007", "out.bin") is None
    assert store.get("run00007") is not None


def test_approval_releases_a_held_run_only_once(tmp_path: Path) -> None:
    store = RunStore(f"sqlite:///{tmp_path}/runs.db")
    req, res = _run(3)
    store.save(
        req,
        res.model_copy(update={"status": Status.needs_approval}),
        policy=PolicyInfo(decision="needs_approval", rule="call.approval"),
        env={},
    )
    assert store.mark_approved("run00003", "alice") is True
    assert store.mark_approved("run00003", "bob") is False
    rec = store.get("run00003")
    assert rec is not None and rec.approved_by == "alice"


def test_a_rejected_held_run_can_never_be_approved(tmp_path: Path) -> None:
    store = RunStore(f"sqlite:///{tmp_path}/runs.db")
    for n in (3, 4):
        req, res = _run(n)
        store.save(
            req,
            res.model_copy(update={"status": Status.needs_approval}),
            policy=PolicyInfo(decision="needs_approval", rule="call.approval"),
            env={},
        )
    assert store.mark_rejected("run00003", "carol") is True
    assert store.mark_rejected("run00003", "dave") is False  # decided once
    assert store.mark_approved("run00003", "alice") is False
    rec = store.get("run00003")
    assert rec is not None and rec.rejected_by == "carol" and rec.approved_at is None
    assert store.mark_approved("run00004", "alice") is True  # control: approvable
    assert store.mark_rejected("run00004", "carol") is False  # and then not rejectable


def test_expired_cache_entries_are_not_returned(tmp_path: Path) -> None:
    store = RunStore(f"sqlite:///{tmp_path}/runs.db")
    req, res = _run(5)
    store.save(req, res, policy=PolicyInfo(), env={})
    store.cache_store("k" * 64, "run00005", ttl_s=-1)
    assert store.cache_lookup("k" * 64) is None
    store.cache_store("k" * 64, "run00005", ttl_s=60)
    hit = store.cache_lookup("k" * 64)
    assert hit is not None and hit.run_id == "run00005"
    assert store.cache_purge_expired() == 0


# ---- the writer: a run's row is committed just after its result returns ---------------------


def _committed(db: Path, run_id: str) -> bool:
    """Read the file with a connection of our own, as another process would: nothing of the
    store's, so no waiting for its writer."""
    conn = sqlite3.connect(db)
    try:
        return conn.execute("select 1 from runs where run_id = ?", (run_id,)).fetchone() is not None
    finally:
        conn.close()


def _fast(i: int) -> tuple[RunRequest, RunResult]:
    """A run that takes the writer's path: no input files, artifacts or stdin not yet stored."""
    req = RunRequest(code=f"print({i})")
    res = RunResult(
        run_id=f"fast{i:05d}",
        status=Status.ok,
        stdout=f"{i}\n",
        code_sha256="c" * 64,
        image_digest="sha256:img",
    )
    return req, res


@contextlib.contextmanager
def _held(db: Path) -> Iterator[None]:
    """Another connection holds the file's write lock: the store's writer waits on it (so
    the rows saved meanwhile queue up, and go in one batch once it is let go)."""
    lock = sqlite3.connect(db, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        lock.rollback()
        lock.close()


def test_reads_wait_for_queued_rows_and_close_commits_them(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = RunStore(f"sqlite:///{db}")
    store.save(*_fast(0), policy=PolicyInfo(), env={})  # stdin b"" stored: now the fast path
    with _held(db):  # the store's writer must wait
        for i in range(1, 50):
            store.save(*_fast(i), policy=PolicyInfo(), env={})
        time.sleep(0.2)
        assert not _committed(db, "fast00049")  # control: queued, not written yet
        reader = threading.Thread(target=lambda: seen.append(store.get("fast00049")))
        seen: list[object] = []
        reader.start()
        time.sleep(0.2)
        assert reader.is_alive() and not seen, "a read did not wait for the queued rows"
    reader.join(10)
    assert seen and seen[0] is not None
    for i in range(50, 100):
        store.save(*_fast(i), policy=PolicyInfo(), env={})
    store.close()
    assert all(_committed(db, f"fast{i:05d}") for i in range(100))


def test_rows_still_queued_at_exit_are_committed(tmp_path: Path) -> None:
    """An interpreter that ends without closing its store still commits what it queued."""
    db = tmp_path / "runs.db"
    code = (
        "import sys\n"
        "from execbox.records import PolicyInfo, RunStore\n"
        "from execbox.contract import RunRequest, RunResult, Status\n"
        "store = RunStore(sys.argv[1])\n"
        "for i in range(300):\n"
        "    store.save(RunRequest(code=f'print({i})'), RunResult(run_id=f'exit{i:05d}',"
        " status=Status.ok, code_sha256='c' * 64, image_digest='sha256:img'),"
        " policy=PolicyInfo(), env={})\n"
    )
    subprocess.run([sys.executable, "-c", code, f"sqlite:///{db}"], check=True, timeout=60)
    assert all(_committed(db, f"exit{i:05d}") for i in range(300))


def test_a_row_that_cannot_be_written_is_raised_and_costs_no_other(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "runs.db"
    store = RunStore(f"sqlite:///{db}")
    store.save(*_fast(1), policy=PolicyInfo(), env={})
    store.settle()
    with _held(db):  # so the three rows below go in one batch
        for i in (2, 1, 3):  # run fast00001 again: its primary key is taken
            store.save(*_fast(i), policy=PolicyInfo(), env={})
    store.settle()  # waits, raises nothing: failures are `check`'s
    with pytest.raises(RecordsError, match="1 run record.*UNIQUE constraint failed"):
        store.check()
    assert "run fast00001: UNIQUE" in caplog.text  # the log names the run
    assert _committed(db, "fast00002") and _committed(db, "fast00003")
    store.check()  # each failure is raised once
    store.close()


def test_saves_wait_when_the_queue_is_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SQLiteRunRows, "MAX_QUEUED", 4)
    db = tmp_path / "runs.db"
    store = RunStore(f"sqlite:///{db}")
    store.save(*_fast(0), policy=PolicyInfo(), env={})
    store.settle()
    saved: list[int] = []

    def saver() -> None:
        for i in range(1, 20):
            store.save(*_fast(i), policy=PolicyInfo(), env={})
            saved.append(i)

    thread = threading.Thread(target=saver)
    with _held(db):
        thread.start()
        # The writer holds one batch (stuck on the lock) and 4 more rows wait in the queue:
        # the saver waits for room.
        rows = store._rows
        assert rows is not None
        # Full, and the writer has taken a batch of the saver's rows (it is stuck on the lock).
        assert wait_until(lambda: len(rows._queue) == 4 and rows._queued - 4 > 1, 30), (
            "the queue did not fill behind a stuck batch"
        )
        blocked_at = len(saved)
        time.sleep(0.3)
        assert thread.is_alive() and len(saved) == blocked_at < 19, saved
    thread.join(30)
    assert saved == list(range(1, 20))
    store.close()
    assert all(_committed(db, f"fast{i:05d}") for i in range(20))


def test_forked_children_write_their_own_rows(tmp_path: Path) -> None:
    """Children forked while the parent's writer is busy (often inside a transaction) get a
    writer of their own (the parent's thread and lock are not in a child), write their rows
    promptly (a fork never lands inside a transaction: SQLite's in-process lock state would
    make a child wait its whole busy timeout, or hang) and not the parent's queued rows."""
    db = tmp_path / "runs.db"
    store = RunStore(f"sqlite:///{db}")
    store.save(*_fast(0), policy=PolicyInfo(), env={})
    stop = threading.Event()

    def saver() -> None:
        i = 1
        while not stop.is_set():
            store.save(*_fast(i), policy=PolicyInfo(), env={})
            i += 1

    thread = threading.Thread(target=saver)
    thread.start()
    children = []
    try:
        for n in range(8):
            time.sleep(0.02)
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    signal.alarm(10)
                    store.save(*_fast(90000 + n), policy=PolicyInfo(), env={})
                    store.settle()
                    store.check()
                    code = 0
                finally:
                    os._exit(code)
            children.append(pid)
    finally:
        stop.set()
        thread.join()
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    assert codes == [0] * 8, codes
    store.close()
    assert all(_committed(db, f"fast{90000 + n:05d}") for n in range(8))


def test_a_writer_closes_its_connection_only_between_forks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing a connection takes SQLite's process-wide file mutex: a child forked meanwhile
    would hang in its first `connect`. So a writer ending idle closes its connection under the
    lock that `os.fork` takes: while the lock is held, it cannot."""
    monkeypatch.setattr(SQLiteRunRows, "IDLE_S", 0.1)
    monkeypatch.setattr(SQLiteRunRows, "LINGER_S", 0.0)
    store = RunStore(f"sqlite:///{tmp_path}/runs.db")
    store.save(*_fast(0), policy=PolicyInfo(), env={})  # the slow path: stdin is new
    store.save(*_fast(1), policy=PolicyInfo(), env={})
    store.settle()
    assert store._rows is not None
    writer = store._rows._thread
    assert writer is not None
    with COMMIT_LOCK:
        time.sleep(0.5)  # well past its idle time
        assert writer.is_alive(), "the writer closed its connection while a fork could happen"
    writer.join(10)
    assert not writer.is_alive()
    store.close()


def test_every_connection_a_store_opens_is_closed_between_forks(tmp_path: Path) -> None:
    """SQLAlchemy's connections (reads, the schema, the cache) too, and also when a store
    dropped unclosed leaves them to the garbage collector, in whichever thread collects."""
    store = RunStore(f"sqlite:///{tmp_path}/runs.db")
    store.save(*_fast(0), policy=PolicyInfo(), env={})
    store.settle()
    assert store.get("fast00000") is not None
    with store.engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert isinstance(raw, ForkSafeConnection), type(raw)
    store.close()
    dropped: list[Any] = [RunStore(f"sqlite:///{tmp_path}/other.db")]
    assert dropped[0].get("nope") is None  # a pooled connection, open
    collected = threading.Event()

    def collect() -> None:
        dropped.clear()  # the store and its engine are cycles: only the collector frees them
        gc.collect()
        collected.set()

    with COMMIT_LOCK:
        thread = threading.Thread(target=collect)
        thread.start()
        assert not collected.wait(0.5), "a connection was closed while a fork could happen"
    assert collected.wait(10)
    thread.join()


def test_children_forked_while_the_collector_closes_connections_do_not_hang(tmp_path: Path) -> None:
    """The last test's claim, end to end: forks while another thread's collection closes the
    connections of dropped stores (with plain connections, 1 child in 7 hung in `connect`)."""
    forked: list[int] = []
    gc.disable()
    try:
        while len(forked) < 45:
            for i in range(10):
                store = RunStore(f"sqlite:///{tmp_path}/r{i}.db")
                store.get("nope")
                del store
            collector = threading.Thread(target=gc.collect)
            collector.start()
            while collector.is_alive() or not forked:
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        signal.signal(signal.SIGALRM, signal.SIG_DFL)
                        signal.alarm(5)  # a hang ends the child by the alarm
                        conn = sqlite3.connect(str(tmp_path / "child.db"))
                        conn.execute("select 1")
                        conn.close()
                        code = 0
                    finally:
                        os._exit(code)
                status = os.waitpid(pid, 0)[1]
                forked.append(os.waitstatus_to_exitcode(status))
            collector.join()
    finally:
        gc.enable()
    assert forked == [0] * len(forked), forked


@pytest.mark.serial
def test_a_read_under_a_steady_stream_of_saves_returns(tmp_path: Path) -> None:
    """A read waits for the rows queued before it, not for a moment when nothing is queued
    (which a busy server may never have)."""
    store = RunStore(f"sqlite:///{tmp_path}/runs.db")
    store.save(*_fast(0), policy=PolicyInfo(), env={})
    stop = time.monotonic() + 4.0
    read = threading.Event()  # the stream goes on until the read returns (or 4 s have passed)
    saved = [0]

    def saver() -> None:
        i = 1
        while time.monotonic() < stop and not read.is_set():
            store.save(*_fast(i), policy=PolicyInfo(), env={})
            saved[0] = i
            i += 1

    thread = threading.Thread(target=saver)
    thread.start()
    try:
        assert wait_until(lambda: saved[0] >= 100, 10), "the stream of saves never got going"
        before = saved[0]
        started = time.monotonic()
        assert store.count() >= before + 1
        assert time.monotonic() - started < 2.0, "the read waited for the stream to stop"
        assert thread.is_alive(), "control: the stream ran all through the read"
    finally:
        read.set()
        thread.join()
    store.close()


def test_a_read_or_close_cuts_the_writers_linger_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(SQLiteRunRows, "LINGER_S", 3600.0)
    db = tmp_path / "runs.db"
    store = RunStore(f"sqlite:///{db}")
    store.save(*_fast(0), policy=PolicyInfo(), env={})
    store.save(*_fast(1), policy=PolicyInfo(), env={})
    time.sleep(0.3)
    assert not _committed(db, "fast00001")  # control: the writer lingers for more rows
    seen: list[object] = []
    reader = threading.Thread(target=lambda: seen.append(store.get("fast00001")))
    reader.start()
    reader.join(10)
    assert seen and seen[0] is not None, "a read waited out the writer's linger"
    assert _committed(db, "fast00001")
    store.save(*_fast(2), policy=PolicyInfo(), env={})
    time.sleep(0.3)
    assert not _committed(db, "fast00002")
    closer = threading.Thread(target=store.close)
    closer.start()
    closer.join(10)
    assert not closer.is_alive() and _committed(db, "fast00002")


def test_lingering_rows_are_committed_with_no_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process sees a record once its linger is over, or once enough rows wait."""
    db = tmp_path / "runs.db"
    monkeypatch.setattr(SQLiteRunRows, "LINGER_S", 0.3)
    store = RunStore(f"sqlite:///{db}")
    store.save(*_fast(0), policy=PolicyInfo(), env={})
    assert wait_until(lambda: _committed(db, "fast00000"), 10, every_s=0.02)
    monkeypatch.setattr(SQLiteRunRows, "LINGER_S", 3600.0)
    monkeypatch.setattr(SQLiteRunRows, "LINGER_ROWS", 8)
    for i in range(1, 8):
        store.save(*_fast(i), policy=PolicyInfo(), env={})
    time.sleep(0.3)
    assert not _committed(db, "fast00007")  # control: seven rows wait for an eighth
    store.save(*_fast(8), policy=PolicyInfo(), env={})
    assert wait_until(lambda: _committed(db, "fast00008"), 10, every_s=0.02)
    store.close()


def test_rows_saved_after_close_are_written_before_save_returns(tmp_path: Path) -> None:
    """Runs still in flight when a server closes its executor end after the store closed:
    their records are written at once, with no writer left to wait for."""
    db = tmp_path / "runs.db"
    store = RunStore(f"sqlite:///{db}")
    store.save(*_fast(0), policy=PolicyInfo(), env={})
    store.save(*_fast(1), policy=PolicyInfo(), env={})
    store.close()
    assert _committed(db, "fast00001")
    store.save(*_fast(2), policy=PolicyInfo(), env={})
    assert _committed(db, "fast00002")  # read by another connection, nothing settled
    assert store._rows is not None and store._rows._writer is None


def test_without_a_thread_rows_are_written_by_the_caller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "runs.db"
    store = RunStore(f"sqlite:///{db}")
    store.save(*_fast(0), policy=PolicyInfo(), env={})

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    store.save(*_fast(1), policy=PolicyInfo(), env={})
    assert _committed(db, "fast00001")
    assert store.count() == 2  # nothing left waiting for a writer that never started
    store.close()


@pytest.mark.serial
def test_a_locked_database_fails_a_batch_once_not_row_by_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the busy timeout every queued row fails together: retrying row by row would make
    each wait the whole timeout again (and every read wait for all of them)."""
    db = tmp_path / "runs.db"
    store = RunStore(f"sqlite:///{db}")
    store.save(*_fast(0), policy=PolicyInfo(), env={})
    assert store._rows is not None
    rows = store._rows

    def connect() -> sqlite3.Connection:  # the real pragmas, with a 0.3 s busy timeout
        conn = sqlite3.connect(db, timeout=0.3, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout=300")
        return conn

    monkeypatch.setattr(rows, "_connect", connect)
    store.settle()
    rows.close()  # the next writer opens its connection with the short timeout
    with _held(db):
        rows._closed = False
        started = time.monotonic()
        for i in range(1, 30):
            store.save(*_fast(i), policy=PolicyInfo(), env={})
        store.settle()
        took = time.monotonic() - started
    assert took < 3.0, f"the locked batch took {took:.1f} s: failed row by row"
    with pytest.raises(RecordsError, match=r"29 run record\(s\) .*database is locked"):
        store.check()
    store.close()


def test_a_row_sqlite_cannot_take_costs_only_itself(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = RunStore(f"sqlite:///{db}")
    store.save(*_fast(0), policy=PolicyInfo(), env={})
    store.settle()
    with _held(db):  # one batch for the four rows below
        for i in range(1, 5):
            req, res = _fast(i)
            if i == 2:  # a lone surrogate: the request takes it, SQLite's UTF-8 cannot
                req = req.model_copy(update={"profile": "data\udc80"})
            store.save(req, res, policy=PolicyInfo(), env={})
    store.settle()
    assert [_committed(db, f"fast{i:05d}") for i in range(1, 5)] == [True, False, True, True]
    with pytest.raises(RecordsError, match="1 run record"):
        store.check()
    store.close()


def test_reads_wait_but_leave_failures_to_the_next_run(tmp_path: Path) -> None:
    """A failure is raised by `check` (the executor's, before each run), not by whoever reads
    next (on a server, maybe another tenant's request)."""
    db = tmp_path / "runs.db"
    store = RunStore(f"sqlite:///{db}")
    store.save(*_fast(0), policy=PolicyInfo(), env={})
    store.save(*_fast(0), policy=PolicyInfo(), env={})  # its run id is taken
    assert store.get("fast00000") is not None and store.count() == 1
    with pytest.raises(RecordsError):
        store.check()
    store.close()


def test_callers_writing_after_close_keep_the_rows_in_order(tmp_path: Path) -> None:
    """After close, callers write rows themselves, one at a time: a read still waits for every
    row queued before it, also those another caller is writing (tickets end in order)."""
    db = tmp_path / "runs.db"
    store = RunStore(f"sqlite:///{db}")
    store.save(*_fast(0), policy=PolicyInfo(), env={})  # the slow path: no ticket
    store.close()
    rows = store._rows
    assert rows is not None

    def saver(t: int) -> None:
        for i in range(100):
            store.save(*_fast(1 + t * 100 + i), policy=PolicyInfo(), env={})

    threads = [threading.Thread(target=saver, args=(t,)) for t in range(8)]
    conn = sqlite3.connect(db)  # opened ahead: the check must follow `settle` closely
    early = 0
    try:
        for th in threads:
            th.start()
        while any(th.is_alive() for th in threads):
            before = rows._queued  # rows queued so far (their tickets)
            store.settle()
            count = conn.execute("select count(*) from runs").fetchone()[0]
            early += count < before + 1  # and the slow path's row
    finally:
        for th in threads:
            th.join()
        conn.close()
    assert early == 0, f"{early} reads returned before rows saved ahead of them were written"
    assert store.count() == 801


def test_a_write_interrupted_leaves_no_read_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A KeyboardInterrupt while a caller writes its row (after close) fails that row; reads
    and the exit's settle do not wait for it forever."""
    db = tmp_path / "runs.db"
    store = RunStore(f"sqlite:///{db}")
    store.save(*_fast(0), policy=PolicyInfo(), env={})
    store.close()
    rows = store._rows
    assert rows is not None

    def interrupted(*args: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(rows, "_write_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.save(*_fast(1), policy=PolicyInfo(), env={})
    monkeypatch.undo()
    done = threading.Event()
    threading.Thread(target=lambda: (store.settle(), done.set()), daemon=True).start()
    assert done.wait(5), "settle() waits for a row nobody will write"
    with pytest.raises(RecordsError, match="interrupted"):
        store.check()
    store.save(*_fast(2), policy=PolicyInfo(), env={})  # the store goes on
    assert _committed(db, "fast00002")
