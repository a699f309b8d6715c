"""The ask's spending: model tokens, execution time and artifacts, each with its circuit
breaker, which ends the ask with a clean failure (`Breaker`) instead of spending more."""

from __future__ import annotations

from ..budget import Budget
from ..contract import RunResult, Status
from .llm import ModelCall
from .models import AskSettings, TokenUsage
from .trace import Recorder


class Breaker(Exception):
    """A breaker tripped: `kind` names the limit, `message` the setting that raises it."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class Meter:
    """What the ask has spent so far, and the runs it made."""

    def __init__(self, settings: AskSettings, trace: Recorder) -> None:
        self.settings = settings
        self.trace = trace
        self.usage = TokenUsage()
        self.budget = Budget(exec_s=settings.max_exec_s, artifact_bytes=settings.max_artifact_bytes)
        self.artifact_files = 0
        self.run_ids: list[str] = []

    def on_call(self, call: ModelCall) -> None:
        self.usage.input_tokens += call.input_tokens
        self.usage.output_tokens += call.output_tokens
        self.usage.requests += call.requests
        self.trace.call(
            call.stage,
            call.model,
            call.input_tokens,
            call.output_tokens,
            call.requests,
            call.duration_ms,
            call.ok,
            call.error,
        )

    def check_tokens(self) -> None:
        if self.usage.total_tokens > self.settings.max_tokens:
            raise Breaker(
                "tokens",
                f"token budget of {self.settings.max_tokens} spent "
                f"({self.usage.total_tokens} tokens used); raise max_tokens",
            )

    def account(self, run: RunResult) -> None:
        if run.run_id:
            self.run_ids.append(run.run_id)
        if run.status is Status.budget_exceeded:
            message = run.error.message if run.error else "execution-time budget spent"
            raise Breaker("exec_time", f"{message} (max_exec_s {self.settings.max_exec_s:g})")
        self.artifact_files += len(run.artifacts)
        if self.artifact_files > self.settings.max_artifact_files:
            raise Breaker(
                "artifacts",
                f"{self.artifact_files} artifact files written, more "
                f"than max_artifact_files {self.settings.max_artifact_files}",
            )
        spent = self.budget.remaining_artifact_bytes == 0
        if run.artifacts_truncated and spent:
            raise Breaker(
                "artifacts",
                f"artifact budget of {self.settings.max_artifact_bytes} "
                "bytes spent; raise max_artifact_bytes",
            )
