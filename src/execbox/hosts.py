"""Which sandbox host serves a run: one shared by every caller, or one per tenant, in each
environment runs name; each is replaced on a schedule.

Hosts are keyed by (environment, tenant): the environment is the image digest of a named
environment other than the default (None for the default), the tenant None unless hosts are
per tenant. The default environment's shared host starts with the executor and stays; the
others start at their first run and close once idle (`environment_idle_s`, and
`tenant_idle_s` for hosts per tenant).

Every program forked from one zygote has the zygote's memory layout (library and heap
addresses, `id()` values) and, by fork, its stack canary, glibc's pointer guard and Python's
str hash secret: an address one run leaks holds for every later run of that host. Replacing
the host after `rotate_after_runs` runs or `rotate_after_s` seconds, whichever comes first,
bounds how many runs and how long one layout serves; a host per tenant means that no two
tenants ever share one.

A replacement starts in the background and serves once it is ready, its heavy zygote and its
pool included; until then the old host serves everything, so no run waits for it (unless the
old host died). The old host is then retired: it hands out nothing more, and closes once its
runs in flight and its sessions have ended (a session never moves).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import UsageError
from .sandbox.host.channel import SessionChannel
from .sandbox.host.errors import HostError, HostRetired
from .sandbox.host.pool import SLOT_KINDS
from .sandbox.host.slot import Slot
from .sandbox.host.zygotes import ZygoteProcess

log = logging.getLogger(__name__)

# A host's start and close (the heavy zygote's imports and training, the pool staged) stays
# a small share of what 30000 runs use (bench/rotation.py; docs/PERFORMANCE.md).
DEFAULT_ROTATE_AFTER_RUNS = 30_000
DEFAULT_ROTATE_AFTER_S = 300.0
DEFAULT_TENANT_IDLE_S = 300.0
DEFAULT_ENVIRONMENT_IDLE_S = 300.0
READY_WAIT_S = 60.0  # how long a replacement may take to stage its pool before it serves
RETRY_S = 30.0  # after a replacement failed to start, how long until the next try
CHECK_S = 1.0  # how often the keeper looks at the hosts' ages and idleness


@dataclass
class _Entry:
    """The host of one tenant (or the shared one) and what is being done to it."""

    last_used: float
    host: ZygoteProcess | None = None
    starting: threading.Lock = field(default_factory=threading.Lock)  # a start in the caller
    replacing: bool = False  # a replacement is being started in the background
    retry_at: float = 0.0


Key = tuple[str | None, str | None]  # (environment digest, tenant); None: default, shared


class Hosts:
    """The executor's sandbox hosts, by environment and tenant (the tenant None is the shared
    host; without `per_tenant` every tenant gets it). A host starts on its first use (`start`
    is given its environment), is replaced when due (see the module) or dead, and closes once
    idle with no run in flight and no session open: after `tenant_idle_s` with `per_tenant`,
    after `environment_idle_s` in an environment other than the default (the shorter when
    both hold). One thread (the keeper) starts replacements and closes idle hosts."""

    def __init__(
        self,
        start: Callable[[str | None], ZygoteProcess],
        *,
        rotate_after_runs: int | None,
        rotate_after_s: float | None,
        per_tenant: bool,
        tenant_idle_s: float | None,
        environment_idle_s: float | None = None,
    ) -> None:
        self._start = start
        self.rotate_after_runs = rotate_after_runs or None
        self.rotate_after_s = rotate_after_s or None
        self.per_tenant = per_tenant
        self.tenant_idle_s = tenant_idle_s or None
        self.environment_idle_s = environment_idle_s or None
        self._lock = threading.Lock()
        self._entries: dict[Key, _Entry] = {}
        self._retired: list[ZygoteProcess] = []  # replaced, closing once drained
        self.replacements = 0  # hosts replaced on schedule
        self._closed = False
        self._wake = threading.Event()
        self._keeper = threading.Thread(target=self._loop, name="execbox-hosts", daemon=True)
        self._keeper.start()

    def get(
        self, tenant: str | None = None, environment: str | None = None, *, check: bool = True
    ) -> ZygoteProcess:
        """The live host for `tenant` in `environment`, started (or restarted, when it died)
        here if need be: SandboxUnavailable when it cannot start, UsageError once closed.
        `check=False`: a host already started is returned without polling its zygotes (for a
        caller that `take`s a slot next, which checks)."""
        key = (environment, tenant if self.per_tenant else None)
        while True:
            now = time.monotonic()
            with self._lock:
                if self._closed:
                    raise UsageError("this Executor is closed")
                entry = self._entries.get(key)
                if entry is None:
                    entry = self._entries[key] = _Entry(last_used=now)
                entry.last_used = now
                host = entry.host
                if host is not None and (not check or host.alive()):
                    if not entry.replacing and self._due(host, now):
                        entry.replacing = True
                        self._wake.set()
                    return host
            with entry.starting:
                host = entry.host
                if host is None or (check and not host.alive()):
                    if host is not None:
                        log.warning("the zygote died; starting a new one")
                        host.close()
                    host = self._start(environment)
                    with self._lock:
                        if self._closed or self._entries.get(key) is not entry:
                            host.close()  # closed, or its entry closed idle meanwhile: again
                            continue
                        entry.host = host
                return host

    def current(
        self, tenant: str | None = None, environment: str | None = None
    ) -> ZygoteProcess | None:
        """The host serving `tenant` in `environment` now, if one is running (never starts
        one)."""
        with self._lock:
            entry = self._entries.get((environment, tenant if self.per_tenant else None))
            return entry.host if entry is not None else None

    def running(self, tenant: str | None = None) -> dict[str, ZygoteProcess]:
        """The hosts serving `tenant` now in environments other than the default, by digest."""
        key = tenant if self.per_tenant else None
        with self._lock:
            return {
                env: entry.host
                for (env, who), entry in self._entries.items()
                if env is not None and who == key and entry.host is not None
            }

    def take(
        self,
        tenant: str | None,
        kind: str,
        timeout_s: float,
        host: ZygoteProcess | None = None,
        environment: str | None = None,
    ) -> tuple[ZygoteProcess, Slot]:
        """A staged slot of `kind` on `tenant`'s host in `environment`, and the host (which
        runs it); `host`, when given, is what `get` has just returned (its liveness check is
        not repeated)."""
        while True:
            host = host or self.get(tenant, environment)
            try:
                return host, host.take(kind, timeout_s)
            except HostRetired:  # replaced since `get`: its successor serves
                host = None

    def open_session(
        self,
        tenant: str | None,
        slot_wait_s: float,
        environment: str | None = None,
        language: str = "python",
    ) -> SessionChannel:
        """A slot of `tenant`'s host in `environment` for a session (see
        `ZygoteProcess.open_session`)."""
        while True:
            host = self.get(tenant, environment)
            try:
                return host.open_session(slot_wait_s, language)
            except HostRetired:
                continue

    def _due(self, host: ZygoteProcess, now: float) -> bool:
        """Whether `host` should be replaced: after its run quota, or after its time when it
        has served anything (a host no run has seen has leaked nothing)."""
        taken = host.taken
        return bool(
            (self.rotate_after_runs and taken >= self.rotate_after_runs)
            or (self.rotate_after_s and taken and now - host.started_at >= self.rotate_after_s)
        )

    def _loop(self) -> None:
        while True:
            self._wake.wait(CHECK_S)
            self._wake.clear()
            now = time.monotonic()
            with self._lock:
                if self._closed:
                    return
                self._retired = [h for h in self._retired if not h.closed]
                due = []
                for key, entry in self._entries.items():
                    host = entry.host
                    if (
                        host is not None
                        and now >= entry.retry_at
                        and (entry.replacing or self._due(host, now))
                    ):
                        entry.replacing = True
                        due.append((key, entry))
                idle = self._take_idle(now)
            for host in idle:
                host.retire()  # it has nothing in use: it closes at once, in its own thread
            for key, entry in due:
                try:
                    self._replace(key, entry)
                except Exception:  # noqa: BLE001 - the keeper must go on; the old host serves
                    log.exception("replacing the sandbox host failed")
                    entry.replacing, entry.retry_at = False, time.monotonic() + RETRY_S

    def _idle_after(self, key: Key) -> float | None:
        """How long the host of `key` may idle before it closes (None: it stays)."""
        limits = [
            limit
            for limit, applies in (
                (self.tenant_idle_s, self.per_tenant),
                (self.environment_idle_s, key[0] is not None),
            )
            if applies and limit
        ]
        return min(limits) if limits else None

    def _take_idle(self, now: float) -> list[ZygoteProcess]:
        """Take out the hosts idle for longer than they may be (called with the lock held)."""
        idle = []
        for key, entry in list(self._entries.items()):
            host = entry.host
            idle_after = self._idle_after(key)
            if (
                idle_after is not None
                and host is not None
                and not entry.replacing
                and not entry.starting.locked()
                and now - entry.last_used >= idle_after
                and host.alive()
                and not host.in_use()
            ):
                del self._entries[key]
                self._retired.append(host)
                idle.append(host)
                log.info(
                    "the sandbox host of %s closes: idle for %.0f s",
                    _describe(key),
                    now - entry.last_used,
                )
        return idle

    def _replace(self, key: Key, entry: _Entry) -> None:
        """Start the host that replaces `entry`'s, wait until it is ready in full (heavy zygote
        and pool), then have it serve and retire the old one."""
        old = entry.host
        new = self._start(key[0])
        try:
            # What the old host had started by demand (its full zygote), the new one serves
            # from the start.
            for program in old.started_programs() if old is not None else ():
                new.start_program(program)
            for program in new.started_programs():
                if program != "light":
                    new.wait_program(program)
            deadline = time.monotonic() + READY_WAIT_S
            kinds = [k for k in SLOT_KINDS if new.pool.stages(k)]
            while (
                not self._closed
                and time.monotonic() < deadline
                and any(new.pool.ready_count(k) < new.pool.size for k in kinds)
            ):
                time.sleep(0.02)
        except HostError:
            new.close()
            raise
        with entry.starting, self._lock:
            current = not self._closed and self._entries.get(key) is entry and entry.host is old
            if current:
                entry.host = new
                entry.replacing = False
                if old is not None:
                    self._retired.append(old)
                    self.replacements += 1
        if not current:  # closed, idle or restarted meanwhile: the new one is not wanted
            entry.replacing = False
            new.close()
            return
        if old is not None:
            log.info(
                "the sandbox host of %s was replaced after %d runs and %.0f s",
                _describe(key),
                old.taken,
                time.monotonic() - old.started_at,
            )
            old.retire()

    def close(self) -> None:
        """Close every host, retired ones included; runs still in flight on them end."""
        with self._lock:
            self._closed = True
            self._wake.set()
        self._keeper.join(timeout=READY_WAIT_S + 30)
        with self._lock:
            hosts = [e.host for e in self._entries.values() if e.host is not None]
            hosts += self._retired
            self._entries.clear()
            self._retired = []
        for host in hosts:
            host.close()


def _describe(key: Key) -> str:
    environment, tenant = key
    where = f"environment {environment[:19]}" if environment else "the default environment"
    return where + (f", tenant {tenant!r}" if tenant is not None else "")
