"""Policy check and Execute: every program the agent runs goes through the executor.

The policy check here is the early, explainable refusal (rule, message, line) that goes back to
Generate without running anything; the executor checks again, and the sandbox is the boundary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .. import policy as policy_mod
from ..budget import Budget
from ..contract import Limits, RunResult
from ..errors import UsageError
from ..executor import Executor
from ..request import make_request


@dataclass(frozen=True)
class PolicyOutcome:
    allowed: bool
    decision: str
    rule: str | None
    message: str | None
    line: int | None


def effective_limits(executor: Executor, limits: Limits | None, profile: str) -> Limits:
    """The limits a run will get under `profile` (what Generate is told)."""
    request = make_request("pass", limits=limits, profile=profile)
    verdict = policy_mod.check(request, executor.profiles)
    if verdict.decision != "allow":
        raise UsageError(f"the ask's limits are refused by the policy: {verdict.message}")
    return verdict.limits


def check_policy(
    executor: Executor, code: str, files: Mapping[str, bytes], limits: Limits | None, profile: str
) -> PolicyOutcome:
    request = make_request(code, files=files, limits=limits, profile=profile)
    verdict = policy_mod.check(request, executor.profiles)
    return PolicyOutcome(
        verdict.decision == "allow", verdict.decision, verdict.rule, verdict.message, verdict.line
    )


def execute(
    executor: Executor,
    code: str,
    files: Mapping[str, bytes],
    limits: Limits | None,
    profile: str,
    budget: Budget,
) -> RunResult:
    # The executor's cache setting applies: a cache hit is recorded under its own run id and
    # points at the run it came from, so it is evidence too.
    return executor.run(code, files=files, limits=limits, profile=profile, budget=budget)
