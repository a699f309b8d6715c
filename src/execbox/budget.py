"""Budgets across runs: total execution time and total artifact bytes.

A `Budget` is shared by the runs of one task or session (pass the same object to each call).
Each run reserves what it may use before it starts, so concurrent runs can never overshoot
together: its wall-time limit is clipped to the remaining time and its artifact cap to the
remaining bytes; what it did not use is given back when it ends. A run that finds the budget
spent is not started and returns `budget_exceeded`; a run that hits the clipped limit ends as
`budget_exceeded` too, with a message naming the budget.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from .contract import ErrorInfo, Limits, RunResult, Status


@dataclass(frozen=True)
class Reservation:
    limits: Limits
    exec_s: float
    artifact_bytes: int
    time_clipped: bool


class Budget:
    """Execution-time and artifact-byte allowances for a group of runs. Thread-safe."""

    def __init__(self, exec_s: float | None = None, artifact_bytes: int | None = None) -> None:
        if exec_s is not None and exec_s <= 0:
            raise ValueError("exec_s must be positive")
        if artifact_bytes is not None and artifact_bytes < 0:
            raise ValueError("artifact_bytes must not be negative")
        self.exec_s = exec_s
        self.artifact_bytes = artifact_bytes
        self.used_exec_s = 0.0
        self.used_artifact_bytes = 0
        self._reserved_s = 0.0
        self._reserved_bytes = 0
        self._lock = threading.Lock()

    @property
    def remaining_exec_s(self) -> float | None:
        if self.exec_s is None:
            return None
        return max(0.0, self.exec_s - self.used_exec_s - self._reserved_s)

    @property
    def remaining_artifact_bytes(self) -> int | None:
        if self.artifact_bytes is None:
            return None
        return max(0, self.artifact_bytes - self.used_artifact_bytes - self._reserved_bytes)

    def reserve(self, limits: Limits) -> Reservation | str:
        """Reserve this run's share; a message instead when the budget is spent."""
        with self._lock:
            time_left = self.remaining_exec_s
            bytes_left = self.remaining_artifact_bytes
            if time_left is not None and time_left < 0.01:
                return (
                    f"execution-time budget of {self.exec_s:g} s is spent "
                    f"({self.used_exec_s:.2f} s used); start a new budget to run more"
                )
            update: dict[str, float | int | None] = {}
            clipped = False
            if time_left is not None and time_left < limits.timeout_s:
                update["timeout_s"] = time_left
                clipped = True
            if time_left is not None and limits.effective_cpu_s > time_left:
                update["cpu_s"] = time_left
            if bytes_left is not None and bytes_left < limits.artifact_bytes:
                update["artifact_bytes"] = bytes_left
            new = Limits.model_validate(limits.model_dump() | update) if update else limits
            r = Reservation(
                new,
                new.timeout_s if time_left is not None else 0.0,
                new.artifact_bytes if bytes_left is not None else 0,
                clipped,
            )
            self._reserved_s += r.exec_s
            self._reserved_bytes += r.artifact_bytes
            return r

    def settle(self, reservation: Reservation, wall_s: float, artifact_bytes: int) -> None:
        """Charge what the run used and give back the rest of its reservation."""
        with self._lock:
            self._reserved_s -= reservation.exec_s
            self._reserved_bytes -= reservation.artifact_bytes
            if self.exec_s is not None:
                self.used_exec_s += wall_s
            if self.artifact_bytes is not None:
                self.used_artifact_bytes += artifact_bytes


def settled(budget: Budget, reservation: Reservation, result: RunResult) -> RunResult:
    """Budget, after the run: what it used is charged; a run its budget cut short says so."""
    budget.settle(reservation, result.metrics.wall_ms / 1000, sum(a.size for a in result.artifacts))
    if reservation.time_clipped and result.status is Status.timeout:
        return result.model_copy(
            update={
                "status": Status.budget_exceeded,
                "error": ErrorInfo(
                    type="BudgetExceeded",
                    message=(
                        f"execution-time budget of {budget.exec_s:g} s ran out during the run "
                        f"(it had {reservation.limits.timeout_s:.2f} s left)"
                    ),
                ),
            }
        )
    return result
