"""The pipeline every run goes through, and the long-lived `Executor` that owns the sandbox:

    request -> policy -> budget -> cache -> sandbox -> redact -> record -> result

Every run is recorded, allowed or not; the record is committed as its result returns (see
`records`), and the first run to start after a record could not be written is refused. What
the code did is data on the result; only caller and host problems raise (see `errors`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import re
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from . import atrest
from . import policy as policy_mod
from .budget import Budget, Reservation
from .cache import DEFAULT_TTL_S, cache_key, cacheable
from .contract import (
    MIB,
    Artifact,
    ErrorInfo,
    Limits,
    Metrics,
    Output,
    RunRequest,
    RunResult,
    Status,
    StreamEvent,
)
from .errors import Overloaded, SandboxError, SandboxUnavailable, SessionClosed, UsageError
from .hosts import (
    DEFAULT_ROTATE_AFTER_RUNS,
    DEFAULT_ROTATE_AFTER_S,
    DEFAULT_TENANT_IDLE_S,
    Hosts,
)
from .image import LIGHT_PRELOAD, Image
from .records import PolicyInfo, RunStore
from .redact import Redactor, checked_secrets
from .redact_live import LiveRedactor
from .sandbox import capabilities
from .sandbox.channel import SessionChannel, SessionEnded
from .sandbox.host import Cancel as Cancel  # re-exported: execbox.Cancel
from .sandbox.host import HostError, OutputCallback, RawRun, RunNotStarted, ZygoteProcess
from .sandbox.runner import CUT_HEAD, CUT_TAIL, compile_error_record
from .sessions import DEFAULT_IDLE_TIMEOUT_S, DEFAULT_MAX_LIFETIME_S, Reaper, Session

log = logging.getLogger("execbox")

FileSource = bytes | str | os.PathLike[str]
BACKSTOP_GRACE_S = 15.0  # the supervisor enforces limits; this only catches a stuck supervisor
CANCEL_CHECK_S = 0.1  # how often a cancellable run waiting for its turn looks at its token
SIGNAL_CHECK_S = 0.2  # how often a `map` consumer waiting for results runs signal handlers
SLOT_WAIT_S = 30.0  # how long a run waits for a staged slot before it is a sandbox_error
# How many staged programs a request may find gone before its code (killed from outside: the
# machine's OOM killer, an operator) before it is a sandbox_error; none of them ran any of it.
NOT_STARTED_TRIES = 3
T = TypeVar("T")
A = TypeVar("A")


def new_run_id() -> str:
    return uuid.uuid4().hex


def make_request(code: str | bytes, *, language: str = "python", stdin: bytes | str | None = None,
                 files: Mapping[str, FileSource] | None = None,
                 limits: Limits | Mapping[str, Any] | None = None,
                 env: Mapping[str, str] | None = None, profile: str = "data") -> RunRequest:
    """Build and validate a RunRequest; UsageError says what is wrong. `code` given as bytes is
    decoded as CPython decodes a source file (see `RunRequest`)."""
    inputs = []
    for name, source in (files or {}).items():
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = bytes(source)
        else:
            try:
                data = Path(source).read_bytes()
            except OSError as exc:
                raise UsageError(f"cannot read input file {name!r} from {source}: {exc}") from exc
        inputs.append({"name": name, "data": data})
    try:
        return RunRequest.model_validate({
            "language": language, "code": code,
            "stdin": stdin.encode() if isinstance(stdin, str) else (stdin or b""), "files": inputs,
            "limits": limits if limits is not None else Limits(), "env": dict(env or {}),
            "profile": profile,
        })
    except ValidationError as exc:
        raise UsageError(str(exc)) from exc


class Executor:
    """Runs code in the sandbox. Thread-safe; start once, run many times, close at the end.

    Construction starts the fork servers and returns once standard-library code can run (a
    fifth of a second); the one that pre-imports numpy, pandas and matplotlib keeps starting in
    the background (about a second), and runs and sessions that need it wait for it. It raises
    SandboxUnavailable when this host cannot isolate runs; there is no unsandboxed fallback.
    """

    def __init__(self, *, image: Image | None = None, max_concurrency: int | None = None,
                 pool_size: int | None = None, max_queue: int = 1024,
                 queue_timeout_s: float = 300.0,
                 profiles: Path | Mapping[str, policy_mod.Profile] | None = None,
                 records: RunStore | str | None = None, cache: bool = True,
                 cache_ttl_s: float = DEFAULT_TTL_S, secrets: Iterable[str] = (),
                 max_sessions: int = 16,
                 rotate_after_runs: int | None = DEFAULT_ROTATE_AFTER_RUNS,
                 rotate_after_s: float | None = DEFAULT_ROTATE_AFTER_S,
                 zygotes_per_tenant: bool = False,
                 tenant_idle_s: float = DEFAULT_TENANT_IDLE_S) -> None:
        """`profiles`: a TOML file or loaded profiles (default: the shipped ones, or the file in
        EXECBOX_PROFILES). `records`: a RunStore or database URL (default: SQLite under the
        data directory). `cache`: whether runs use the result cache unless a call says
        otherwise. `secrets`: values redacted from every result and record.
        Concurrency: at most `max_concurrency` runs at once, `pool_size` slots of each kind
        (light: standard library only; heavy: the data stack imported; pandas: the same, its
        program readied for pandas' use) staged ahead;
        at most `max_queue` callers wait for a turn, each at most `queue_timeout_s`; past
        either, `run` raises `Overloaded` instead of queueing without bound. At most
        `max_sessions` sessions are open at once.
        Memory layout: the sandbox host (its zygotes, whose layout every run shares) is
        replaced in the background after `rotate_after_runs` runs and sessions or
        `rotate_after_s` seconds from its start once it has served one, whichever comes
        first (0 or None: never); runs and sessions in flight keep their host. `zygotes_per_tenant`: each `tenant=` of `run` and `session`
        gets a host of its own (None: the shared one), started at its first run and closed
        after `tenant_idle_s` seconds unused. A bad value of any of these is a UsageError."""
        for name, value, least in (("max_concurrency", max_concurrency, 1),
                                   ("pool_size", pool_size, 1)):
            if value is not None:
                _whole(name, value, least)
        _whole("max_queue", max_queue, 0)
        _whole("max_sessions", max_sessions, 0)
        if rotate_after_runs is not None:
            _whole("rotate_after_runs", rotate_after_runs, 0)
        for name, seconds in (("rotate_after_s", rotate_after_s),
                              ("tenant_idle_s", tenant_idle_s)):
            if seconds is not None and (
                    isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                    or not 0 <= seconds < float("inf")):
                raise UsageError(f"{name} must be a number of seconds >= 0, got {seconds!r}")
        if not isinstance(zygotes_per_tenant, bool):
            raise UsageError(f"zygotes_per_tenant must be True or False, got "
                             f"{zygotes_per_tenant!r}")
        if zygotes_per_tenant and not tenant_idle_s:
            raise UsageError("tenant_idle_s must be > 0 with zygotes_per_tenant")
        if (isinstance(queue_timeout_s, bool) or not isinstance(queue_timeout_s, (int, float))
                or not 0 <= queue_timeout_s < float("inf")):
            raise UsageError(f"queue_timeout_s must be a number of seconds >= 0, got "
                             f"{queue_timeout_s!r}")
        self.profiles = (dict(profiles) if isinstance(profiles, Mapping)
                         else policy_mod.load_profiles(profiles))
        self.store = records if isinstance(records, RunStore) else RunStore(records)
        self.cache_enabled = cache
        self.cache_ttl_s = cache_ttl_s
        self._redactor = Redactor(secrets)
        if os.geteuid() != 0:
            raise SandboxUnavailable(
                "the default isolation tier needs root (namespaces, mounts, cgroups); "
                "run as root, and see `execbox doctor`"
            )
        unprivileged = capabilities.unavailable_reason()
        if unprivileged:  # else the first run fails on a bare EPERM deep in the set-up
            raise SandboxUnavailable(f"{unprivileged}; see `execbox doctor`")
        self.image = image or Image.load()
        self.max_concurrency = max_concurrency or 4 * (os.cpu_count() or 1)
        self.pool_size = max(1, pool_size or min(self.max_concurrency, 2 * (os.cpu_count() or 1)))
        self._admission = _Admission(self.max_concurrency, max_queue, queue_timeout_s)
        self._lock = threading.Lock()
        self._closed = False
        self._hosts = Hosts(self._start_host, rotate_after_runs=rotate_after_runs,
                            rotate_after_s=rotate_after_s, per_tenant=zygotes_per_tenant,
                            tenant_idle_s=tenant_idle_s)
        try:
            # A host per tenant starts at the tenant's first run; the shared one starts now,
            # so that a host that cannot sandbox says so here.
            info = {} if zygotes_per_tenant else self._hosts.get(None).info
        except BaseException:
            self._hosts.close()
            raise
        self.max_sessions = max_sessions
        self._sessions: dict[str, Session] = {}
        self._reaper = Reaper(self)
        log.info("execbox executor ready: image %s, cgroup v%s, concurrency %d, zygote %s ms, "
                 "hosts %s, replaced after %s runs or %s s",
                 self.image.digest, info.get("cgroup_version", "?"), self.max_concurrency,
                 info.get("startup_ms", "?"), "per tenant" if zygotes_per_tenant else "shared",
                 rotate_after_runs or "no", rotate_after_s or "no")

    def _start_host(self) -> ZygoteProcess:
        try:
            return ZygoteProcess(self.image.python, self.image.zygote_env(), self.image.ro_paths,
                                 self.image.libexec, list(self.image.preload), list(LIGHT_PRELOAD),
                                 pool_size=self.pool_size)
        except HostError as exc:
            raise SandboxUnavailable(f"{exc}; see `execbox doctor`") from exc

    def _live_host(self, tenant: str | None = None) -> ZygoteProcess:
        if self._closed:
            raise UsageError("this Executor is closed")
        return self._hosts.get(tenant)

    @property
    def _host(self) -> ZygoteProcess:
        """The shared host serving now (started if need be)."""
        return self._live_host()

    def run(self, code: str | bytes, *, language: str = "python", stdin: bytes | str | None = None,
            files: Mapping[str, FileSource] | None = None,
            limits: Limits | Mapping[str, Any] | None = None,
            env: Mapping[str, str] | None = None, profile: str = "data",
            cache: bool | None = None, budget: Budget | None = None,
            secrets: Iterable[str] = (), session_id: str | None = None,
            on_stdout: OutputCallback | None = None,
            on_stderr: OutputCallback | None = None,
            cancel: Cancel | None = None, tenant: str | None = None) -> RunResult:
        """Run `code` in a fresh sandbox and return its result (never raises for the code).
        `code` may be the bytes of a source file: bytes that do not decode are its SyntaxError.

        `limits` fields you set override the profile's defaults (within its maximums).
        `cache=False` skips the result cache; `budget` is shared across calls; `secrets` are
        redacted from this run's output, errors and record. `cancel` (an `execbox.Cancel`)
        lets another thread end the run: its result is then an `error` of type Cancelled.
        `tenant`: whose host runs it, with `zygotes_per_tenant` (else all share one)."""
        request = make_request(code, language=language, stdin=stdin, files=files,
                               limits=limits, env=env, profile=profile)
        return self.run_request(request, cache=cache, budget=budget, secrets=secrets,
                                session_id=session_id, on_stdout=on_stdout, on_stderr=on_stderr,
                                cancel=cancel, tenant=tenant)

    def run_request(self, request: RunRequest, *, cache: bool | None = None,
                    budget: Budget | None = None, secrets: Iterable[str] = (),
                    session_id: str | None = None,
                    on_stdout: OutputCallback | None = None,
                    on_stderr: OutputCallback | None = None,
                    _kind: str = "run", _source: str | None = None,
                    _approved: bool = False, _session: Session | None = None,
                    cache_scope: str | None = None, cancel: Cancel | None = None,
                    spool_dir: str | None = None,
                    tenant: str | None = None) -> RunResult:
        """The whole pipeline for one request (or one cell of `_session`). `cache_scope`
        partitions the result cache (the HTTP server passes the tenant); `tenant` picks the
        host with `zygotes_per_tenant`. With `spool_dir` (an existing private directory; runs,
        not cells), the run's artifacts are written to `<spool_dir>/<index in
        result.artifacts>` as they arrive, and only those the record store keeps have their
        `data` in memory; the caller removes the files."""
        self.store.check()  # refused when a record failed since the last check (see `records`)
        # A cell's are the session's and the cell's own, each checked where it was given.
        secrets = tuple(secrets) if _session is not None else checked_secrets(secrets)
        run_id = new_run_id()
        redactor = self._redactor.with_secrets(secrets)
        verdict = policy_mod.check(request, self.profiles,
                                   cell=_session.policy_context if _session else None)
        request = request.model_copy(update={"limits": verdict.limits})
        pinfo = PolicyInfo(decision=verdict.decision, rule=verdict.rule,
                           message=redactor.redact(verdict.message) if verdict.message
                           else verdict.message, line=verdict.line)
        base = RunResult(
            run_id=run_id, status=Status.sandbox_error, limits=request.limits,
            code_sha256=atrest.code_sha256(request.code, redactor),
            image_digest=self.image.digest, session_id=session_id,
        )

        def finish(result: RunResult, **extra: Any) -> RunResult:
            self.store.save(request, result, policy=pinfo, session_id=session_id,
                            redactor=redactor, kind=extra.pop("kind", _kind), source_run_id=extra.pop("source", _source),
                            **extra)
            log.info("run %s: %s (%s)", result.run_id, result.status.value, _kind)
            return result

        if verdict.decision == "deny" or (verdict.decision == "needs_approval" and not _approved):
            held = verdict.decision == "needs_approval"
            message = verdict.message or "denied by policy"
            if held and _session is not None:
                message += "; a session cell cannot be approved later: run it as a run instead"
            elif held:
                message += f"; approve it with executor.approve({run_id!r}) or `execbox runs approve`"
            # The policy's message quotes the code (a module's name, say): scrubbed like output.
            return finish(_redact(base.model_copy(update={
                "status": Status.needs_approval if held else Status.policy_denied,
                "error": ErrorInfo(type="NeedsApproval" if held else "PolicyDenied",
                                   message=message, line=verdict.line, rule=verdict.rule),
            }), redactor))

        if request.source_error is not None:  # CPython runs nothing of it: no sandbox either
            result = _redact(_undecodable(base, request.source_error), redactor)
            if on_stderr is not None:
                on_stderr(result.stderr.encode())
            return finish(result)

        reservation: Reservation | None = None
        if budget is not None:
            reserved = budget.reserve(request.limits)
            if isinstance(reserved, str):
                return finish(base.model_copy(update={
                    "status": Status.budget_exceeded,
                    "error": ErrorInfo(type="BudgetExceeded", message=reserved),
                }))
            reservation = reserved
            request = request.model_copy(update={"limits": reservation.limits})
            base = base.model_copy(update={"limits": reservation.limits})

        use_cache = (self.cache_enabled if cache is None else cache) and _session is None
        key = (cache_key(request, self.image.digest, cache_scope, self.store.key,
                         redactor.secrets) if use_cache else None)
        with _live_output(redactor, on_stdout, on_stderr) as (on_stdout, on_stderr):
            if key is not None:
                hit = self.store.cache_lookup(key)
                if hit is not None:
                    if budget is not None and reservation is not None:
                        budget.settle(reservation, 0.0, 0)
                    # Redacted again: this caller's secrets may not be the first caller's.
                    result = _redact(self.store.with_artifact_data(hit.result), redactor)
                    result = result.model_copy(update={
                        "run_id": run_id, "cached": True, "code_sha256": base.code_sha256})
                    # Streaming callers see the stored output as if it had just been printed.
                    for callback, text in ((on_stdout, result.stdout),
                                           (on_stderr, result.stderr)):
                        if callback is not None and text:
                            callback(text.encode())
                    return finish(result, kind="cache_hit", source=hit.run_id, cache_key=key)

            if _session is not None:
                result = self._cell_run(_session, request, base, on_stdout, on_stderr)
            else:
                result = self._sandbox_run(request, base, on_stdout, on_stderr,
                                           program_kind(verdict.imports), cancel, spool_dir,
                                           tenant)
                if spool_dir is not None:
                    result = _with_kept_data(result, spool_dir, self.store.artifact_bytes_cap)
        result = _redact(result, redactor)
        if budget is not None and reservation is not None:
            budget.settle(reservation, result.metrics.wall_ms / 1000,
                          sum(a.size for a in result.artifacts))
            if reservation.time_clipped and result.status is Status.timeout:
                result = result.model_copy(update={
                    "status": Status.budget_exceeded,
                    "error": ErrorInfo(type="BudgetExceeded", message=(
                        f"execution-time budget of {budget.exec_s:g} s ran out during the run "
                        f"(it had {reservation.limits.timeout_s:.2f} s left)")),
                })
        finish(result, cache_key=key)
        # A cancelled run is not what another caller of the same code would get.
        if key is not None and cacheable(result) and not (cancel and cancel.cancelled) \
                and self._all_artifacts_kept(result):
            self.store.cache_store(key, result.run_id, self.cache_ttl_s)
        return result

    def _all_artifacts_kept(self, result: RunResult) -> bool:
        return sum(a.size for a in result.artifacts) <= self.store.artifact_bytes_cap

    def _sandbox_run(self, request: RunRequest, base: RunResult,
                     on_stdout: OutputCallback | None,
                     on_stderr: OutputCallback | None, kind: str,
                     cancel: Cancel | None = None, spool_dir: str | None = None,
                     tenant: str | None = None) -> RunResult:
        limits = request.limits
        # Started (or refused: closed) before the run waits its turn; the first attempt takes
        # its slot there.
        live = [self._live_host(tenant)]
        spec = _spec(limits, request)
        if not self._admission.enter(cancel):  # cancelled while it waited for its turn
            return _not_started(base)
        try:
            if cancel is not None and cancel.cancelled:
                return _not_started(base)

            def attempt() -> RawRun:
                host, slot = self._hosts.take(tenant, kind, SLOT_WAIT_S,
                                              live.pop() if live else None)
                return host.execute(
                    slot, {"code": request.code, "run_id": base.run_id, "spec": spec},
                    [(f.name, f.data) for f in request.files], request.stdin,
                    limits.output_bytes, limits.timeout_s + BACKSTOP_GRACE_S,
                    on_stdout, on_stderr, cancel, spool_dir,
                )

            try:
                raw = _until_started(f"run {base.run_id}", attempt)
            except HostError as exc:
                message = str(exc)
                if self._closed:  # what failed was the teardown under the run, not the run
                    message = "the executor was closed while the run was in flight"
                log.error("run %s: sandbox error: %s", base.run_id, exc)
                return base.model_copy(update={"error": ErrorInfo(type="SandboxError",
                                                                  message=message)})
        finally:
            self._admission.leave()
        return _result(base, raw)

    # ---- sessions ---------------------------------------------------------------------------

    def session(self, *, profile: str = "data", limits: Limits | Mapping[str, Any] | None = None,
                env: Mapping[str, str] | None = None,
                files: Mapping[str, FileSource] | None = None,
                idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
                max_lifetime_s: float = DEFAULT_MAX_LIFETIME_S,
                secrets: Iterable[str] = (), tenant: str | None = None) -> Session:
        """Start a stateful session (see `execbox.sessions`). `limits`: memory, pids and disk
        for the whole session, wall and CPU time per cell. Raises Overloaded past
        `max_sessions` open sessions. `tenant`: whose host it lives on (see `run`); it stays
        there for its whole life, across replacements of the host."""
        for name, value in (("idle_timeout_s", idle_timeout_s),
                            ("max_lifetime_s", max_lifetime_s)):
            if not 0 < value <= 7 * 24 * 3600:
                raise UsageError(f"{name} must be in (0, 604800] seconds, not {value!r}")
        secrets = checked_secrets(secrets)
        template = make_request("", limits=limits, env=env, files=files, profile=profile)
        verdict = policy_mod.check(template, self.profiles)
        if verdict.decision != "allow":
            raise UsageError(f"the session was refused by policy profile {profile!r}: "
                             f"{verdict.message}")
        limits_ = verdict.limits
        self._live_host(tenant)
        with self._lock:
            if len(self._sessions) >= self.max_sessions:
                raise Overloaded(f"{len(self._sessions)} sessions are open (max_sessions="
                                 f"{self.max_sessions}); close one or raise max_sessions")
            session_id = new_run_id()
            self._sessions[session_id] = None  # type: ignore[assignment]  # the place is held

        def start() -> SessionChannel:
            channel = self._hosts.open_session(tenant, SLOT_WAIT_S)
            channel.start(session_id, _spec(limits_, template),
                          [(f.name, f.data) for f in template.files])
            return channel

        try:
            channel = _until_started(f"session {session_id}", start)
        except HostError as exc:
            self._forget_session(session_id)
            raise SandboxError(f"the session could not start: {exc}") from exc
        except BaseException:
            self._forget_session(session_id)
            raise
        session = Session(self, channel, session_id, profile=profile, limits=limits_,
                          env=dict(template.env), idle_timeout_s=idle_timeout_s,
                          max_lifetime_s=max_lifetime_s, secrets=secrets,
                          input_bytes=sum(len(f.data) for f in template.files))
        with self._lock:
            self._sessions[session_id] = session
        log.info("session %s started (%s)", session_id, profile)
        return session

    def get_session(self, session_id: str) -> Session:
        """An open session by id; UsageError when there is none (never started, or ended)."""
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            raise UsageError(f"no open session {session_id!r}")
        return session

    def _live_sessions(self) -> list[Session]:
        with self._lock:
            return [s for s in self._sessions.values() if s is not None]

    def _forget_session(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)

    def _run_cell(self, session: Session, code: str, *, timeout_s: float | None,
                  secrets: Iterable[str], budget: Budget | None,
                  on_stdout: OutputCallback | None,
                  on_stderr: OutputCallback | None) -> RunResult:
        limits = session.limits
        if timeout_s is not None:
            limits = limits.model_copy(update={"timeout_s": timeout_s})
        request = make_request(code, limits=limits, env=session.env, profile=session.profile)
        return self.run_request(request, cache=False, budget=budget, secrets=secrets,
                                session_id=session.id,
                                on_stdout=on_stdout, on_stderr=on_stderr, _kind="cell",
                                _session=session)

    def _cell_run(self, session: Session, request: RunRequest, base: RunResult,
                  on_stdout: OutputCallback | None,
                  on_stderr: OutputCallback | None) -> RunResult:
        limits = request.limits
        base = base.model_copy(update={"session_id": session.id})
        try:
            raw = session._channel.cell(
                request.code, limits.timeout_s, limits.effective_cpu_s, limits.output_bytes,
                limits.timeout_s + BACKSTOP_GRACE_S, on_stdout, on_stderr)
        except SessionEnded as exc:
            session._mark_ended(f"has ended: {exc}")
            raise SessionClosed(f"session {session.id} has ended: {exc}") from exc
        except HostError as exc:
            if session.end_reason is not None:  # ended on purpose during the cell: say why
                session._mark_ended(session.end_reason)
                expired = session.killed_status is Status.timeout
                return base.model_copy(update={
                    "status": session.killed_status, "error": ErrorInfo(
                        type="SessionExpired" if expired else "SandboxError",
                        message=f"the session {session.end_reason} during this cell")})
            log.error("cell of session %s: sandbox error: %s", session.id, exc)
            session._mark_ended(f"has ended with a sandbox error: {exc}")
            return base.model_copy(update={"error": ErrorInfo(type="SandboxError",
                                                              message=str(exc))})
        result = _result(base, raw)
        outputs = [Output(**item) for item in raw.meta.get("outputs", [])]
        result = result.model_copy(update={"outputs": outputs})
        if raw.meta.get("ended"):
            reason = result.error.message if result.error else "the interpreter exited"
            session._mark_ended(f"has ended ({result.status.value}): {reason}")
        return result

    async def astream(self, code: str, **kwargs: Any) -> AsyncIterator[StreamEvent]:
        """Like `run` (same arguments), yielding output events as the code prints, then the
        result event. Cancelled, or closed before its result, it ends its run at once (the
        run's record says Cancelled)."""
        from .streaming import stream_events

        cancel = Cancel()
        async for event in stream_events(
                lambda out, err: self.run(code, on_stdout=out, on_stderr=err, cancel=cancel,
                                          **kwargs), cancel=cancel.cancel):
            yield event

    def map(self, requests: Iterable[RunRequest | str], *, concurrency: int | None = None,
            cache: bool | None = None, tenant: str | None = None
            ) -> Generator[tuple[int, RunResult], None, None]:
        """Run many requests (or code strings) concurrently; yield `(index, result)` pairs as
        runs finish. At most `concurrency` runs are in flight (default: the executor's
        `max_concurrency`), and at most as many results wait for a consumer that is slower
        than the runs: the input is consumed lazily, so a generator of a million requests
        never sits in memory at once. An error (a bad request, the input's own) is raised in
        its result's place; stopping early waits for the runs in flight (not after a Ctrl-C,
        see `_concurrently`). `concurrency` above `max_concurrency` is capped there; below 1
        (or not an integer) it is a UsageError. `tenant`: see `run`."""
        if concurrency is not None:
            _whole("concurrency", concurrency, 1)
        width = min(concurrency or self.max_concurrency, self.max_concurrency)

        def run(item: RunRequest | str) -> RunResult:
            request = item if isinstance(item, RunRequest) else make_request(item)
            return self.run_request(request, cache=cache, tenant=tenant)

        return _concurrently(run, requests, width)

    def approve(self, run_id: str, *, approved_by: str | None = None,
                on_stdout: OutputCallback | None = None,
                on_stderr: OutputCallback | None = None,
                secrets: Iterable[str] = ()) -> RunResult:
        """Release a run the policy held (`needs_approval`): run it now, once. A run whose
        record keeps secrets redacted needs them again (`secrets`; UsageError otherwise)."""
        record = self.store.get(run_id)
        if record is None:
            raise UsageError(f"no run {run_id!r}")
        if record.status != Status.needs_approval.value:
            raise UsageError(f"run {run_id} is {record.status}, not held for approval")
        secrets = tuple(secrets)
        request = self.store.request_of(record, secrets)  # before it is marked released
        if not self.store.mark_approved(run_id, approved_by):
            raise UsageError(f"run {run_id} was already released")
        return self.run_request(request, cache=False, secrets=secrets,
                                session_id=record.session_id, on_stdout=on_stdout,
                                on_stderr=on_stderr, _kind="approval", _source=run_id,
                                _approved=True)

    def replay(self, run_id: str, *, secrets: Iterable[str] = ()) -> ReplayReport:
        """Run a recorded run again under its recorded limits and compare the outcomes.
        A record that keeps secrets redacted (in its code, stdin, environment or inputs)
        cannot be replayed exactly without them: give them again as `secrets` (checked
        against the recorded sha256 before anything runs), or UsageError says which parts
        need them."""
        record = self.store.get(run_id)
        if record is None:
            raise UsageError(f"no run {run_id!r}")
        if record.status in (Status.policy_denied.value, Status.needs_approval.value,
                             Status.budget_exceeded.value):
            raise UsageError(f"run {run_id} never ran ({record.status}); nothing to replay")
        if record.policy.rule == "code.encoding":
            raise UsageError(f"run {run_id}'s code was bytes that do not decode, and the record "
                             "keeps only a rendering of them (bad bytes as \\x escapes): run "
                             "the file again instead")
        secrets = tuple(secrets)
        request = self.store.request_of(record, secrets)
        # Records made before secrets were sealed kept redacted environment values only.
        redacted_env = sorted(k for k, v in request.env.items() if "[REDACTED" in v)
        again = self.run_request(request, cache=False, secrets=secrets, _kind="replay",
                                 _source=run_id, _approved=True)
        return ReplayReport.compare(record.result, again, redacted_env)

    def close(self) -> None:
        """Stop the fork server; nothing the executor started keeps running."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._reaper.stop()
        for session in self._live_sessions():
            session.kill("was ended because the executor was closed", Status.sandbox_error)
            session._end("was ended because the executor was closed")
        with self._lock:
            self._hosts.close()
            self.store.close()

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _not_started(base: RunResult) -> RunResult:
    """The result of a run cancelled before it started: nothing ran."""
    return base.model_copy(update={"status": Status.error, "error": ErrorInfo(
        type="Cancelled", message="the run was cancelled before it started")})


def _whole(name: str, value: object, least: int) -> None:
    """UsageError unless `value` is an integer of at least `least` (a bool is no count)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise UsageError(f"{name} must be an integer >= {least}, got {value!r}")


class _Admission:
    """At most `limit` runs at once and at most `max_waiting` callers waiting for a turn."""

    def __init__(self, limit: int, max_waiting: int, timeout_s: float) -> None:
        self._sem = threading.BoundedSemaphore(limit)
        self._lock = threading.Lock()
        self._waiting = 0
        self._max_waiting = max_waiting
        self._timeout_s = timeout_s

    def enter(self, cancel: Cancel | None = None) -> bool:
        """Wait for a turn: True once it is the caller's (`leave` gives it back), False when
        `cancel` was cancelled while it waited (its place in the queue is given up at once);
        raises Overloaded past `max_queue` or `queue_timeout_s`."""
        if self._sem.acquire(blocking=False):
            return True
        with self._lock:
            if self._waiting >= self._max_waiting:
                raise Overloaded(f"{self._waiting} runs are already waiting (max_queue="
                                 f"{self._max_waiting}); retry later or raise max_queue")
            self._waiting += 1
        try:
            deadline = time.monotonic() + self._timeout_s
            while True:
                if cancel is not None and cancel.cancelled:
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Overloaded(f"no run slot within {self._timeout_s:g} s "
                                     "(queue_timeout_s); retry later")
                # A cancellable waiter looks at its token every CANCEL_CHECK_S.
                if self._sem.acquire(timeout=min(left, CANCEL_CHECK_S) if cancel else left):
                    return True
        finally:
            with self._lock:
                self._waiting -= 1

    def leave(self) -> None:
        self._sem.release()


class ReplayReport(BaseModel):
    """How a replay compares with the recorded run."""

    original: RunResult
    replay: RunResult
    matches: bool
    differences: list[str]
    image_changed: bool
    env_redacted: list[str]

    @classmethod
    def compare(cls, original: RunResult, replay: RunResult,
                env_redacted: list[str]) -> ReplayReport:
        diffs = []
        for name in ("status", "exit_code", "signal", "stdout", "stderr", "stdout_truncated",
                     "stderr_truncated"):
            if getattr(original, name) != getattr(replay, name):
                diffs.append(name)
        if (original.error and original.error.type) != (replay.error and replay.error.type):
            diffs.append("error.type")
        if ([(a.path, a.sha256) for a in original.artifacts]
                != [(a.path, a.sha256) for a in replay.artifacts]):
            diffs.append("artifacts")
        return cls(original=original, replay=replay, matches=not diffs, differences=diffs,
                   image_changed=original.image_digest != replay.image_digest,
                   env_redacted=env_redacted)


def program_kind(imports: frozenset[str] | None) -> str:
    """Which kind of slot runs the code (`protocol.SLOT_KINDS`): "light" (standard library
    only, a fork of a small interpreter) when the code imports nothing else, else a fork of
    the heavy zygote (numpy, pandas, matplotlib and scipy already imported): "pandas" when it
    imports pandas (its program has copied the pages pandas' use writes), "heavy" otherwise.
    Code the policy could not parse fails to compile in the sandbox too: it goes light. An
    import the analysis cannot see (a computed name) still works in a light program, at the
    price of importing the module then."""
    if imports is None or imports <= _STDLIB:
        return "light"
    return "pandas" if "pandas" in imports else "heavy"


_STDLIB = frozenset(sys.stdlib_module_names)


def _spec(limits: Limits, request: RunRequest) -> dict[str, Any]:
    """The sandbox's view of a run's limits, environment and inputs."""
    return {
        "timeout_s": limits.timeout_s,
        "cpu_s": limits.effective_cpu_s,
        "memory_bytes": limits.memory_mib * MIB,
        "pids": limits.pids,
        "disk_bytes": limits.disk_mib * MIB,
        "output_bytes": limits.output_bytes,
        "artifact_bytes": limits.artifact_bytes,
        "artifact_files": limits.artifact_files,
        "env": request.env,
        "input_bytes": sum(len(f.data) for f in request.files),
        "input_count": len(request.files),
    }


def _concurrently(fn: Callable[[A], T], items: Iterable[A], width: int
                  ) -> Generator[tuple[int, T], None, None]:
    """`(index, fn(item))` for each item, yielded as calls finish, from `width` threads that
    each take the next item themselves: a call ended costs one wake-up (of the consumer, if it
    waits), not two, and no future. At most `width` calls run and `width` results wait for
    the consumer, so a slow one holds the input back; items are taken lazily. An exception
    (from `fn` or from the input) is raised to the consumer in its place; a consumer that
    stops early waits for the calls in flight, and no new one starts (interrupted by a
    KeyboardInterrupt, it does not wait: its caller may end them, see `evals.humaneval`)."""
    numbered = iter(enumerate(items))
    taking = threading.Lock()
    room = threading.Semaphore(2 * width)  # calls in flight plus results not yet consumed
    done: queue.SimpleQueue[tuple[int, T | BaseException] | None] = queue.SimpleQueue()
    stop = threading.Event()

    def work() -> None:
        try:
            while room.acquire() and not stop.is_set():
                with taking:
                    try:
                        index, item = next(numbered, (-1, None))
                    except BaseException as exc:  # the input's own error, raised in its place
                        done.put((-1, exc))
                        return
                if index < 0:
                    return
                try:
                    done.put((index, fn(item)))  # type: ignore[arg-type]
                except BaseException as exc:
                    done.put((index, exc))
        finally:
            done.put(None)

    threads = [threading.Thread(target=work, name=f"execbox-map-{i}", daemon=True)
               for i in range(width)]
    for thread in threads:
        thread.start()
    interrupted = False
    try:
        working = width
        while working:
            try:
                # Timed: a blocking get would hold off the consumer's signal handlers (a
                # KeyboardInterrupt) until the next run finished.
                got = done.get(timeout=SIGNAL_CHECK_S)
            except queue.Empty:
                continue
            if got is None:
                working -= 1
                continue
            index, outcome = got
            if isinstance(outcome, BaseException):
                outcome.add_note(f"(raised by item {index} of the map)" if index >= 0
                                 else "(raised by the map's input)")
                raise outcome
            yield index, outcome
            room.release()
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        stop.set()
        room.release(width)  # a thread waiting for room sees the stop
        if not interrupted:  # a Ctrl-C does not wait: the calls in flight end on their own
            for thread in threads:
                thread.join()


def _until_started(what: str, attempt: Callable[[], T]) -> T:
    """`attempt()`, again while it finds its slot's program (or supervisor) gone before
    anything started (RunNotStarted: nothing ran, another slot may take it), at most
    NOT_STARTED_TRIES times in all; then a HostError."""
    for n in range(1, NOT_STARTED_TRIES + 1):
        try:
            return attempt()
        except RunNotStarted as exc:
            log.warning("%s: %s (try %d of %d)", what, exc, n, NOT_STARTED_TRIES)
            if n == NOT_STARTED_TRIES:
                raise HostError(f"{exc}, {n} times") from exc
    raise AssertionError("unreachable")


def _with_kept_data(result: RunResult, spool_dir: str, cap: int) -> RunResult:
    """Spooled artifacts: read back the bytes of those the record store keeps (the same
    first-come choice within `cap` as `RunStore.save`), so the record has them."""
    arts, budget = [], cap
    for index, art in enumerate(result.artifacts):
        if art.data is None and art.size <= budget:
            budget -= art.size
            art = art.model_copy(update={"data": Path(spool_dir, str(index)).read_bytes()})
        arts.append(art)
    return result.model_copy(update={"artifacts": arts}) if arts else result


@contextlib.contextmanager
def _live_output(redactor: Redactor, on_stdout: OutputCallback | None,
                 on_stderr: OutputCallback | None
                 ) -> Iterator[tuple[OutputCallback | None, OutputCallback | None]]:
    """The output callbacks behind a `LiveRedactor` each: what they see is redacted as the
    result will be. What is held back is released when the run ends, on every path (on an
    error, redacted too, and a callback failing then does not hide the error)."""
    if on_stdout is None and on_stderr is None:
        yield None, None
        return
    out = LiveRedactor(redactor, on_stdout) if on_stdout is not None else None
    err = LiveRedactor(redactor, on_stderr) if on_stderr is not None else None
    streams = (out, err)
    try:
        yield (out.write if out else None), (err.write if err else None)
    except BaseException:
        for stream in streams:
            if stream is not None:
                with contextlib.suppress(Exception):
                    stream.close()
        raise
    for stream in streams:
        if stream is not None:
            stream.close()


def _redact(result: RunResult, redactor: Redactor) -> RunResult:
    """Scrub secrets from everything the code produced as text."""
    stdout, stderr = redactor.redact_end(result.stdout), redactor.redact_end(result.stderr)
    if stdout is result.stdout and stderr is result.stderr and not result.outputs \
            and result.error is None and not result.artifacts:
        return result  # nothing to scrub (`redact` returns its argument then): no copy
    update: dict[str, Any] = {"stdout": stdout, "stderr": stderr}
    if result.outputs:  # every one: the code chooses the MIME type, so any may hold text
        # A MIME type is the code's text too, cut at 200 characters by the sandbox.
        update["outputs"] = [o.model_copy(update={"mime_type": redactor.redact_end(o.mime_type),
                                                  "data": redactor.redact(o.data)})
                             for o in result.outputs]
    if result.error is not None:
        error = result.error
        update["error"] = error.model_copy(update={
            "type": _redact_cut(redactor, error.type),  # the code names its exception
            "message": _redact_cut(redactor, error.message),
            "traceback": _redact_cut(redactor, error.traceback) if error.traceback else None,
            "rule": redactor.redact(error.rule) if error.rule else None,
        })
    if result.artifacts:
        update["artifacts"] = _redact_paths(result.artifacts, redactor)
    return result.model_copy(update=update)


def _redact_cut(redactor: Redactor, text: str) -> str:
    """`redactor.redact(text)`, and where the sandbox cut the text to a cap (its CUT_HEAD and
    CUT_TAIL marks) also the part of a secret the cut left on either side of the mark."""
    text = redactor.redact(text)
    if CUT_HEAD not in text and CUT_TAIL not in text:
        return text
    parts = re.split(f"({re.escape(CUT_HEAD)}|{re.escape(CUT_TAIL)})", text)
    for i in range(0, len(parts), 2):  # texts at even indexes, marks between them
        if i > 0 and parts[i - 1] == CUT_HEAD:
            parts[i] = redactor.redact_start(parts[i])
        if i + 1 < len(parts) and parts[i + 1] == CUT_TAIL:
            parts[i] = redactor.redact_end(parts[i])
    return "".join(parts)


def _redact_paths(artifacts: list[Artifact], redactor: Redactor) -> list[Artifact]:
    """The artifacts with their paths redacted (the bytes stay as written). A path is also a
    key (downloads by name, the record's artifact blobs): a redacted path that another
    artifact already has gets a ``~N`` suffix, so each stays unique."""
    paths = [redactor.redact(a.path) for a in artifacts]
    if all(p is a.path for p, a in zip(paths, artifacts, strict=True)):
        return artifacts
    taken = {p for p, a in zip(paths, artifacts, strict=True) if p is a.path}
    out: list[Artifact] = []
    for path, art in zip(paths, artifacts, strict=True):
        if path is not art.path:
            unique, n = path, 1
            while unique in taken:
                n += 1
                unique = f"{path}~{n}"
            taken.add(unique)
            art = art.model_copy(update={"path": unique})
        out.append(art)
    return out


def _undecodable(base: RunResult, exc: SyntaxError) -> RunResult:
    """The result of source bytes that do not decode: what the sandbox reports for code that
    does not compile (status error, exit status 1, the SyntaxError on stderr)."""
    record = compile_error_record(exc)
    return base.model_copy(update={"status": Status.error, "exit_code": 1,
                                   "stderr": record["traceback"], "error": ErrorInfo(**record)})


def _result(base: RunResult, raw: RawRun) -> RunResult:
    meta = raw.meta
    status = Status(meta["status"])
    error = ErrorInfo(**meta["error"]) if meta.get("error") else None
    if (raw.stdout_truncated or raw.stderr_truncated) and status in (Status.ok, Status.error):
        status = Status.output_limit
        error = ErrorInfo(
            type="OutputLimitExceeded",
            message=f"output exceeded {base.limits.output_bytes} bytes on stdout or stderr; "
                    "raise limits.output_bytes (CLI --output-bytes)",
        )
    arts = [Artifact(**a, data=d) for a, d in zip(meta["artifacts"], raw.artifact_data, strict=True)]
    return base.model_copy(update={
        "status": status,
        "exit_code": meta.get("exit_code"),
        "signal": meta.get("signal"),
        "stdout": raw.stdout.decode("utf-8", "replace"),
        "stderr": raw.stderr.decode("utf-8", "replace"),
        "stdout_truncated": raw.stdout_truncated,
        "stderr_truncated": raw.stderr_truncated,
        "error": error,
        "artifacts": arts,
        "artifacts_truncated": bool(meta.get("artifacts_truncated")),
        "inputs_read": meta.get("inputs_read"),
        "metrics": Metrics(**meta["metrics"]),
    })


def run(code: str | bytes, *, language: str = "python", stdin: bytes | str | None = None,
        files: Mapping[str, FileSource] | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None, profile: str = "data",
        cache: bool | None = None) -> RunResult:
    """One-shot convenience: start an Executor, run `code`, close it."""
    request = make_request(code, language=language, stdin=stdin, files=files, limits=limits,
                           env=env, profile=profile)
    with Executor() as executor:
        return executor.run_request(request, cache=cache)
