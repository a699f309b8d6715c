"""What one server holds: the executor, keys, quotas, metrics and the tenants' live sessions."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.to_thread

from ..contract import NetworkConnection, RunResult
from ..errors import SessionClosed
from . import malloc
from .auth import ANONYMOUS_NAME, LOCAL_NAME, KeyStore, Tenant
from .errors import ApiError
from .metrics import Metrics
from .quotas import Backoff, BodyBudget, Quotas
from .spool import ResultBudget, Spool
from .sse import Buffered

if TYPE_CHECKING:
    from ..executor import Executor
    from ..sessions import Session
    from .e2b.access import Sandboxes

log = logging.getLogger(__name__)
T = TypeVar("T")

LOCAL_TENANT = Tenant(LOCAL_NAME, max_concurrent=1 << 30, max_sessions=1 << 30, rpm=1 << 30)
# --no-auth's callers on the TCP port: never the local socket's tenant, whose port any user of
# the host may reach (they would share its cache and records).
ANONYMOUS_TENANT = Tenant(ANONYMOUS_NAME, max_concurrent=1 << 30, max_sessions=1 << 30, rpm=1 << 30)
ENDED_KEPT = 10_000  # ended sessions remembered, so late calls get session_closed, not 404
AUTH_THREADS = 8
SESSION_START_BURST = 4  # starts a key may make at once after a pause: a default quota's worth  # key lookups at once: short database reads, on threads of their own


class EndedSession:
    """What is left of a session that has ended: its id and why; every call says so."""

    closed = True

    def __init__(
        self,
        session_id: str,
        end_reason: str | None,
        network_log_after_cells: list[NetworkConnection] | None = None,
    ) -> None:
        self.id = session_id
        self.end_reason = end_reason
        self.network_log_after_cells = network_log_after_cells or []
        self.files = self

    def _ended(self, *_args: Any, **_kwargs: Any) -> Any:
        raise SessionClosed(
            f"session {self.id} has ended ({self.end_reason or 'closed'}); start a new session"
        )

    run = write = read = list = remove = make_dir = rename = tree = usage = _ended

    def interrupt(self, reason: str) -> bool:
        return False

    def close(self) -> None:
        pass


@dataclass
class Settings:
    """How a server behaves; `execbox serve` fills it from its options."""

    auth: bool = True
    """Require `Authorization: Bearer KEY`; without it every TCP caller is the tenant 'anonymous'."""
    max_request_bytes: int = 32 << 20
    """Largest request body accepted; bigger ones get a 413."""
    request_bodies_bytes: int | None = None
    """Request-body bytes all requests in flight may hold, server-wide (one key: half); past
    it, 503. None: 8 times `max_request_bytes`."""
    max_inflight_runs: int = 64
    """Runs and cells the server hands to the executor at once (worker threads)."""
    docs: bool = False
    """Serve /docs, /redoc and /openapi.json (without a key: the schema is public)."""
    max_result_bytes: int = 2 << 30
    """Result bytes in flight, server-wide: what running runs and cells may return (outputs and
    artifacts at their caps) plus artifacts spooled and not yet downloaded; past it, 503."""
    tenant_result_bytes: int | None = None
    """The most of `max_result_bytes` one key may hold at once (past it, 429); None: half."""
    spool_dir: str | None = None
    """Where the spool of artifacts is made (a private directory inside); None: the system's
    temporary directory."""
    artifact_ttl_s: float = 600.0
    """How long a run's spooled artifacts wait for their download."""
    e2b: bool = False
    """Serve the E2B-compatible API under /e2b (`execbox.server.e2b`): E2B's SDKs run against
    it with `E2B_API_URL` and `E2B_SANDBOX_URL` set to the server's /e2b."""
    stream_buffer_bytes: int = 1 << 20
    """Output a streamed run or cell may have waiting for a slow reader; past it the stream
    says so in an `overflow` event and sends no more output (the result still has it all)."""
    max_session_idle_s: float = 3600.0
    """Longest `idle_timeout_s` a session may ask for (server policy)."""
    max_session_lifetime_s: float = 86400.0
    """Longest `max_lifetime_s` a session may ask for (server policy)."""
    session_starts_per_key: int = 1
    """Sessions one key may have starting at once (past it, 429): a start is CPU-bound (an
    interpreter's import), so one key's flood of starts keeps to one core of the server's."""
    session_starts_per_s: float = 1.0
    """Sessions one key may start a second, after a burst of `SESSION_START_BURST` (past it,
    429): the per-key cap serialises starts but does not make them cheaper."""
    header_timeout_s: float = 10.0
    """A request's line and headers must arrive within this long (else 408 and closed)."""
    body_timeout_s: float = 60.0
    """A request's body must arrive within this long of its headers (else closed)."""
    max_connections_per_client: int = 64
    """Open connections from one client address; more are answered 503 and closed (0: no
    cap; behind a reverse proxy every client has the proxy's address)."""
    listen_backlog: int = 128
    """Connections the kernel queues until the server accepts them. Past it a client's new
    connections wait for its kernel to retry (1 s, then longer): a client reconnecting in a loop
    past its connection cap is slowed there instead of taking the server's event loop, which
    sets up each queued connection before it serves anything else."""
    allowed_hosts: tuple[str, ...] = ()
    """Host names the server answers to besides addresses and `localhost`: names, `*.suffix`
    wildcards, or `*` for any (the defence against DNS rebinding; see `server.hosts`)."""
    console_idle_s: float = 12 * 3600.0
    """A console login ends after this long without a page view (and at once with its key)."""
    executor_options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the Executor the server starts (when none is passed in)."""


@dataclass(frozen=True)
class Shares:
    """How a server's sessions are shared: its capacity and each active key's quota.

    Each key is guaranteed `reserved(key)` sessions: its quota when the quotas fit the
    capacity, else its proportional share of it. A key may go past its guarantee (up to its
    quota) only with sessions nobody else is still owed."""

    capacity: int
    quotas: dict[str, int]

    def reserved(self, tenant: str) -> int:
        quota, total = self.quotas.get(tenant, 0), sum(self.quotas.values())
        return quota if total <= self.capacity else self.capacity * quota // total


class SessionRegistry:
    """Live sessions by id, each with its tenant. A tenant finds only its own."""

    def __init__(
        self, starts_per_key: int | None = None, starts_per_s: float | None = None
    ) -> None:
        """`starts_per_key`: sessions one key may have starting at once; `starts_per_s`:
        sessions one key may start a second, spaced evenly (None: no cap)."""
        if starts_per_key is not None and starts_per_key < 1:
            raise ValueError(f"starts_per_key is at least 1, not {starts_per_key}")
        if starts_per_s is not None and not starts_per_s > 0:
            raise ValueError(f"starts_per_s is above 0, not {starts_per_s}")
        self.starts_per_key, self.starts_per_s = starts_per_key, starts_per_s
        self._start_tokens: dict[str, tuple[float, float]] = {}  # key: (tokens, at)
        self._lock = threading.Lock()
        self._sessions: dict[str, tuple[str, Session]] = {}
        self._ended: OrderedDict[str, tuple[str, EndedSession]] = OrderedDict()
        self._pending: dict[str, int] = {}
        self._gates: dict[str, asyncio.Lock] = {}

    def reserve(self, tenant: Tenant, shares: Shares | None = None) -> None:
        """Count a session about to be created against the tenant's quota and, with `shares`,
        its share of the server's sessions; or raise 429."""
        with self._lock:
            self._prune()
            held: dict[str, int] = dict(self._pending)
            for owner, _ in self._sessions.values():
                held[owner] = held.get(owner, 0) + 1
            mine = held.get(tenant.name, 0)
            starting = self._pending.get(tenant.name, 0)
            most = tenant.session_starts or self.starts_per_key
            if most is not None and starting >= most:
                raise ApiError(
                    429,
                    "session_starts",
                    f"key {tenant.name!r} may have {most} session(s) starting at once "
                    "(execbox keys create --session-starts, else --session-starts-per-key of "
                    "execbox serve or mcp); retry when one has started",
                    retry_after=1,
                )
            tokens = self._start_token(tenant.name)
            if tokens < 1:
                assert self.starts_per_s is not None
                raise ApiError(
                    429,
                    "session_starts",
                    f"key {tenant.name!r} may start {self.starts_per_s:g} session(s) a "
                    f"second after a burst of {SESSION_START_BURST} (--session-starts-per-s of "
                    "execbox serve or mcp)",
                    retry_after=math.ceil((1 - tokens) / self.starts_per_s),
                )
            if mine >= tenant.max_sessions:
                raise ApiError(
                    429,
                    "session_quota",
                    f"key {tenant.name!r} may keep {tenant.max_sessions} sessions "
                    "open; close one first",
                    retry_after=5,
                )
            if shares is not None:
                free = shares.capacity - sum(held.values())
                owed = sum(
                    max(0, shares.reserved(name) - held.get(name, 0))
                    for name in shares.quotas
                    if name != tenant.name
                )
                if free <= 0 or (mine >= shares.reserved(tenant.name) and free - 1 < owed):
                    raise ApiError(
                        429,
                        "session_capacity",
                        f"the server's {shares.capacity} sessions (execbox serve "
                        f"--max-sessions) are in use or owed to other keys; key "
                        f"{tenant.name!r} is guaranteed "
                        f"{shares.reserved(tenant.name)} and holds {mine}; close "
                        "one or retry later",
                        retry_after=5,
                    )
            self._pending[tenant.name] = self._pending.get(tenant.name, 0) + 1
            if self.starts_per_s is not None:
                self._start_tokens[tenant.name] = (tokens - 1, time.monotonic())

    def add(self, tenant: Tenant, session: Session | None) -> None:
        """Settle a reservation: register the new session, or drop it if creation failed."""
        with self._lock:
            self._pending[tenant.name] -= 1
            if session is not None:
                self._sessions[session.id] = (tenant.name, session)
                self._gates[session.id] = asyncio.Lock()

    def get(self, tenant: Tenant, session_id: str) -> Session | EndedSession:
        with self._lock:
            entry = self._sessions.get(session_id) or self._ended.get(session_id)
        if entry is None or entry[0] != tenant.name:
            raise ApiError(404, "session_not_found", f"no session {session_id!r}")
        return entry[1]

    def gate(self, session_id: str) -> asyncio.Lock:
        """The lock a call on the session holds, from before its thread until after it (an
        ended session's calls fail at once: each gets a lock of its own)."""
        with self._lock:
            return self._gates.get(session_id) or asyncio.Lock()

    def active(self) -> int:
        with self._lock:
            return sum(1 for _, s in self._sessions.values() if not s.closed)

    def open_ids(self) -> set[str]:
        """The ids of the sessions still open (whoever's: callers filter by owner)."""
        with self._lock:
            return {sid for sid, (_, s) in self._sessions.items() if not s.closed}

    def _start_token(self, key: str) -> float:
        """The key's session starts available now (a token bucket; inf: no rate)."""
        if self.starts_per_s is None:
            return math.inf
        now = time.monotonic()
        tokens, at = self._start_tokens.get(key, (SESSION_START_BURST, now))
        return min(SESSION_START_BURST, tokens + (now - at) * self.starts_per_s)

    def _prune(self) -> None:
        for sid in [sid for sid, (_, s) in self._sessions.items() if s.closed]:
            owner, session = self._sessions.pop(sid)
            self._gates.pop(sid, None)
            self._ended[sid] = (
                owner,
                EndedSession(sid, session.end_reason, session.network_log_after_cells),
            )
        while len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)

    def close_all(self) -> int:
        with self._lock:
            sessions = [s for _, s in self._sessions.values()]
            self._sessions.clear()
            self._gates.clear()
        closed = 0
        for session in sessions:
            try:
                if not session.closed:
                    session.close()
                    closed += 1
            except Exception:  # noqa: BLE001 - shutting down: close the others regardless
                log.exception("closing session %s", session.id)
        return closed


class ServerState:
    def __init__(self, settings: Settings, executor: Executor | None) -> None:
        self.settings = settings
        self.executor_given = executor is not None
        self._executor = executor
        self.keys: KeyStore | None = None
        self.e2b: Sandboxes | None = None  # the E2B face's sandboxes, when it is served
        self.quotas = Quotas()
        self.backoff = Backoff()
        self.sessions = SessionRegistry(
            settings.session_starts_per_key, settings.session_starts_per_s
        )
        self.metrics = Metrics(
            lambda: float(self.sessions.active()),
            lambda: float(self._executor.pool_size if self._executor else 0),
        )
        self.run_limiter = anyio.CapacityLimiter(settings.max_inflight_runs)
        self.auth_limiter = anyio.CapacityLimiter(AUTH_THREADS)
        self.streams = Buffered()
        bodies = settings.request_bodies_bytes or 8 * settings.max_request_bytes
        if bodies // 2 < settings.max_request_bytes:
            raise ValueError(
                "request_bodies_bytes must be at least twice max_request_bytes "
                "(one key may hold half of it)"
            )
        self.bodies = BodyBudget(bodies, bodies // 2)
        malloc.return_big_blocks()
        self.results = ResultBudget(
            settings.max_result_bytes,
            settings.tenant_result_bytes or settings.max_result_bytes // 2,
        )
        self._spool: Spool | None = None
        self.draining = False
        self._cut: asyncio.Event | None = None  # set when the shutdown grace period runs out
        self._inflight = 0
        self._idle = threading.Condition()
        if executor is not None:
            self.keys = KeyStore(executor.store.engine)

    @property
    def executor(self) -> Executor:
        if self._executor is None or self.draining:
            raise ApiError(503, "not_ready", "the server is starting or shutting down")
        return self._executor

    @property
    def spool(self) -> Spool:
        if self._spool is None:
            raise ApiError(503, "not_ready", "the server is starting or shutting down")
        return self._spool

    def start(self) -> None:
        self._spool = Spool(self.settings.spool_dir, self.settings.artifact_ttl_s)
        if self._executor is None:
            from ..executor import Executor

            self._executor = Executor(**self.settings.executor_options)
            self.keys = KeyStore(self._executor.store.engine)

    def stop(self, drain_timeout_s: float = 15.0) -> None:
        """Close every session, then the executor if this server started it, then wait for
        the runs still on worker threads to be recorded (closing the executor ends them)."""
        self.draining = True
        closed = self.sessions.close_all()
        if closed:
            log.info("closed %d session(s) at shutdown", closed)
        if self._executor is not None and not self.executor_given:
            self._executor.close()
        with self._idle:
            if not self._idle.wait_for(lambda: self._inflight == 0, drain_timeout_s):
                log.warning("%d run(s) still on worker threads at exit", self._inflight)
        if self._spool is not None:
            self._spool.close()

    def key_store(self) -> KeyStore:
        if self.keys is None:
            raise ApiError(503, "not_ready", "the server is starting")
        return self.keys

    async def blocking(self, fn: Callable[[], T]) -> T:
        """Run a short blocking call (database, files) off the event loop."""
        return await anyio.to_thread.run_sync(fn)

    def shares(self) -> Shares | None:
        """How sessions are shared among the active keys (None without auth: one tenant)."""
        if not self.settings.auth:
            return None
        return Shares(self.executor.max_sessions, self.key_store().session_quotas())

    async def on_session(self, session_id: str, fn: Callable[[], T], *, cell: bool) -> T:
        """`fn`, a call on the session, once no other call is on it: a cell waits its turn
        on the event loop (already admitted, so the tenant's in-flight limit bounds the
        queue); a file call on a busy session is a 409 at once. No worker thread ever waits
        for a session."""
        gate = self.sessions.gate(session_id)
        if not cell and gate.locked():
            raise ApiError(
                409,
                "session_busy",
                f"session {session_id} is running a cell or another file call; "
                "file calls do not queue: retry when it is done",
                retry_after=1,
            )
        await gate.acquire()
        loop = asyncio.get_running_loop()
        claim = threading.Lock()  # taken by the thread when it starts, or by a cancellation

        def release() -> None:
            try:
                loop.call_soon_threadsafe(gate.release)
            except RuntimeError:  # the loop is gone (shut down): nobody waits any more
                pass

        def gated() -> T:
            if not claim.acquire(blocking=False):
                raise RuntimeError("the request was cancelled before its call started")
            try:
                return fn()
            finally:
                release()

        try:
            return await (self.running(gated) if cell else self.blocking(gated))
        except BaseException:
            if claim.acquire(blocking=False):  # the call never started and never will
                gate.release()
            raise

    def begin_drain(self, grace_s: float | None) -> None:
        """Shutdown has begun (called on the event loop): refuse new work, and just before
        the grace period ends answer the runs still going with `server_shutting_down`, so
        their callers get a clear error rather than a dropped connection."""
        self.draining = True
        if grace_s is not None and self._cut is not None:
            margin = min(1.0, grace_s / 4)
            asyncio.get_running_loop().call_later(max(0.0, grace_s - margin), self._cut.set)

    def arm(self) -> None:
        """Bind the shutdown cut-off to the running event loop (at startup)."""
        self._cut = asyncio.Event()

    async def running(self, fn: Callable[[], T]) -> T:
        """Run a sandbox call (a run or a cell) off the event loop, within the run limiter.
        If shutdown's grace period runs out first, the request answers 503
        `server_shutting_down` and lets go of the thread; the run then ends when the executor
        closes, and `stop` waits for it to be recorded."""
        call = asyncio.ensure_future(self._in_thread(fn))
        if self._cut is None:
            return await call
        cut = asyncio.ensure_future(self._cut.wait())
        try:
            await asyncio.wait({call, cut}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the request itself was cancelled: the thread goes on alone
            call.cancel()
            raise
        finally:
            cut.cancel()
        if call.done():
            return call.result()
        call.cancel()
        raise ApiError(
            503,
            "server_shutting_down",
            "the server shut down before this run finished; the run was ended "
            "(its record says so); send it again",
            retry_after=5,
        )

    async def _in_thread(self, fn: Callable[[], T]) -> T:

        def counted() -> T:
            with self._idle:
                self._inflight += 1
            try:
                return fn()
            finally:
                with self._idle:
                    self._inflight -= 1
                    self._idle.notify_all()

        return await anyio.to_thread.run_sync(
            counted, limiter=self.run_limiter, abandon_on_cancel=True
        )

    def finish(self, kind: str, tenant: Tenant, result: RunResult, started: float) -> None:
        """Book a finished run: its owner and its metrics (called on the worker thread)."""
        self.key_store().claim_run(result.run_id, tenant.name)
        self.metrics.observe(kind, result, time.perf_counter() - started)
