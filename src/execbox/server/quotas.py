"""Per-tenant quotas: requests in flight and requests per minute, counted in this server
process.

Every request that costs the server work (runs, cells, sessions, files, records, artifacts)
holds an in-flight token from admission until its response is delivered or dropped (a streamed
run's token outlives the run until its last event is sent); the per-minute count is a sliding
window of request times, taken for every authenticated request before its body is read. A refusal says how long to wait (Retry-After). Session counts come
from the live sessions themselves (see state), so expiry frees them at once.
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


class Quotas:
    """Counts in-flight requests and recent admissions per tenant. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, int] = defaultdict(int)
        self._recent: dict[str, deque[float]] = defaultdict(deque)

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
                raise ApiError(429, "rate_limited",
                               f"key {tenant.name!r} may make {tenant.rpm} requests per minute "
                               "(every request, including refused ones)",
                               retry_after=max(1, math.ceil(wait)))
            recent.append(now)

    def hold(self, tenant: Tenant) -> Callable[[], None]:
        """Hold one of `tenant`'s in-flight tokens and return its release function
        (idempotent: call it when the request no longer holds anything); or raise a 429."""
        with self._lock:
            if self._running[tenant.name] >= tenant.max_concurrent:
                raise ApiError(429, "concurrency_limited",
                               f"key {tenant.name!r} may have {tenant.max_concurrent} requests "
                               "in flight at once (a streamed run counts until its last event "
                               "is read)", retry_after=1)
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
