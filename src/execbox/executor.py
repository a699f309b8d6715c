"""The pipeline every run goes through, and the long-lived `Executor` that owns the sandbox:

    request -> policy -> budget -> cache -> sandbox -> redact -> record -> result

Every run is recorded, allowed or not; the record is committed as its result returns (see
`records`), and the first run to start after a record could not be written is refused. What
the code did is data on the result; only caller and host problems raise (see `errors`).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import AsyncIterator, Generator, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

from . import atrest
from . import policy as policy_mod
from . import rerun as rerun_mod
from .admission import Admission, concurrently
from .backend import (
    BACKSTOP_GRACE_S,
    LocalBackend,
    RunSpec,
    SandboxBackend,
)
from .budget import Budget, Reservation, settled
from .cache import DEFAULT_TTL_S, cache_key, cacheable
from .call import Call, Options, Origin
from .cancel import Cancel as Cancel  # re-exported: execbox.Cancel
from .contract import (
    BoundSecret,
    ErrorInfo,
    Limits,
    NetworkConnection,
    RunRequest,
    RunResult,
    Status,
    StreamEvent,
)
from .errors import UsageError
from .hosts import (
    DEFAULT_ENVIRONMENT_IDLE_S,
    DEFAULT_ROTATE_AFTER_RUNS,
    DEFAULT_ROTATE_AFTER_S,
    DEFAULT_TENANT_IDLE_S,
    Hosts,
)
from .image import Image, interpreter_problem
from .network.secrets import Binding
from .policy import javascript
from .records import PolicyInfo, RunStore
from .redact import Redactor, checked_secrets
from .request import (
    FileSource,
    bind_secrets,
    check_count,
    check_settings,
    make_request,
    new_run_id,
)
from .results import ReplayReport, not_started, result_of, undecodable, with_kept_data
from .routing import interpreter_kind, program_kind
from .sandbox.host import rootless
from .sandbox.host.errors import HostError
from .sandbox.host.pump import OutputCallback
from .sandbox.host.zygotes import ZygoteProcess
from .scrub import LiveOutput, live_output, redact_network_log, redact_result
from .sessions import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_LIFETIME_S,
    Reaper,
    Session,
    SessionTable,
)
from .stats import ExecutorStats, executor_stats

log = logging.getLogger(__name__)


class Executor:
    """Runs code in the sandbox. Thread-safe; start once, run many times, close at the end.

    Construction starts the fork servers and returns once standard-library code can run (a
    fifth of a second); the one that pre-imports numpy, pandas and matplotlib keeps starting in
    the background (about a second), and runs and sessions that need it wait for it. It raises
    SandboxUnavailable when this host cannot isolate runs; there is no unsandboxed fallback.
    """

    def __init__(
        self,
        *,
        image: Image | None = None,
        max_concurrency: int | None = None,
        pool_size: int | None = None,
        max_queue: int = 1024,
        queue_timeout_s: float = 300.0,
        profiles: Path | Mapping[str, policy_mod.Profile] | None = None,
        records: RunStore | str | None = None,
        cache: bool = True,
        cache_ttl_s: float = DEFAULT_TTL_S,
        secrets: Iterable[str] = (),
        max_sessions: int = 16,
        rotate_after_runs: int | None = DEFAULT_ROTATE_AFTER_RUNS,
        rotate_after_s: float | None = DEFAULT_ROTATE_AFTER_S,
        zygotes_per_tenant: bool = False,
        tenant_idle_s: float = DEFAULT_TENANT_IDLE_S,
        backend: SandboxBackend | None = None,
        network_resolve: Mapping[str, str | Sequence[str]] | None = None,
        environment_idle_s: float = DEFAULT_ENVIRONMENT_IDLE_S,
        network_ca: str | None = None,
        allow_unenforced_limits: str | Iterable[str] | None = None,
        cluster: str | None = None,
    ) -> None:
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
        after `tenant_idle_s` seconds unused. Runs and sessions naming an environment other
        than the default (`execbox env list`) run on hosts of that environment, started at
        its first run and closed after `environment_idle_s` seconds unused.
        A bad value of any of these is a UsageError.
        `backend`: where code runs (default: this host's sandbox, which needs root and the
        runtime image; `execbox.testing.FakeSandbox` in tests of code above the sandbox).
        `network_resolve`: names the network proxy resolves to these addresses instead of
        asking DNS, trusted like curl's --resolve (a pinned address counts as named exactly:
        a pinned loopback or private address is dialled). `network_ca`: a PEM file of the
        only CAs the proxy trusts when it opens TLS to a host a secret is bound to (default:
        the system's trust store).
        `cluster`: the address of a Ray cluster ("ray://HEAD:10001", "HOST:PORT" or "auto")
        whose nodes run the code, each through a host of its own (see docs/cluster.md); the
        pipeline stays here, and `records` must then be a shared database (PostgreSQL URL).
        The sandbox settings above apply to each node, `max_concurrency` included; the
        executor admits as many runs at once as the nodes it found at the start have slots."""
        check_settings(
            max_concurrency=max_concurrency,
            pool_size=pool_size,
            max_queue=max_queue,
            queue_timeout_s=queue_timeout_s,
            max_sessions=max_sessions,
            rotate_after_runs=rotate_after_runs,
            rotate_after_s=rotate_after_s,
            zygotes_per_tenant=zygotes_per_tenant,
            tenant_idle_s=tenant_idle_s,
            environment_idle_s=environment_idle_s,
        )
        self.profiles = (
            dict(profiles) if isinstance(profiles, Mapping) else policy_mod.load_profiles(profiles)
        )
        if cluster is not None and (backend is not None or image is not None):
            raise UsageError("give a cluster or a backend or an image, not more than one")
        self.store = records if isinstance(records, RunStore) else RunStore(records)
        if cluster is not None and self.store.engine.dialect.name == "sqlite":
            if not isinstance(records, RunStore):
                self.store.close()
            raise UsageError(
                "a cluster needs a shared run store that every caller's records reach: "
                "records='postgresql://...' (or `execbox serve --db`); SQLite is one machine's"
            )
        self.cache_enabled = cache
        self.cache_ttl_s = cache_ttl_s
        self._redactor = Redactor(secrets)
        if backend is not None and image is not None:
            raise UsageError("give an image or a backend, not both (a backend has its own)")
        self.max_concurrency = max_concurrency or 4 * (os.cpu_count() or 1)
        self.pool_size = max(1, pool_size or min(self.max_concurrency, 2 * (os.cpu_count() or 1)))
        try:
            unenforced = rootless.parse_allowed(
                os.environ.get(rootless.ALLOW_ENV)
                if allow_unenforced_limits is None
                else allow_unenforced_limits
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        cluster_backend = None
        if cluster is not None:
            from .cluster import connect  # Ray only when asked for: the one-box path has none

            try:
                backend = connect(
                    cluster,
                    {
                        "max_concurrency": max_concurrency,
                        "pool_size": self.pool_size,
                        "rotate_after_runs": rotate_after_runs,
                        "rotate_after_s": rotate_after_s,
                        "zygotes_per_tenant": zygotes_per_tenant,
                        "tenant_idle_s": tenant_idle_s,
                        "network_resolve": network_resolve,
                        "environment_idle_s": environment_idle_s,
                        "network_ca": network_ca,
                        "allow_unenforced_limits": sorted(unenforced),
                    },
                )
            except BaseException:
                self.store.close()
                raise
            self.max_concurrency = backend.capacity
            cluster_backend = backend
        self._backend = backend or LocalBackend(
            image=image,
            pool_size=self.pool_size,
            rotate_after_runs=rotate_after_runs,
            rotate_after_s=rotate_after_s,
            per_tenant=zygotes_per_tenant,
            tenant_idle_s=tenant_idle_s,
            network_resolve=network_resolve,
            environment_idle_s=environment_idle_s,
            network_ca=network_ca,
            allow_unenforced_limits=unenforced,
        )
        self.image = self._backend.image if isinstance(self._backend, LocalBackend) else None
        self.image_digest = self._backend.digest
        # The environment a request naming none runs in, by name (None: it has no name).
        self.default_environment = self._backend.default_environment
        self._admission = Admission(self.max_concurrency, max_queue, queue_timeout_s)
        if cluster_backend is not None:  # its nodes come and go: so does the admission width
            cluster_backend.on_capacity = self._resize
        self._lock = threading.Lock()
        self._closed = False
        info = self._backend.info()
        self._sessions = SessionTable(max_sessions)
        self._reaper = Reaper(self)
        log.info(
            "execbox executor ready: image %s, cgroup v%s, concurrency %d, zygote %s ms, "
            "hosts %s, replaced after %s runs or %s s",
            self.image_digest,
            info.get("cgroup_version", "?"),
            self.max_concurrency,
            info.get("startup_ms", "?"),
            "per tenant" if zygotes_per_tenant else "shared",
            rotate_after_runs or "no",
            rotate_after_s or "no",
        )

    @property
    def max_sessions(self) -> int:
        """At most this many sessions are open at once (settable)."""
        return self._sessions.max_sessions

    @max_sessions.setter
    def max_sessions(self, value: int) -> None:
        self._sessions.max_sessions = value

    @property
    def _hosts(self) -> Hosts:
        """The local backend's hosts (tests of the real sandbox look at them)."""
        if not isinstance(self._backend, LocalBackend):
            raise UsageError("this Executor's backend has no local sandbox hosts")
        return self._backend.hosts

    @property
    def _host(self) -> ZygoteProcess:
        """The shared host serving now (started if need be)."""
        self._check_open()
        return self._hosts.get(None)

    def _resize(self, capacity: int) -> None:
        """The cluster's serving slots changed: admit that many runs at once."""
        if capacity > 0:
            self.max_concurrency = capacity
            self._admission.resize(capacity)

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("this Executor is closed")

    def stats(self, tenant: str | None = None) -> ExecutorStats:
        """A snapshot of the sandbox host serving `tenant` (the shared one by default), of its
        hosts in other environments, and of the executor; it starts nothing. A backend without
        local hosts has `host` None."""
        sessions_open = len(self._sessions)
        local = self._backend if isinstance(self._backend, LocalBackend) else None
        return executor_stats(
            local.hosts if local is not None else None,
            tenant,
            sessions_open=sessions_open,
            runs_waiting=self._admission.waiting,
            pool_size=self.pool_size,
            environment_names=local.environment_names if local is not None else None,
        )

    def environment(self, name: str) -> str:
        """The image digest runs naming environment `name` report; UsageError when no
        environment of that name is built (`execbox env build`)."""
        return self._backend.environment(name)

    def run(
        self,
        code: str | bytes,
        *,
        language: str = "python",
        stdin: bytes | str | None = None,
        files: Mapping[str, FileSource] | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        profile: str = "data",
        network: str | Sequence[str] = "none",
        cache: bool | None = None,
        budget: Budget | None = None,
        secrets: Iterable[str] = (),
        session_id: str | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        cancel: Cancel | None = None,
        tenant: str | None = None,
        environment: str | None = None,
        bound_secrets: Sequence[BoundSecret | Mapping[str, Any]] = (),
    ) -> RunResult:
        """Run `code` in a fresh sandbox and return its result (never raises for the code).
        `code` may be the bytes of a source file: bytes that do not decode are its SyntaxError.

        `limits` fields you set override the profile's defaults (within its maximums).
        `cache=False` skips the result cache; `budget` is shared across calls; `secrets` are
        redacted from this run's output, errors and record. `cancel` (an `execbox.Cancel`)
        lets another thread end the run: its result is then an `error` of type Cancelled.
        `tenant`: whose host runs it, with `zygotes_per_tenant` (else all share one).
        `network`: "none", or the hosts the run may reach through the proxy (`host[:port]`
        entries, within what the profile allows; see docs/controls/network.md).
        `environment`: the named environment it runs in (None: the default); its profile must
        allow it, and one not built is a UsageError.
        `bound_secrets`: `{"name", "value", "hosts"}` each; the run's environment holds a
        placeholder under the name, and the proxy sends the value instead only in HTTPS
        requests to those hosts (see docs/controls/network.md)."""
        request = make_request(
            code,
            language=language,
            stdin=stdin,
            files=files,
            limits=limits,
            env=env,
            profile=profile,
            network=network,
            environment=environment,
        )
        return self.run_request(
            request,
            cache=cache,
            budget=budget,
            secrets=secrets,
            session_id=session_id,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            cancel=cancel,
            tenant=tenant,
            bound_secrets=bound_secrets,
        )

    def run_request(
        self,
        request: RunRequest,
        *,
        cache: bool | None = None,
        budget: Budget | None = None,
        secrets: Iterable[str] = (),
        session_id: str | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        cache_scope: str | None = None,
        cancel: Cancel | None = None,
        spool_dir: str | None = None,
        tenant: str | None = None,
        bound_secrets: Sequence[BoundSecret | Mapping[str, Any]] = (),
    ) -> RunResult:
        """The whole pipeline for one request. `cache_scope` partitions the result cache (the
        HTTP server passes the tenant); `tenant` picks the host with `zygotes_per_tenant`.
        With `spool_dir` (an existing private directory), the run's artifacts are written to
        `<spool_dir>/<index in result.artifacts>` as they arrive, and only those the record
        store keeps have their `data` in memory; the caller removes the files."""
        options = Options(
            cache=cache,
            budget=budget,
            cache_scope=cache_scope,
            cancel=cancel,
            spool_dir=spool_dir,
            tenant=tenant,
        )
        checked = checked_secrets(secrets)
        if bound_secrets:
            bound = bind_secrets(bound_secrets, request)
            options = replace(options, bound=bound)
            checked += tuple(s for b in bound for s in (b.value, b.placeholder))
        return self._pipeline(request, Origin(), options, checked, session_id, on_stdout, on_stderr)

    def run_cell(
        self,
        session: Session,
        code: str,
        *,
        timeout_s: float | None,
        secrets: Iterable[str],
        budget: Budget | None,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
    ) -> RunResult:
        """One cell of `session` through the pipeline (`Session.run` calls it; the secrets are
        the session's and the cell's, each checked where it was given)."""
        limits = session.limits
        if timeout_s is not None:
            limits = limits.model_copy(update={"timeout_s": timeout_s})
        request = make_request(
            code,
            language=session.language,
            limits=limits,
            env=session.env,
            profile=session.profile,
            environment=session.environment,
            network=session.network,
        )
        return self._pipeline(
            request,
            Origin(kind="cell", session=session),
            Options(cache=False, budget=budget),
            tuple(secrets),
            session.id,
            on_stdout,
            on_stderr,
        )

    def _pipeline(
        self,
        request: RunRequest,
        origin: Origin,
        options: Options,
        secrets: tuple[str, ...],
        session_id: str | None,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
    ) -> RunResult:
        """request -> policy -> budget -> cache -> sandbox -> redact -> record -> result."""
        self.store.check()  # refused when a record failed since the last check (see `records`)
        with javascript.checking_for(options.tenant):
            call = self._checked(request, origin, secrets, session_id)
        refused = self._refusal(call)
        if refused is not None:
            return self._record(call, refused)
        if call.request.source_error is not None:  # CPython runs nothing of it: no sandbox
            result = redact_result(undecodable(call.base, call.request.source_error), call.redactor)
            self._record(call, result)
            if on_stderr is not None:
                on_stderr(result.stderr.encode())
            return result
        budget = options.budget
        reservation = self._reserve(call, budget)
        if isinstance(reservation, RunResult):
            return self._record(call, reservation)
        use_cache = (
            (self.cache_enabled if options.cache is None else options.cache)
            and origin.session is None
            and call.request.network == "none"  # what a server answers is not the code's
        )
        key = (
            cache_key(
                call.request,
                call.base.image_digest,
                options.cache_scope,
                self.store.key,
                call.redactor.secrets,
            )
            if use_cache
            else None
        )
        with live_output(call.redactor, on_stdout, on_stderr) as live:
            hit = self._cached(call, key, live) if key is not None else None
            if hit is None:
                result = self._execute(call, options, live.on_stdout, live.on_stderr)
        if hit is not None:
            if budget is not None and reservation is not None:
                budget.settle(reservation, 0.0, 0)
            live.raise_failure()
            return hit
        result = redact_result(result, call.redactor)
        if budget is not None and reservation is not None:
            result = settled(budget, reservation, result)
        self._record(call, result, cache_key=key)
        # A cancelled run is not what another caller of the same code would get.
        if (
            key is not None
            and cacheable(result)
            and not (options.cancel and options.cancel.cancelled)
            and self._all_artifacts_kept(result)
        ):
            self.store.cache_store(key, result.run_id, self.cache_ttl_s)
        live.raise_failure()  # the caller's own callback's exception, once the run is recorded
        return result

    # ---- the pipeline's stages --------------------------------------------------------------

    def _checked(
        self, request: RunRequest, origin: Origin, secrets: tuple[str, ...], session_id: str | None
    ) -> Call:
        """Policy: the verdict, and the request under the limits it grants."""
        run_id = new_run_id()
        redactor = self._redactor.with_secrets(secrets)
        session = origin.session
        verdict = policy_mod.check(
            request,
            self.profiles,
            cell=session.policy_context if session else None,
            default_environment=self.default_environment,
        )
        request = request.model_copy(update={"limits": verdict.limits})
        digest = self.image_digest
        if session is not None:
            digest = session.image_digest
        elif request.environment is not None:
            # Denied, it ran nowhere: an environment the profile refuses is not looked up.
            denied = verdict.decision == "deny" and request.environment != self.default_environment
            digest = "" if denied else self._backend.environment(request.environment)
        info = PolicyInfo(
            decision=verdict.decision,
            rule=verdict.rule,
            message=redactor.redact(verdict.message) if verdict.message else verdict.message,
            line=verdict.line,
        )
        # One pass over the code for the result's digest and the record (`_record`).
        code = atrest.seal_code(request.code, redactor, self.store.keyed)
        base = RunResult(
            run_id=run_id,
            status=Status.sandbox_error,
            limits=request.limits,
            code_sha256=code.sha256,
            image_digest=digest,
            session_id=session_id,
        )
        return Call(request, origin, verdict, info, redactor, base, session_id, code)

    def _refusal(self, call: Call) -> RunResult | None:
        """The result of a request the policy denied or holds (unless approved), else None."""
        verdict, origin = call.verdict, call.origin
        if verdict.decision == "allow" or (
            verdict.decision == "needs_approval" and origin.approved
        ):
            return None
        held = verdict.decision == "needs_approval"
        message = verdict.message or "denied by policy"
        if held and origin.session is not None:
            message += "; a session cell cannot be approved later: run it as a run instead"
        elif held:
            message += (
                f"; approve it with executor.approve({call.base.run_id!r}) or "
                "`execbox runs approve`"
            )
        # The policy's message quotes the code (a module's name, say): scrubbed like output.
        return redact_result(
            call.base.model_copy(
                update={
                    "status": Status.needs_approval if held else Status.policy_denied,
                    "error": ErrorInfo(
                        type="NeedsApproval" if held else "PolicyDenied",
                        message=message,
                        line=verdict.line,
                        rule=verdict.rule,
                    ),
                }
            ),
            call.redactor,
        )

    def _reserve(self, call: Call, budget: Budget | None) -> Reservation | RunResult | None:
        """Budget: the run's share reserved (its limits clipped to what is left), or the
        `budget_exceeded` result when nothing is left."""
        if budget is None:
            return None
        reserved = budget.reserve(call.request.limits)
        if isinstance(reserved, str):
            return call.base.model_copy(
                update={
                    "status": Status.budget_exceeded,
                    "error": ErrorInfo(type="BudgetExceeded", message=reserved),
                }
            )
        call.request = call.request.model_copy(update={"limits": reserved.limits})
        call.base = call.base.model_copy(update={"limits": reserved.limits})
        return reserved

    def _cached(self, call: Call, key: str, live: LiveOutput) -> RunResult | None:
        """Cache: a stored result of the same request, recorded as this run's, or None."""
        hit = self.store.cache_lookup(key)
        if hit is None:
            return None
        # Redacted again: this caller's secrets may not be the first caller's.
        result = redact_result(self.store.with_artifact_data(hit.result), call.redactor)
        result = result.model_copy(
            update={
                "run_id": call.base.run_id,
                "cached": True,
                "code_sha256": call.base.code_sha256,
            }
        )
        # Streaming callers see the stored output as if it had just been printed.
        for callback, text in ((live.on_stdout, result.stdout), (live.on_stderr, result.stderr)):
            if callback is not None and text:
                callback(text.encode())
        return self._record(call, result, kind="cache_hit", source=hit.run_id, cache_key=key)

    def _execute(
        self,
        call: Call,
        options: Options,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
    ) -> RunResult:
        """Sandbox: the cell in its session, or the run in a slot of the right kind."""
        if call.origin.session is not None:
            return call.origin.session.execute(
                call.request, call.base, on_stdout, on_stderr, BACKSTOP_GRACE_S
            )
        result = self._sandbox_run(call, options, on_stdout, on_stderr)
        if options.spool_dir is not None:
            result = with_kept_data(result, options.spool_dir, self.store.artifact_bytes_cap)
        return result

    def _record(
        self,
        call: Call,
        result: RunResult,
        *,
        kind: str | None = None,
        source: str | None = None,
        cache_key: str | None = None,
    ) -> RunResult:
        """Records: the run as it ended, whatever stage ended it."""
        kind = kind or call.origin.kind
        self.store.save(
            call.request,
            result,
            policy=call.policy,
            session_id=call.session_id,
            redactor=call.redactor,
            kind=kind,
            source_run_id=source or call.origin.source,
            cache_key=cache_key,
            code=call.code,
        )
        log.info("run %s: %s (%s)", result.run_id, result.status.value, kind)
        return result

    def _all_artifacts_kept(self, result: RunResult) -> bool:
        return sum(a.size for a in result.artifacts) <= self.store.artifact_bytes_cap

    def _sandbox_run(
        self,
        call: Call,
        options: Options,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
    ) -> RunResult:
        request, base, cancel = call.request, call.base, options.cancel
        self._check_open()
        problem = interpreter_problem(request.language)
        if problem is not None:  # the machine's fault, not the code's: nothing started
            return base.model_copy(
                update={"error": ErrorInfo(type="SandboxError", message=problem)}
            )
        environment = None if base.image_digest == self.image_digest else base.image_digest
        # Started (or refused) before the run waits its turn.
        self._backend.start(options.tenant, environment)
        spec = RunSpec(
            run_id=base.run_id,
            code=request.code,
            limits=request.limits,
            kind=(
                program_kind(call.verdict.imports)
                if request.language == "python"
                else interpreter_kind(request.language, request.env, request.code)
            ),
            env=request.env,
            files=[(f.name, f.data) for f in request.files],
            stdin=request.stdin,
            tenant=options.tenant,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            cancel=cancel,
            spool_dir=options.spool_dir,
            network=None if request.network == "none" else request.network,
            environment=environment,
            language=request.language,
            bound=options.bound,
        )
        if not self._admission.enter(cancel):  # cancelled while it waited for its turn
            return not_started(base)
        try:
            if cancel is not None and cancel.cancelled:
                return not_started(base)
            raw = self._backend.run(spec)
        except HostError as exc:
            message = str(exc)
            if self._closed:  # what failed was the teardown under the run, not the run
                message = "the executor was closed while the run was in flight"
            log.error("run %s: sandbox error: %s", base.run_id, exc)
            return base.model_copy(
                update={"error": ErrorInfo(type="SandboxError", message=message)}
            )
        finally:
            self._admission.leave()
        # Asked for only by a missing module's hint: most runs have no import error.
        return result_of(base, raw, functools.partial(self.allowed_environments, request.profile))

    def allowed_environments(self, profile: str) -> list[str] | None:
        """The environments a run of `profile` may name (None: not known by name)."""
        if self.default_environment is None:
            return None
        return self.profiles[profile].allowed_environments(self.default_environment)

    # ---- sessions ---------------------------------------------------------------------------

    def session(
        self,
        *,
        profile: str = "data",
        limits: Limits | Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        files: Mapping[str, FileSource] | None = None,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        max_lifetime_s: float = DEFAULT_MAX_LIFETIME_S,
        secrets: Iterable[str] = (),
        tenant: str | None = None,
        environment: str | None = None,
        network: str | Sequence[str] = "none",
        language: str = "python",
    ) -> Session:
        """Start a stateful session (see `execbox.sessions`). `limits`: memory, pids and disk
        for the whole session, wall and CPU time per cell. Raises Overloaded past
        `max_sessions` open sessions. `tenant`: whose host it lives on (see `run`); it stays
        there for its whole life, across replacements of the host. `environment`: the named
        environment every cell runs in (None: the default), as for `run`. `network`: the
        session's allowlist, as for `run`, for its whole life (its network limits count
        across its cells; each cell's result logs what it asked for). `language`: "python"
        (IPython) or "javascript" (Node), for every cell."""
        return self._sessions.open(
            self,
            self._backend,
            self.profiles,
            self._check_open,
            environment=environment,
            profile=profile,
            limits=limits,
            env=env,
            files=files,
            idle_timeout_s=idle_timeout_s,
            max_lifetime_s=max_lifetime_s,
            secrets=secrets,
            tenant=tenant,
            network=network,
            language=language,
        )

    def get_session(self, session_id: str) -> Session:
        """An open session by id; UsageError when there is none (never started, or ended)."""
        return self._sessions.get(session_id)

    def live_sessions(self) -> list[Session]:
        """The open sessions (the reaper's view)."""
        return self._sessions.live()

    def forget_session(self, session_id: str) -> None:
        """Drop an ended session from the open ones (`Session` calls it as it ends)."""
        self._sessions.forget(session_id)

    def redacted_network_log(
        self, entries: list[NetworkConnection], secrets: Iterable[str]
    ) -> list[NetworkConnection]:
        """`entries` with this executor's and `secrets` scrubbed (a session's last log)."""
        return redact_network_log(entries, self._redactor.with_secrets(tuple(secrets)))

    async def astream(self, code: str, **kwargs: Any) -> AsyncIterator[StreamEvent]:
        """Like `run` (same arguments), yielding output events as the code prints, then the
        result event. Cancelled, or closed before its result, it ends its run at once (the
        run's record says Cancelled)."""
        from .streaming import stream_events

        cancel = Cancel()
        async for event in stream_events(
            lambda out, err: self.run(code, on_stdout=out, on_stderr=err, cancel=cancel, **kwargs),
            cancel=cancel.cancel,
        ):
            yield event

    def map(
        self,
        requests: Iterable[RunRequest | str],
        *,
        concurrency: int | None = None,
        cache: bool | None = None,
        tenant: str | None = None,
    ) -> Generator[tuple[int, RunResult], None, None]:
        """Run many requests (or code strings) concurrently; yield `(index, result)` pairs as
        runs finish. At most `concurrency` runs are in flight (default: the executor's
        `max_concurrency`), and at most as many results wait for a consumer that is slower
        than the runs: the input is consumed lazily, so a generator of a million requests
        never sits in memory at once. An error (a bad request, the input's own) is raised in
        its result's place; stopping early waits for the runs in flight (not after a Ctrl-C,
        see `concurrently`). `concurrency` above `max_concurrency` is capped there; below 1
        (or not an integer) it is a UsageError. `tenant`: see `run`."""
        if concurrency is not None:
            check_count("concurrency", concurrency, 1)
        width = min(concurrency or self.max_concurrency, self.max_concurrency)

        def run(item: RunRequest | str) -> RunResult:
            request = item if isinstance(item, RunRequest) else make_request(item)
            return self.run_request(request, cache=cache, tenant=tenant)

        return concurrently(run, requests, width)

    def approve(
        self,
        run_id: str,
        *,
        approved_by: str | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        secrets: Iterable[str] = (),
        bound_secrets: Sequence[BoundSecret | Mapping[str, Any]] = (),
    ) -> RunResult:
        """Release a run the policy held (`needs_approval`): run it now, once. A run whose
        record keeps secrets redacted needs them again (`secrets`; UsageError otherwise);
        secrets bound to hosts are never recorded: give them again as `bound_secrets`."""
        return rerun_mod.approve(
            self,
            run_id,
            approved_by=approved_by,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            secrets=secrets,
            bound_secrets=bound_secrets,
        )

    def replay(self, run_id: str, *, secrets: Iterable[str] = ()) -> ReplayReport:
        """Run a recorded run again under its recorded limits and compare the outcomes.
        A record that keeps secrets redacted (in its code, stdin, environment or inputs)
        cannot be replayed exactly without them: give them again as `secrets` (checked
        against the recorded sha256 before anything runs), or UsageError says which parts
        need them."""
        return rerun_mod.replay(self, run_id, secrets=secrets)

    def rerun(
        self,
        request: RunRequest,
        origin: Origin,
        secrets: tuple[str, ...],
        session_id: str | None,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        bound: tuple[Binding, ...] = (),
    ) -> RunResult:
        """A recorded request through the pipeline again, uncached (`rerun.approve` and
        `rerun.replay` call it, with the secrets already checked and bound)."""
        secrets += tuple(s for b in bound for s in (b.value, b.placeholder))
        options = Options(cache=False, bound=bound)
        return self._pipeline(request, origin, options, secrets, session_id, on_stdout, on_stderr)

    def close(self) -> None:
        """Stop the fork server; nothing the executor started keeps running."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._reaper.stop()
        for session in self.live_sessions():
            session.kill("was ended because the executor was closed", Status.sandbox_error)
            session.end("was ended because the executor was closed")
        with self._lock:
            self._backend.close()
            self.store.close()

    def __enter__(self) -> Executor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def run(
    code: str | bytes,
    *,
    language: str = "python",
    stdin: bytes | str | None = None,
    files: Mapping[str, FileSource] | None = None,
    limits: Limits | Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    profile: str = "data",
    network: str | Sequence[str] = "none",
    cache: bool | None = None,
    secrets: Iterable[str] = (),
    environment: str | None = None,
    bound_secrets: Sequence[BoundSecret | Mapping[str, Any]] = (),
) -> RunResult:
    """One-shot convenience: start an Executor, run `code` as `Executor.run` does, close it."""
    with Executor() as executor:
        return executor.run(
            code,
            language=language,
            stdin=stdin,
            files=files,
            limits=limits,
            env=env,
            profile=profile,
            network=network,
            cache=cache,
            secrets=secrets,
            environment=environment,
            bound_secrets=bound_secrets,
        )
