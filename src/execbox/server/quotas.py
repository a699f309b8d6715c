"""Per-tenant quotas: requests in flight and requests per minute, counted in this server
process.

Every request that costs the server work (runs, cells, sessions, files, records, artifacts)
holds an in-flight token from admission until its response is delivered or dropped (a streamed
run's token outlives the run until its last event is sent); the per-minute count is a sliding
window of request times, taken for every authenticated request before its body is read. A
refusal says how long to wait (Retry-After). Session counts come from the live sessions
themselves (see state), so expiry frees them at once.

A refusal is cheap but not free, and a client may ignore Retry-After: `Backoff` gives a key
whose requests keep being refused back-pressure before any of its next request is read.
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable

from .auth import Tenant
from .errors import ApiError

WINDOW_S = 60.0
# Requests of any kind (refused ones too) one key may have in flight: this many per run slot.
REQUESTS_PER_SLOT = 4


class Quotas:
    """Counts in-flight requests and recent admissions per tenant. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, int] = defaultdict(int)
        self._recent: dict[str, deque[float]] = defaultdict(deque)
        self._requests: dict[str, int] = defaultdict(int)

    def enter(self, tenant: Tenant) -> Callable[[], None]:
        """Count one request of any kind in flight for `tenant` until the returned function is
        called; or raise a 429 when it has `REQUESTS_PER_SLOT` per run slot (plus as many) in
        flight already: a flood of requests that will be refused is bounded too."""
        most = REQUESTS_PER_SLOT * (tenant.max_concurrent + 1)
        with self._lock:
            if self._requests[tenant.name] >= most:
                raise ApiError(
                    429,
                    "too_many_requests",
                    f"key {tenant.name!r} may have {most} requests of any kind in "
                    "flight at once (refused ones included)",
                    retry_after=1,
                )
            self._requests[tenant.name] += 1

        def leave() -> None:
            with self._lock:
                self._requests[tenant.name] -= 1
                if not self._requests[tenant.name]:
                    del self._requests[tenant.name]

        return leave

    def admit(self, tenant: Tenant) -> Callable[[], None]:
        """Count one request for `tenant` and hold a token for it: `count` then `hold`."""
        self.count(tenant)
        return self.hold(tenant)

    def count(self, tenant: Tenant) -> None:
        """Count one request against `tenant`'s rate, or raise a 429 with a retry hint. The
        HTTP server counts every authenticated request here before reading its body, so
        requests that end in 404 or 422 count too."""
        now = time.monotonic()
        with self._lock:
            recent = self._recent[tenant.name]
            while recent and recent[0] <= now - WINDOW_S:
                recent.popleft()
            if len(recent) >= tenant.rpm:
                wait = recent[0] + WINDOW_S - now if recent else WINDOW_S
                raise ApiError(
                    429,
                    "rate_limited",
                    f"key {tenant.name!r} may make {tenant.rpm} requests per minute "
                    "(every request, including refused ones)",
                    retry_after=max(1, math.ceil(wait)),
                )
            recent.append(now)

    def hold(self, tenant: Tenant) -> Callable[[], None]:
        """Hold one of `tenant`'s in-flight tokens and return its release function
        (idempotent: call it when the request no longer holds anything); or raise a 429."""
        with self._lock:
            if self._running[tenant.name] >= tenant.max_concurrent:
                raise ApiError(
                    429,
                    "concurrency_limited",
                    f"key {tenant.name!r} may have {tenant.max_concurrent} requests "
                    "in flight at once (a streamed run counts until its last event "
                    "is read)",
                    retry_after=1,
                )
            self._running[tenant.name] += 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if not released:
                    released = True
                    self._running[tenant.name] -= 1

        return release

    def running(self, tenant: str) -> int:
        with self._lock:
            return self._running[tenant]


class Backoff:
    """Back-pressure on a key whose requests keep being refused (400, 409, 413, 422, 429).

    After `n` refusals in a row the key's requests are spaced `base_s * 2**(n-1)` apart (at
    most `max_s`): each waits for its turn on the event loop, holding no thread, before any of
    its body is read. A turn further than `max_wait_s` away is not queued: that request is
    refused, after a pause of one spacing, so a client that retries at once still waits. A
    request the server serves (2xx, 3xx) ends the back-off. Used on the event loop only."""

    def __init__(self, base_s: float = 0.05, max_s: float = 1.0, max_wait_s: float = 4.0) -> None:
        self.base_s, self.max_s, self.max_wait_s = base_s, max_s, max_wait_s
        self._strikes: dict[str, int] = {}
        self._next: dict[str, float] = {}  # when the key's next request may start

    def spacing(self, key: str) -> float:
        """Seconds between the key's requests now (0: it is not backing off)."""
        strikes = self._strikes.get(key, 0)
        return min(self.max_s, self.base_s * 2 ** min(strikes - 1, 30)) if strikes else 0.0

    def turn(self, key: str) -> float | None:
        """Seconds this request of `key` waits for its turn (booked); None if its turn is
        further away than `max_wait_s` (refuse it, after `spacing`)."""
        spacing = self.spacing(key)
        if not spacing:
            return 0.0
        now = time.monotonic()
        start = max(now, self._next.get(key, now))
        if start - now > self.max_wait_s:
            return None
        self._next[key] = start + spacing
        return start - now

    def refused(self, key: str) -> None:
        self._strikes[key] = self._strikes.get(key, 0) + 1

    def served(self, key: str) -> None:
        if self._strikes.pop(key, None) is not None:
            self._next.pop(key, None)


class BodyBudget:
    """Request-body bytes in flight, server-wide and per key. Thread-safe."""

    def __init__(self, total: int, per_key: int) -> None:
        self.total, self.per_key = total, per_key
        self._lock = threading.Lock()
        self._used = 0
        self._by_key: dict[str, int] = defaultdict(int)

    def take(self, key: str, nbytes: int) -> bool:
        with self._lock:
            if self._used + nbytes > self.total or self._by_key[key] + nbytes > self.per_key:
                return False
            self._used += nbytes
            self._by_key[key] += nbytes
            return True

    def give(self, key: str, nbytes: int) -> None:
        with self._lock:
            self._used -= nbytes
            self._by_key[key] -= nbytes
            if not self._by_key[key]:
                del self._by_key[key]

    def used(self) -> int:
        with self._lock:
            return self._used
