"""Run records: every run, allowed or denied, is stored, committed as its result returns.

A record holds what is needed to explain and replay a run: the code and its sha256, the input
files (names, sizes, sha256, and the bytes, deduplicated in a blob table), stdin, language,
profile, policy verdict, the limits that applied, the image digest, and the outcome (status,
exit code, error, metrics, redacted stdout/stderr, artifact metadata; artifact bytes up to a cap).
Secrets in the code, stdin, environment or input files are stored redacted, with keyed
digests of the originals (see `atrest`; the key is `records_key`, kept outside the database).

Storage is SQLAlchemy Core: SQLite by default, a file under the user's data directory in WAL
mode with a busy timeout (safe for concurrent writers: threads of one process and several
processes); any SQLAlchemy URL (PostgreSQL: `postgresql+psycopg://...`) when configured with
`EXECBOX_DB_URL` or `RunStore(url)`. The result cache shares the store (table `cache`).
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import hmac
import json
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, Field
from sqlalchemy.dialects.postgresql import insert as pg_insert

from . import atrest
from .contract import InputFile, RunRequest, RunResult
from .errors import RecordsError, UsageError
from .redact import Redactor

log = logging.getLogger("execbox")

_meta = sa.MetaData()

runs = sa.Table(
    "runs", _meta,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("created_at", sa.Float, nullable=False, index=True),
    sa.Column("kind", sa.String(16), nullable=False),  # run | replay | approval | cache_hit
    # Indexed only where a query looks: each index is one more page written per record.
    sa.Column("source_run_id", sa.String(64)),
    sa.Column("session_id", sa.String(64), index=True),
    sa.Column("language", sa.String(32), nullable=False),
    sa.Column("profile", sa.String(64), nullable=False),
    sa.Column("code", sa.Text, nullable=False),
    sa.Column("code_sha256", sa.String(64), nullable=False),
    sa.Column("stdin_sha256", sa.String(64), nullable=False),
    sa.Column("inputs", sa.JSON, nullable=False),  # [{name, size, sha256}]
    sa.Column("env", sa.JSON, nullable=False),  # values redacted
    sa.Column("policy", sa.JSON, nullable=False),  # {decision, rule, message, line}
    sa.Column("limits", sa.JSON, nullable=False),
    sa.Column("image_digest", sa.String(80), nullable=False),
    sa.Column("status", sa.String(32), nullable=False, index=True),
    sa.Column("result", sa.JSON, nullable=False),  # the RunResult as returned (redacted)
    sa.Column("cache_key", sa.String(64)),
    sa.Column("approved_at", sa.Float),
    sa.Column("approved_by", sa.String(200)),
    sa.Column("sealed", sa.JSON),  # what was redacted before storing (`atrest`), or null
)
# Columns added after the first release: a database made before gets them on opening.
_ADDED_COLUMNS = ("sealed",)

blobs = sa.Table(
    "blobs", _meta,
    sa.Column("sha256", sa.String(64), primary_key=True),
    sa.Column("data", sa.LargeBinary, nullable=False),
)

artifact_blobs = sa.Table(
    "artifact_blobs", _meta,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("path", sa.Text, primary_key=True),
    sa.Column("sha256", sa.String(64), nullable=False),
)

cache = sa.Table(
    "cache", _meta,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False, index=True),
)


_INSERT_RUN = runs.insert()  # one statement object: SQLAlchemy compiles it once


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class PolicyInfo(BaseModel):
    decision: str = "allow"
    rule: str | None = None
    message: str | None = None
    line: int | None = None


class RunRecord(BaseModel):
    """One stored run, as `execbox runs show` prints it."""

    run_id: str
    created_at: float
    kind: str = Field(description="run, replay, approval or cache_hit")
    source_run_id: str | None = None
    session_id: str | None = None
    language: str
    profile: str
    code: str
    code_sha256: str
    stdin_sha256: str
    inputs: list[dict[str, Any]]
    env: dict[str, str]
    policy: PolicyInfo
    limits: dict[str, Any]
    image_digest: str
    status: str
    result: RunResult
    cache_key: str | None = None
    approved_at: float | None = None
    approved_by: str | None = None
    sealed: dict[str, Any] | None = Field(
        None, description="What was redacted before storing (see execbox.atrest), or null")


KEY_BYTES = 32


@functools.lru_cache(maxsize=1)
def records_key() -> bytes:
    """The key of the records' digests of secrets and of the cache's keys, kept outside the
    database so that reading the records is not enough to test guesses of a secret:
    `EXECBOX_RECORDS_KEY` (hex, at least 16 bytes; every machine sharing one database needs the
    same), else `records.key` in the execbox home, made on first use, readable by its owner only."""
    from .image import home

    explicit = os.environ.get("EXECBOX_RECORDS_KEY")
    if explicit is not None:
        try:
            key = bytes.fromhex(explicit)
        except ValueError:
            key = b""
        if len(key) < 16:
            raise UsageError("EXECBOX_RECORDS_KEY must be at least 16 bytes in hex "
                             "(`python3 -c 'import secrets; print(secrets.token_hex(32))'`)")
        return key
    path = home() / "records.key"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        # Written whole under another name, then linked: a process racing this one reads
        # either no file or the whole key, never a part.
        tmp = path.with_name(f".records.key.{os.getpid()}.{threading.get_ident()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(os.urandom(KEY_BYTES))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process made it first: theirs is the key
        finally:
            tmp.unlink()
    key = path.read_bytes()
    if len(key) < 16:
        raise UsageError(f"{path} holds {len(key)} bytes: not a records key; move it away to "
                         "make a new one (records sealed under the old one need it to replay)")
    return key


def default_url() -> str:
    from .image import home

    explicit = os.environ.get("EXECBOX_DB_URL")
    if explicit:
        return explicit
    home().mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home() / 'runs.db'}"


class RunStore:
    """Run records, input blobs and the result cache, in one SQL database."""

    def __init__(self, url: str | None = None, *, artifact_bytes_cap: int = 10 << 20) -> None:
        self.url = url or default_url()
        self.key = records_key()
        self.artifact_bytes_cap = artifact_bytes_cap
        self._stored_blobs: set[str] = set()  # digests committed by this store
        kwargs: dict[str, Any] = {}
        if self.url.startswith("sqlite"):
            kwargs["connect_args"] = {"timeout": 60}
        try:
            self.engine = sa.create_engine(self.url, **kwargs)
        except (sa.exc.ArgumentError, ImportError) as exc:
            raise UsageError(f"bad records database URL {self.url!r}: {exc}") from exc
        self._rows: _SQLiteRunRows | None = None
        if self.engine.dialect.name == "sqlite":
            sa.event.listen(self.engine, "do_connect", _sqlite_connect)
            sa.event.listen(self.engine, "connect", _sqlite_pragmas)
        _meta.create_all(self.engine)
        _add_columns(self.engine)
        database = self.engine.url.database
        if self.engine.dialect.name == "sqlite" and database and database != ":memory:" \
                and not database.startswith("file:") and not self.engine.url.query:
            self._rows = _SQLiteRunRows(os.path.abspath(database))  # plain files only

    def keyed(self, data: bytes) -> str:
        """HMAC-SHA256 of `data` under the records key, in hex."""
        return hmac.new(self.key, data, hashlib.sha256).hexdigest()

    def close(self) -> None:
        """Commit the records still queued (see `_SQLiteRunRows`) and release the database."""
        try:
            if self._rows is not None:
                self._rows.close()
        finally:
            self.engine.dispose()

    def settle(self) -> None:
        """Wait until every record saved so far is committed or has failed (every read of
        the runs does); failures are `check`'s to raise."""
        if self._rows is not None:
            self._rows.settle()

    def check(self) -> None:
        """RecordsError for records that could not be written since the last check (no wait)."""
        if self._rows is not None:
            self._rows.check()

    # ---- writing ----------------------------------------------------------------------------

    def save(self, request: RunRequest, result: RunResult, *, policy: PolicyInfo,
             redactor: Redactor | None = None, env: dict[str, str] | None = None,
             kind: str = "run", source_run_id: str | None = None,
             session_id: str | None = None, cache_key: str | None = None) -> None:
        """Store the run (and its inputs and stdin, for replay) in one transaction, with what
        `redactor` finds in its request redacted (`atrest`); `env`, when given, is stored as
        the environment instead of the request's. On a SQLite file the common case, one run
        row and nothing else new, is queued for the store's writer and committed after this
        returns (see `_SQLiteRunRows`)."""
        stored = atrest.seal(request, redactor, self.keyed) if redactor is not None else \
            atrest.Stored(request, sha256(request.stdin),
                          tuple(sha256(f.data) for f in request.files), None)
        if stored.sealed and "code" in stored.sealed:
            # The original's sha256 would let a reader test guesses of the secret in it.
            result = result.model_copy(update={
                "code_sha256": sha256(stored.request.code.encode("utf-8", "surrogateescape"))})
        sizes = [len(f.data) for f in request.files]
        request = stored.request
        blob_rows = {sha256(f.data): f.data for f in request.files}
        blob_rows[sha256(request.stdin)] = request.stdin
        art_rows = []
        budget = self.artifact_bytes_cap
        for art in result.artifacts:
            if art.data is not None and len(art.data) <= budget:
                budget -= len(art.data)
                digest = sha256(art.data)
                blob_rows[digest] = art.data
                art_rows.append({"run_id": result.run_id, "path": art.path, "sha256": digest})
        row = {
            "run_id": result.run_id,
            "created_at": time.time(),
            "kind": kind,
            "source_run_id": source_run_id,
            "session_id": session_id,
            "language": request.language,
            "profile": request.profile,
            "code": request.code,
            "code_sha256": result.code_sha256,
            "stdin_sha256": stored.stdin_sha256,
            "inputs": [{"name": f.name, "size": size, "sha256": digest} for f, size, digest
                       in zip(request.files, sizes, stored.input_sha256, strict=True)],
            "env": request.env if env is None else env,
            "policy": policy.model_dump(),
            "limits": result.limits.model_dump(),
            "image_digest": result.image_digest,
            "status": result.status.value,
            "cache_key": cache_key,
            "sealed": stored.sealed,
        }
        result_json = result.model_dump_json()
        # Blobs are never deleted: one known to be stored (the empty stdin of nearly every run,
        # say) needs no query.
        new_blobs = {k: v for k, v in blob_rows.items() if k not in self._stored_blobs}
        if self._rows is not None and not new_blobs and not art_rows:
            self._rows.insert(row, result_json)  # the common case: one row, nothing else new
        else:
            row["result"] = json.loads(result_json)
            try:
                with self.engine.begin() as conn:
                    self._put_blobs(conn, new_blobs)
                    conn.execute(_INSERT_RUN, row)
                    if art_rows:
                        conn.execute(artifact_blobs.insert(), art_rows)
            except sa.exc.SQLAlchemyError as exc:
                log.error("records: run %s: %s", result.run_id, exc)
                raise RecordsError(f"the run's record could not be written: {exc}") from exc
        if len(self._stored_blobs) > 100_000:
            self._stored_blobs.clear()
        self._stored_blobs.update(blob_rows)

    def _put_blobs(self, conn: sa.Connection, rows: dict[str, bytes]) -> None:
        if not rows:
            return
        have = set(conn.scalars(sa.select(blobs.c.sha256).where(blobs.c.sha256.in_(list(rows)))))
        # In digest order, so concurrent writers lock shared new rows in one order (no deadlock).
        new = [{"sha256": k, "data": rows[k]} for k in sorted(rows) if k not in have]
        if new and conn.dialect.name == "postgresql":
            # There a concurrent writer's uncommitted row is invisible to the checks below but
            # makes a plain INSERT wait and then fail; ON CONFLICT DO NOTHING waits and skips it.
            conn.execute(pg_insert(blobs).on_conflict_do_nothing(index_elements=[blobs.c.sha256]),
                         new)
        elif new:
            try:
                with conn.begin_nested():
                    conn.execute(blobs.insert(), new)
            except sa.exc.IntegrityError:  # a concurrent writer stored the same content
                for item in new:
                    with conn.begin_nested():
                        exists = conn.scalar(sa.select(blobs.c.sha256)
                                             .where(blobs.c.sha256 == item["sha256"]))
                        if exists is None:
                            conn.execute(blobs.insert().values(**item))

    def mark_approved(self, run_id: str, by: str | None) -> bool:
        """Release a held run once; False when it was not held or already released."""
        self.settle()
        with self.engine.begin() as conn:
            done = conn.execute(
                runs.update()
                .where(runs.c.run_id == run_id, runs.c.status == "needs_approval",
                       runs.c.approved_at.is_(None))
                .values(approved_at=time.time(), approved_by=by)
            )
            return bool(done.rowcount)

    # ---- reading ----------------------------------------------------------------------------

    def get(self, run_id: str) -> RunRecord | None:
        self.settle()
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(runs).where(runs.c.run_id == run_id)).mappings().first()
        return _record(row) if row else None

    def list(self, *, limit: int = 50, status: str | None = None,
             session_id: str | None = None) -> list[RunRecord]:
        self.settle()
        query = sa.select(runs).order_by(runs.c.created_at.desc()).limit(limit)
        if status:
            query = query.where(runs.c.status == status)
        if session_id:
            query = query.where(runs.c.session_id == session_id)
        with self.engine.connect() as conn:
            return [_record(r) for r in conn.execute(query).mappings()]

    def count(self) -> int:
        self.settle()
        with self.engine.connect() as conn:
            return int(conn.scalar(sa.select(sa.func.count()).select_from(runs)) or 0)

    def blob(self, digest: str) -> bytes | None:
        # Blobs (and artifact blobs) are written before their save returns, never queued.
        with self.engine.connect() as conn:
            return conn.scalar(sa.select(blobs.c.data).where(blobs.c.sha256 == digest))

    def artifact_data(self, run_id: str, path: str) -> bytes | None:
        with self.engine.connect() as conn:
            digest = conn.scalar(sa.select(artifact_blobs.c.sha256).where(
                artifact_blobs.c.run_id == run_id, artifact_blobs.c.path == path))
        return self.blob(digest) if digest else None

    def request_of(self, record: RunRecord, secrets: Iterable[str] = ()) -> RunRequest:
        """Rebuild the request of a recorded run (code, inputs, stdin, env, limits, profile).
        A record that kept secrets redacted needs them again (`secrets`): UsageError says
        which parts hold them when they are not given or do not match."""
        sealed = record.sealed or {}
        files = []
        for meta in record.inputs:
            digest = sealed.get("inputs", {}).get(meta["name"], {}).get("blob", meta["sha256"])
            data = self.blob(digest)
            if data is None:
                raise UsageError(f"run {record.run_id}: input {meta['name']!r} is not stored")
            files.append(InputFile(name=meta["name"], data=data))
        stdin = self.blob(sealed.get("stdin", {}).get("blob", record.stdin_sha256))
        if stdin is None:
            raise UsageError(f"run {record.run_id}: stdin is not stored")
        request = RunRequest(language=record.language, code=record.code, stdin=stdin,
                             files=files, limits=record.limits, env=record.env,
                             profile=record.profile)
        if not sealed:
            return request
        return atrest.unseal(record.run_id, sealed, request, self.keyed, secrets)

    def with_artifact_data(self, result: RunResult) -> RunResult:
        """The result with artifact bytes filled in from the store where they were kept."""
        arts = [a.model_copy(update={"data": self.artifact_data(result.run_id, a.path)})
                for a in result.artifacts]
        return result.model_copy(update={"artifacts": arts})

    # ---- cache ------------------------------------------------------------------------------

    def cache_lookup(self, key: str) -> RunRecord | None:
        now = time.time()  # the cache row is written at once; `get` waits for the run's
        with self.engine.connect() as conn:
            run_id = conn.scalar(sa.select(cache.c.run_id).where(cache.c.key == key,
                                                                 cache.c.expires_at > now))
        return self.get(run_id) if run_id else None

    def cache_store(self, key: str, run_id: str, ttl_s: float) -> None:
        now = time.time()
        row = {"key": key, "run_id": run_id, "created_at": now, "expires_at": now + ttl_s}
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":  # concurrent delete+insert of one key collide
                upsert = pg_insert(cache).values(**row)
                conn.execute(upsert.on_conflict_do_update(
                    index_elements=[cache.c.key],
                    set_={c: upsert.excluded[c] for c in ("run_id", "created_at", "expires_at")}))
                return
            conn.execute(cache.delete().where(cache.c.key == key))
            conn.execute(cache.insert().values(**row))

    def cache_purge_expired(self) -> int:
        with self.engine.begin() as conn:
            return int(conn.execute(cache.delete().where(cache.c.expires_at <= time.time()))
                       .rowcount)


# Held around every transaction of the records' writers, and across fork (see below): a child
# forked while a writer is inside a transaction would inherit SQLite's in-process lock state
# (and maybe a mutex held) and hang or fail on its own first write. So an `os.fork` in this
# process waits for a commit in progress: up to the busy timeout on a file another process
# holds locked. (The executor's own processes start with subprocess, which runs no fork
# hooks.) Opening and closing a connection take SQLite's process-wide file mutex too: a
# child forked meanwhile hung in its first `connect`. So every SQLite connection a store
# opens, the writer's and SQLAlchemy's, is a `_ForkSafeConnection`: opened and closed under
# this lock, also when the garbage collector closes it (in whichever thread collects, which
# may hold the lock already: hence reentrant).
_COMMIT_LOCK = threading.RLock()
os.register_at_fork(before=_COMMIT_LOCK.acquire, after_in_parent=_COMMIT_LOCK.release,
                    after_in_child=_COMMIT_LOCK.release)


class _ForkSafeConnection(sqlite3.Connection):
    """A SQLite connection closed only under the fork lock: by `close`, or by `__del__`
    when it is dropped unclosed (SQLite's own finalizer would close it without the lock).
    Open it with `_connect_sqlite`."""

    _lock = _COMMIT_LOCK  # a class attribute: still there while the interpreter exits

    def close(self) -> None:
        with self._lock:
            super().close()

    def __del__(self) -> None:
        self.close()


def _connect_sqlite(*args: Any, **kwargs: Any) -> sqlite3.Connection:
    """sqlite3.connect under the fork lock, to a `_ForkSafeConnection` (which must be closable
    from any thread: the collector's)."""
    params = {**kwargs, "factory": _ForkSafeConnection, "check_same_thread": False}
    with _COMMIT_LOCK:
        conn: sqlite3.Connection = sqlite3.connect(*args, **params)
    return conn


class _SQLiteRunRows:
    """The hot path of `save` on a SQLite file: one run row and nothing else new. The row is
    handed to a writer thread of the store's own, which inserts whatever rows have queued up
    in one transaction (a group commit), with the DB-API on one connection it keeps open.

    So a run's record is committed after its result returns, not before: the insert is
    ~0.1 ms back to back but ~0.4 ms after an idle gap (cold caches), the largest single item
    of a paced run's latency. Once a row is queued the writer lingers for more (LINGER_S,
    LINGER_ROWS), so under load one commit serves many runs. In this process what a caller
    reads stays consistent: every read of the store first waits for the rows queued before
    it (`settle`, which cuts the linger short), and so do `close` and the interpreter's exit;
    another process reading the file sees a record once it is committed. After `close`, and
    when no writer thread can be started, rows are inserted before `insert` returns, as
    before: the caller takes the writer's part (one writer at a time, so batches end in
    ticket order).

    A row that cannot be inserted is logged at once (with its run id) and counted; the next
    `check` raises RecordsError for it, once: the executor checks before each run, so the
    first run to start after the failure is refused before its code runs (one that started
    while the row was still queued or being written runs: up to the busy timeout on a locked
    file). A row whose writing was interrupted (KeyboardInterrupt) counts as failed: no read
    waits for it. A batch that fails for one row's sake (a duplicate run id, a value SQLite
    cannot store) is inserted row by row, so only that row is lost; one that fails for the
    database's (locked past the busy timeout, disk full) fails whole.

    Rows still queued are lost when the process ends without running its exit handlers
    (SIGKILL, a signal's default action, `os._exit`): at most 2 x MAX_QUEUED (the queue and
    the batch being written), normally those of the last LINGER_S; with `synchronous=NORMAL` a
    power loss may lose recent commits anyway. Through SQLAlchemy the same insert cost about
    three times the insert itself (~140 against ~50 us per record); the schema, migrations and
    every other statement stay SQLAlchemy's."""

    MAX_QUEUED = 1024  # rows waiting for the writer; a save beyond this waits for room
    IDLE_S = 10.0  # a writer with nothing to do this long ends (the next insert starts one)
    # Once a row is queued, the writer waits this long for more before it commits (a read,
    # `close`, the exit or LINGER_ROWS queued cut the wait short): a commit per run cost the
    # writer ~0.25 ms of CPU a run under four clients (its wake-up, the GIL, the commit).
    LINGER_S = 0.05
    LINGER_ROWS = 256

    def __init__(self, database: str) -> None:
        self._database = database
        self._columns = [c.name for c in runs.c]
        self._json = frozenset(c.name for c in runs.c if isinstance(c.type, sa.JSON))
        self._sql = (f"INSERT INTO runs ({', '.join(self._columns)}) "
                     f"VALUES ({', '.join('?' * len(self._columns))})")
        with _COMMIT_LOCK:  # a file that cannot be opened fails here, not in the writer
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
        conn = _connect_sqlite(self._database, timeout=60)
        _sqlite_pragmas(conn, None)
        return conn

    def insert(self, row: dict[str, Any], result_json: str) -> None:
        """Queue the row for the writer (waits only while MAX_QUEUED rows are queued). After
        `close`, or when no thread can be started, the row is written before this returns:
        the caller drains the queue itself, or waits for the caller that does."""
        params = [result_json if name == "result"
                  else json.dumps(row.get(name)) if name in self._json else row.get(name)
                  for name in self._columns]
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
        writer = threading.Thread(target=self._drain, args=(self.IDLE_S, True),
                                  name="execbox-records", daemon=True)
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
            raise RecordsError(f"{failed} run record(s) could not be written, the last for "
                               f"this reason: {last} (the log names the runs)")

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
                        cond.wait_for(lambda: len(self._queue) >= self._linger_rows()
                                      or self._stop or self._wanted > self._done,
                                      self.LINGER_S)
                    batch, self._queue = self._queue, []
                    last = self._queued
                    cond.notify_all()  # room for savers that waited
                failures: list[str] | None = None
                try:
                    conn, failures = self._write_batch(conn, batch)
                finally:
                    if failures is None:
                        failures = [f"run {params[0]}: interrupted while it was written"
                                    for params in batch]
                    self._finish(last, failures)
        finally:
            if conn is not None:
                conn.close()  # under the fork lock: a _ForkSafeConnection
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

    def _write_batch(self, conn: sqlite3.Connection | None, batch: list[list[Any]]
                     ) -> tuple[sqlite3.Connection | None, list[str]]:
        """Insert the batch in one transaction; when one of its rows made that fail (which
        rolls back all), row by row, so only such rows are lost; a failure of the database's
        own (locked past the busy timeout, disk full: sqlite3.OperationalError) fails every
        row not yet written at once. Returns (the connection to keep, what failed); never
        raises."""
        written = 0
        failed: list[str] = []
        try:
            with _COMMIT_LOCK:
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


def _settle_quietly(ref: weakref.ref[_SQLiteRunRows]) -> None:
    """At the interpreter's exit: write the rows still queued (the writer is a daemon);
    failures were logged."""
    rows = ref()
    if rows is not None:
        rows.settle()


def _sqlite_connect(_dialect: Any, _record: Any, cargs: tuple[Any, ...],
                    cparams: dict[str, Any]) -> sqlite3.Connection:
    """SQLAlchemy's connect, fork-safe (see `_ForkSafeConnection`)."""
    return _connect_sqlite(*cargs, **cparams)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=60000")
    cur.close()


def _add_columns(engine: sa.Engine) -> None:
    """Add to an existing `runs` table the columns of `_ADDED_COLUMNS` it lacks (nullable)."""
    have = {c["name"] for c in sa.inspect(engine).get_columns("runs")}
    for name in _ADDED_COLUMNS:
        if name in have:
            continue
        column = runs.c[name]
        ddl = f"ALTER TABLE runs ADD COLUMN {name} {column.type.compile(engine.dialect)}"
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(ddl)
        except sa.exc.SQLAlchemyError:  # another process added it first
            again = {c["name"] for c in sa.inspect(engine).get_columns("runs")}
            if name not in again:
                raise


def _record(row: Any) -> RunRecord:
    data = dict(row)
    data["result"] = RunResult.model_validate(data["result"])
    data["policy"] = PolicyInfo.model_validate(data["policy"])
    return RunRecord.model_validate(data)

