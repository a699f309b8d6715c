"""The run store: records, input blobs and the result cache in one SQL database."""

from __future__ import annotations

import builtins
import functools
import hashlib
import hmac
import json
import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, Field
from sqlalchemy.dialects.postgresql import insert as pg_insert

from .. import atrest
from ..contract import InputFile, RunRequest, RunResult
from ..environments import missing_module
from ..errors import RecordsError, UsageError
from ..redact import Redactor
from .schema import INSERT_RUN, add_columns, artifact_blobs, blobs, cache, metadata, runs
from .sqlite import SQLiteRunRows, sqlite_connect, sqlite_pragmas

# (module, run id, created at, image digest): see `RunStore.missing_modules`.
MissingRow = tuple[str, str, float, str]
log = logging.getLogger(__name__)


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
    network: str | list[str] | None = Field(
        None, description="The request's network: 'none' or its allowlist (null: 'none')."
    )
    sealed: dict[str, Any] | None = Field(
        None, description="What was redacted before storing (see execbox.atrest), or null"
    )
    environment: str | None = Field(
        None, description="The environment the run named; null: the executor's default"
    )
    rejected_at: float | None = Field(None, description="When a held run was turned down")
    rejected_by: str | None = Field(None, description="Who turned the held run down")


KEY_BYTES = 32


@functools.lru_cache(maxsize=1)
def records_key() -> bytes:
    """The key of the records' digests of secrets and of the cache's keys, kept outside the
    database so that reading the records is not enough to test guesses of a secret:
    `EXECBOX_RECORDS_KEY` (hex, at least 16 bytes; every machine sharing one database needs the
    same), else `records.key` in the execbox home, made on first use, readable by its owner only."""
    from ..image import home

    explicit = os.environ.get("EXECBOX_RECORDS_KEY")
    if explicit is not None:
        try:
            key = bytes.fromhex(explicit)
        except ValueError:
            key = b""
        if len(key) < 16:
            raise UsageError(
                "EXECBOX_RECORDS_KEY must be at least 16 bytes in hex "
                "(`python3 -c 'import secrets; print(secrets.token_hex(32))'`)"
            )
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
        raise UsageError(
            f"{path} holds {len(key)} bytes: not a records key; move it away to "
            "make a new one (records sealed under the old one need it to replay)"
        )
    return key


def default_url() -> str:
    from ..image import home

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
        self._rows: SQLiteRunRows | None = None
        if self.engine.dialect.name == "sqlite":
            sa.event.listen(self.engine, "do_connect", sqlite_connect)
            sa.event.listen(self.engine, "connect", sqlite_pragmas)
        metadata.create_all(self.engine)
        add_columns(self.engine)
        database = self.engine.url.database
        if (
            self.engine.dialect.name == "sqlite"
            and database
            and database != ":memory:"
            and not database.startswith("file:")
            and not self.engine.url.query
        ):
            self._rows = SQLiteRunRows(os.path.abspath(database))  # plain files only

    def keyed(self, data: bytes) -> str:
        """HMAC-SHA256 of `data` under the records key, in hex."""
        return hmac.new(self.key, data, hashlib.sha256).hexdigest()

    def close(self) -> None:
        """Commit the records still queued (see `SQLiteRunRows`) and release the database."""
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

    def save(
        self,
        request: RunRequest,
        result: RunResult,
        *,
        policy: PolicyInfo,
        redactor: Redactor | None = None,
        env: dict[str, str] | None = None,
        kind: str = "run",
        source_run_id: str | None = None,
        session_id: str | None = None,
        cache_key: str | None = None,
        code: atrest.SealedCode | None = None,
    ) -> None:
        """Store the run (and its inputs and stdin, for replay) in one transaction, with what
        `redactor` finds in its request redacted (`atrest`); `env`, when given, is stored as
        the environment instead of the request's. On a SQLite file the common case, one run
        row and nothing else new, is queued for the store's writer and committed after this
        returns (see `SQLiteRunRows`). `code`: the request's code sealed with `redactor` and
        this store's `keyed` (`atrest.seal_code`), when the caller has it already."""
        stored = (
            atrest.seal(request, redactor, self.keyed, code)
            if redactor is not None
            else atrest.Stored(
                request, sha256(request.stdin), tuple(sha256(f.data) for f in request.files), None
            )
        )
        if stored.sealed and "code" in stored.sealed:
            # The original's sha256 would let a reader test guesses of the secret in it.
            result = result.model_copy(
                update={
                    "code_sha256": sha256(stored.request.code.encode("utf-8", "surrogateescape"))
                }
            )
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
            "inputs": [
                {"name": f.name, "size": size, "sha256": digest}
                for f, size, digest in zip(request.files, sizes, stored.input_sha256, strict=True)
            ],
            "env": request.env if env is None else env,
            "policy": policy.model_dump(),
            "limits": result.limits.model_dump(),
            "image_digest": result.image_digest,
            "status": result.status.value,
            "cache_key": cache_key,
            "sealed": stored.sealed,
            "network": request.network,
            "missing_module": (
                missing_module(result.error.type, result.error.message) if result.error else None
            ),
            "environment": request.environment,
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
                    conn.execute(INSERT_RUN, row)
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
            conn.execute(
                pg_insert(blobs).on_conflict_do_nothing(index_elements=[blobs.c.sha256]), new
            )
        elif new:
            try:
                with conn.begin_nested():
                    conn.execute(blobs.insert(), new)
            except sa.exc.IntegrityError:  # a concurrent writer stored the same content
                for item in new:
                    with conn.begin_nested():
                        exists = conn.scalar(
                            sa.select(blobs.c.sha256).where(blobs.c.sha256 == item["sha256"])
                        )
                        if exists is None:
                            conn.execute(blobs.insert().values(**item))

    def mark_approved(self, run_id: str, by: str | None) -> bool:
        """Release a held run once; False when it was not held or already released."""
        return self._decide(run_id, approved_at=time.time(), approved_by=by)

    def mark_rejected(self, run_id: str, by: str | None) -> bool:
        """Turn a held run down for good; False when it was not held or already decided."""
        return self._decide(run_id, rejected_at=time.time(), rejected_by=by)

    def _decide(self, run_id: str, **decision: Any) -> bool:
        """Record a held run's one decision; False when it was not held or already decided."""
        self.settle()
        with self.engine.begin() as conn:
            done = conn.execute(
                runs.update()
                .where(
                    runs.c.run_id == run_id,
                    runs.c.status == "needs_approval",
                    runs.c.approved_at.is_(None),
                    runs.c.rejected_at.is_(None),
                )
                .values(**decision)
            )
            return bool(done.rowcount)

    # ---- reading ----------------------------------------------------------------------------

    def get(self, run_id: str) -> RunRecord | None:
        self.settle()
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(runs).where(runs.c.run_id == run_id)).mappings().first()
        return _record(row) if row else None

    def list(
        self,
        *,
        limit: int = 50,
        status: str | None = None,
        session_id: str | None = None,
        offset: int = 0,
        language: str | None = None,
        profile: str | None = None,
        environment: str | None = None,
        since: float | None = None,
        until: float | None = None,
        code_contains: str | None = None,
        within: sa.Select[Any] | None = None,
        oldest_first: bool = False,
        source_run_id: str | None = None,
    ) -> builtins.list[RunRecord]:
        """Records, newest first (`oldest_first`: a session's cells in order), that match
        every filter given; `within`: a query of the run ids to look among (a tenant's)."""
        self.settle()
        order = runs.c.created_at.asc() if oldest_first else runs.c.created_at.desc()
        query = sa.select(runs).order_by(order).limit(limit).offset(offset)
        for column, value in (
            (runs.c.status, status),
            (runs.c.session_id, session_id),
            (runs.c.language, language),
            (runs.c.profile, profile),
            (runs.c.environment, environment),
            (runs.c.source_run_id, source_run_id),
        ):
            if value:
                query = query.where(column == value)
        if since is not None:
            query = query.where(runs.c.created_at >= since)
        if until is not None:
            query = query.where(runs.c.created_at < until)
        if code_contains:
            query = query.where(runs.c.code.contains(code_contains, autoescape=True))
        if within is not None:
            query = query.where(runs.c.run_id.in_(within))
        with self.engine.connect() as conn:
            return [_record(r) for r in conn.execute(query).mappings()]

    def missing_modules(self, since: float | None = None) -> builtins.list[MissingRow]:
        """(module, run id, created at, image digest) of the runs whose code imported a module
        its environment lacked, newest first (`execbox env requests`)."""
        self.settle()
        c = runs.c
        query = (
            sa.select(c.missing_module, c.run_id, c.created_at, c.image_digest)
            .where(c.missing_module.is_not(None))
            .order_by(c.created_at.desc())
        )
        if since is not None:
            query = query.where(c.created_at >= since)
        with self.engine.connect() as conn:
            return [(r[0], r[1], float(r[2]), r[3]) for r in conn.execute(query)]

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
            digest = conn.scalar(
                sa.select(artifact_blobs.c.sha256).where(
                    artifact_blobs.c.run_id == run_id, artifact_blobs.c.path == path
                )
            )
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
        request = RunRequest(
            language=record.language,
            code=record.code,
            stdin=stdin,
            files=files,
            limits=record.limits,
            env=record.env,
            profile=record.profile,
            network=record.network or "none",
            environment=record.environment,
        )
        if not sealed:
            return request
        return atrest.unseal(record.run_id, sealed, request, self.keyed, secrets)

    def with_artifact_data(self, result: RunResult) -> RunResult:
        """The result with artifact bytes filled in from the store where they were kept."""
        arts = [
            a.model_copy(update={"data": self.artifact_data(result.run_id, a.path)})
            for a in result.artifacts
        ]
        return result.model_copy(update={"artifacts": arts})

    # ---- cache ------------------------------------------------------------------------------

    def cache_lookup(self, key: str) -> RunRecord | None:
        now = time.time()  # the cache row is written at once; `get` waits for the run's
        with self.engine.connect() as conn:
            run_id = conn.scalar(
                sa.select(cache.c.run_id).where(cache.c.key == key, cache.c.expires_at > now)
            )
        return self.get(run_id) if run_id else None

    def cache_store(self, key: str, run_id: str, ttl_s: float) -> None:
        now = time.time()
        row = {"key": key, "run_id": run_id, "created_at": now, "expires_at": now + ttl_s}
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":  # concurrent delete+insert of one key collide
                upsert = pg_insert(cache).values(**row)
                conn.execute(
                    upsert.on_conflict_do_update(
                        index_elements=[cache.c.key],
                        set_={
                            c: upsert.excluded[c] for c in ("run_id", "created_at", "expires_at")
                        },
                    )
                )
                return
            conn.execute(cache.delete().where(cache.c.key == key))
            conn.execute(cache.insert().values(**row))

    def cache_purge_expired(self) -> int:
        with self.engine.begin() as conn:
            return int(
                conn.execute(cache.delete().where(cache.c.expires_at <= time.time())).rowcount
            )


def _record(row: Any) -> RunRecord:
    data = dict(row)
    data["result"] = RunResult.model_validate(data["result"])
    data["policy"] = PolicyInfo.model_validate(data["policy"])
    return RunRecord.model_validate(data)
