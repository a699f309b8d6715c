"""The records' SQLite writer: run rows committed in groups by a thread of the store's own, on
fork-safe connections."""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import sqlite3
import threading
import weakref
from typing import Any

import sqlalchemy as sa

from ..errors import RecordsError
from .schema import runs

log = logging.getLogger(__name__)


# Held around every transaction of the records' writers, and across fork (see below): a child
# forked while a writer is inside a transaction would inherit SQLite's in-process lock state
# (and maybe a mutex held) and hang or fail on its own first write. So an `os.fork` in this
# process waits for a commit in progress: up to the busy timeout on a file another process
# holds locked. (The executor's own processes start with subprocess, which runs no fork
# hooks.) Opening and closing a connection take SQLite's process-wide file mutex too: a
# child forked meanwhile hung in its first `connect`. So every SQLite connection a store
# opens, the writer's and SQLAlchemy's, is a `ForkSafeConnection`: opened and closed under
# this lock, also when the garbage collector closes it (in whichever thread collects, which
# may hold the lock already: hence reentrant).
COMMIT_LOCK = threading.RLock()
os.register_at_fork(
    before=COMMIT_LOCK.acquire,
    after_in_parent=COMMIT_LOCK.release,
    after_in_child=COMMIT_LOCK.release,
)


class ForkSafeConnection(sqlite3.Connection):
    """A SQLite connection closed only under the fork lock: by `close`, or by `__del__`
    when it is dropped unclosed (SQLite's own finalizer would close it without the lock).
    Open it with `connect_sqlite`."""

    _lock = COMMIT_LOCK  # a class attribute: still there while the interpreter exits

    def close(self) -> None:
        with self._lock:
            super().close()

    def __del__(self) -> None:
        self.close()


def connect_sqlite(*args: Any, **kwargs: Any) -> sqlite3.Connection:
    """sqlite3.connect under the fork lock, to a `ForkSafeConnection` (which must be closable
    from any thread: the collector's)."""
    params = {**kwargs, "factory": ForkSafeConnection, "check_same_thread": False}
    with COMMIT_LOCK:
        conn: sqlite3.Connection = sqlite3.connect(*args, **params)
    return conn


class SQLiteRunRows:
    """The hot path of `save` on a SQLite file: one run row, inserted by a writer thread that
    commits whatever rows have queued in one transaction (a group commit) on a connection it
    keeps open, so a record is committed just after its result returns.

    Reads stay consistent in this process: every read of the store, `close` and the
    interpreter's exit first wait for the rows queued before them (`settle`). After `close`,
    or when no writer thread can start, the caller inserts its row itself. A row that cannot
    be inserted is logged with its run id and makes the next `check` raise RecordsError once
    (the executor checks before each run); a batch failing for one row's sake is retried row
    by row. Rows still queued are lost if the process dies without its exit handlers
    (SIGKILL, `os._exit`): at most 2 x MAX_QUEUED. Measurements: docs/PERFORMANCE.md."""

    MAX_QUEUED = 1024  # rows waiting for the writer; a save beyond this waits for room
    IDLE_S = 10.0  # a writer with nothing to do this long ends (the next insert starts one)
    # Once a row is queued, the writer waits this long for more before it commits (a read,
    # `close`, the exit or LINGER_ROWS queued cut the wait short): fewer commits under load.
    LINGER_S = 0.05
    LINGER_ROWS = 256

    def __init__(self, database: str) -> None:
        self._database = database
        self._columns = [c.name for c in runs.c]
        self._json = frozenset(c.name for c in runs.c if isinstance(c.type, sa.JSON))
        self._sql = (
            f"INSERT INTO runs ({', '.join(self._columns)}) "
            f"VALUES ({', '.join('?' * len(self._columns))})"
        )
        with COMMIT_LOCK:  # a file that cannot be opened fails here, not in the writer
            self._connect().close()
        self._start_state()
        # A plain function holding the rows weakly: the hook must not keep them alive.
        atexit.register(functools.partial(_settle_quietly, weakref.ref(self)))

    def _start_state(self) -> None:
        """Queue, writer and lock of this process (a fork's child starts its own: the parent's
        writer and lock are not the child's, and the parent commits its own queued rows)."""
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._queue: list[list[Any]] = []
        self._queued = 0  # rows ever queued here; the first _done of them are written or failed
        self._done = 0
        self._wanted = 0  # a reader waits for the rows up to this ticket: no lingering
        # Who writes the queue: the writer thread, or a caller after `close` or when no thread
        # could be started. At most one at a time, so batches end in ticket order.
        self._writer: threading.Thread | None = None
        self._thread: threading.Thread | None = None  # the last writer thread started
        self._stop = False
        self._closed = False
        self._failed = 0  # rows that could not be inserted since the last check
        self._last_failure = ""

    def _state(self) -> threading.Condition:
        if self._pid != os.getpid():
            self._start_state()
        return self._cond

    def _connect(self) -> sqlite3.Connection:
        conn = connect_sqlite(self._database, timeout=60)
        sqlite_pragmas(conn, None)
        return conn

    def insert(self, row: dict[str, Any], result_json: str) -> None:
        """Queue the row for the writer (waits only while MAX_QUEUED rows are queued). After
        `close`, or when no thread can be started, the row is written before this returns:
        the caller drains the queue itself, or waits for the caller that does."""
        params = [
            result_json
            if name == "result"
            else json.dumps(row.get(name))
            if name in self._json
            else row.get(name)
            for name in self._columns
        ]
        cond = self._state()
        with cond:
            while len(self._queue) >= self.MAX_QUEUED and self._writer is not None:
                cond.wait()
            self._queue.append(params)
            self._queued += 1
            ticket = self._queued
            drain = False
            if self._writer is None:
                if not self._closed and self._start_writer():
                    return
                # Closed (a run that ends after `close` is still recorded) or no thread: this
                # caller is the writer, one at a time, so rows are still written in order.
                self._writer, drain = threading.current_thread(), True
            elif not self._closed:
                # The writer waits for a first row, or lingers until enough are queued.
                if len(self._queue) == 1 or len(self._queue) >= self._linger_rows():
                    cond.notify_all()
                return
        if drain:
            self._drain(0.0)
        with cond:  # written by this caller or by the one draining: wait for this row
            while self._done < ticket:
                cond.wait()

    def _linger_rows(self) -> int:
        return min(self.LINGER_ROWS, self.MAX_QUEUED)

    def _start_writer(self) -> bool:
        """Start the writer thread (the lock is held); False when no thread can be had."""
        writer = threading.Thread(
            target=self._drain, args=(self.IDLE_S, True), name="execbox-records", daemon=True
        )
        self._stop, self._writer = False, writer
        try:
            writer.start()
        except RuntimeError as exc:
            self._writer = None
            log.warning("records: no writer thread (%s); the caller writes its row", exc)
            return False
        except BaseException:  # interrupted: the rows queued are failed, not left hanging
            self._writer = None
            self._fail_queued("interrupted before it was written")
            raise
        self._thread = writer
        return True

    def _fail_queued(self, why: str) -> None:
        """Count every queued row as failed (the lock is held)."""
        batch, self._queue = self._queue, []
        failures = [f"run {params[0]}: {why}" for params in batch]
        _log_failures(failures)
        self._end(self._queued, failures)

    def settle(self) -> None:
        """Wait until every row queued before this call is written or has failed. Raises
        nothing: failures are the next `check`'s."""
        cond = self._state()
        with cond:
            wanted = self._queued
            if self._done < wanted:
                self._wanted = max(self._wanted, wanted)
                cond.notify_all()  # a lingering writer commits now
            while self._done < wanted:
                cond.wait()

    def check(self) -> None:
        """Raise RecordsError once for the rows that could not be inserted since the last
        check (their run ids are in the log, not in the message: the next caller may be
        another tenant)."""
        with self._state():
            failed, self._failed = self._failed, 0
            last = self._last_failure
        if failed:
            raise RecordsError(
                f"{failed} run record(s) could not be written, the last for "
                f"this reason: {last} (the log names the runs)"
            )

    def _drain(self, idle_s: float, linger: bool = False) -> None:
        """Write what is queued, batch by batch, until the queue has stayed empty for
        `idle_s` or the store is stopping; the writer's loop (this thread is `_writer`). With
        `linger`, a batch waits up to LINGER_S after its first row for more, unless a reader
        waits (`settle`), the store stops or LINGER_ROWS are queued. A batch interrupted
        before it was written counts as failed, and rows still queued when the loop ends by
        an error are failed too: no ticket is left that nobody will end."""
        cond, conn = self._cond, None
        try:
            while True:
                with cond:
                    cond.wait_for(lambda: self._queue or self._stop, idle_s)
                    if not self._queue:  # idle or stopping, and all is written
                        self._writer = None
                        cond.notify_all()
                        return
                    if linger:
                        cond.wait_for(
                            lambda: (
                                len(self._queue) >= self._linger_rows()
                                or self._stop
                                or self._wanted > self._done
                            ),
                            self.LINGER_S,
                        )
                    batch, self._queue = self._queue, []
                    last = self._queued
                    cond.notify_all()  # room for savers that waited
                failures: list[str] | None = None
                try:
                    conn, failures = self._write_batch(conn, batch)
                finally:
                    if failures is None:
                        failures = [
                            f"run {params[0]}: interrupted while it was written" for params in batch
                        ]
                    self._finish(last, failures)
        finally:
            if conn is not None:
                conn.close()  # under the fork lock: a ForkSafeConnection
            with cond:
                if self._writer is threading.current_thread():  # ended by an error
                    self._writer = None
                    self._fail_queued("its writer ended by an error")

    def _finish(self, last: int, failures: list[str]) -> None:
        _log_failures(failures)  # not under the lock: savers need not wait for the log
        with self._cond:
            self._end(last, failures)

    def _end(self, last: int, failures: list[str]) -> None:
        """The rows up to ticket `last` are written, but for `failures` ("run <id>: <why>"),
        counted for `check` (the lock is held; batches end in ticket order: one writer at a
        time)."""
        if failures:
            self._failed += len(failures)
            self._last_failure = failures[-1].split(": ", 1)[-1]
        self._done = last
        self._cond.notify_all()

    def _write_batch(
        self, conn: sqlite3.Connection | None, batch: list[list[Any]]
    ) -> tuple[sqlite3.Connection | None, list[str]]:
        """Insert the batch in one transaction; when one of its rows made that fail (which
        rolls back all), row by row, so only such rows are lost; a failure of the database's
        own (locked past the busy timeout, disk full: sqlite3.OperationalError) fails every
        row not yet written at once. Returns (the connection to keep, what failed); never
        raises."""
        written = 0
        failed: list[str] = []
        try:
            with COMMIT_LOCK:
                conn = conn or self._connect()
                try:
                    with conn:  # commits, or rolls back when an insert failed
                        conn.executemany(self._sql, batch)
                    return conn, failed
                except sqlite3.OperationalError:
                    raise
                except Exception as exc:  # noqa: BLE001 - a row's: find which
                    if len(batch) == 1:
                        return conn, [f"run {batch[0][0]}: {exc}"]
                for params in batch:
                    try:
                        with conn:
                            conn.execute(self._sql, params)
                    except sqlite3.OperationalError:
                        raise
                    except Exception as exc:  # noqa: BLE001
                        failed.append(f"run {params[0]}: {exc}")
                    written += 1
                return conn, failed
        except Exception as exc:  # noqa: BLE001 - reported, never lost in a thread
            if conn is not None:
                conn.close()
            return None, failed + [f"run {params[0]}: {exc}" for params in batch[written:]]

    def close(self) -> None:
        """Write what is queued and stop the writer; rows inserted later are written at once.
        Raises RecordsError for rows that failed since the last check."""
        cond = self._state()
        with cond:
            self._stop = self._closed = True
            cond.notify_all()
            thread = self._thread
            # The writer thread, or a caller writing rows itself, ends once the queue is empty.
            while self._writer is not None and self._writer is not threading.current_thread():
                cond.wait()
        if thread is not None and thread is not threading.current_thread():
            thread.join()  # it has left its loop: only its connection is still to close
        self.check()


def _log_failures(failures: list[str]) -> None:
    for what in failures:
        log.error("records: %s", what)


def _settle_quietly(ref: weakref.ref[SQLiteRunRows]) -> None:
    """At the interpreter's exit: write the rows still queued (the writer is a daemon);
    failures were logged."""
    rows = ref()
    if rows is not None:
        rows.settle()


def sqlite_connect(
    _dialect: Any, _record: Any, cargs: tuple[Any, ...], cparams: dict[str, Any]
) -> sqlite3.Connection:
    """SQLAlchemy's connect, fork-safe (see `ForkSafeConnection`)."""
    return connect_sqlite(*cargs, **cparams)


def sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=60000")
    cur.close()
