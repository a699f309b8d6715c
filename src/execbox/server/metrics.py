"""Prometheus metrics of one server: runs by status, run latency, active sessions, pool size.
Each app has its own registry, so several servers in one process never collide."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..contract import RunResult

BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(
        self, active_sessions: Callable[[], float], pool_size: Callable[[], float]
    ) -> None:
        self.registry = CollectorRegistry()
        self.runs = Counter(
            "execbox_runs",
            "Runs and session cells by final status.",
            ["kind", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "execbox_run_seconds",
            "Time from admission to result, per run or cell.",
            ["kind"],
            buckets=BUCKETS_S,
            registry=self.registry,
        )
        self.rejected = Counter(
            "execbox_rejected_requests",
            "Requests refused, by error code.",
            ["code"],
            registry=self.registry,
        )
        sessions = Gauge("execbox_active_sessions", "Sessions open now.", registry=self.registry)
        sessions.set_function(active_sessions)
        pool = Gauge(
            "execbox_pool_size", "Run slots the executor keeps staged.", registry=self.registry
        )
        pool.set_function(pool_size)

    def observe(self, kind: str, result: RunResult, seconds: float) -> None:
        self.runs.labels(kind=kind, status=result.status.value).inc()
        self.latency.labels(kind=kind).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
