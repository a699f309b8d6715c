"""Drafting the answer: each draft is grounded against the outputs (`ground`), then one
review call judges the output and the draft; an ungrounded or unfaithful draft is redrafted
with the discrepancy named, at most `ANSWER_DRAFTS` drafts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..contract import RunResult
from . import answer as answer_mod
from . import ground, verify
from .attempt import Attempt
from .evidence import Context, Evidence
from .llm import LLM
from .models import Plan, Verdict
from .trace import Recorder

ANSWER_DRAFTS = 3  # the first draft and two redrafts with the discrepancy named


def answer_and_review(
    att: Attempt,
    number: int,
    run: RunResult,
    *,
    llm: LLM,
    question: str,
    plan: Plan,
    files: dict[str, bytes],
    trace: Recorder,
    stage_call: Callable[..., Any],
) -> None:
    """Draft the answer and ground it; then one review call judges the output (a failure
    goes back to Generate) and the draft (a failure goes back to the answer stage)."""
    outputs = att.outputs()
    evidence = Evidence.of(outputs, run.artifacts, run.run_id)
    context = Context(
        question,
        att.code,
        tuple(files),
        tuple(header(data) for data in files.values()),
    )
    draft: str | None = None
    problems: str | None = None
    last: list[Verdict] = []
    for n in range(1, ANSWER_DRAFTS + 1):
        draft, started = stage_call(
            "answer",
            answer_mod.draft_answer,
            llm,
            question,
            plan,
            outputs,
            att.result,
            verify.describe_artifacts(run),
            att.verdicts,
            previous=draft,
            feedback=problems,
        )
        claims = ground.check(draft, evidence, context, att.verdicts)
        bad = ground.problems(claims)
        grounding = Verdict(
            check="grounding",
            passed=not bad,
            attempt=number,
            run_id=run.run_id,
            detail=(
                f"{len(claims)} claims, each found in the outputs" if not bad else "; ".join(bad)
            ),
        )
        trace.stage(
            "answer",
            number,
            "ungrounded" if bad else "grounded",
            started,
            run_id=run.run_id,
            draft=n,
            text=draft,
            claims=[c.model_dump(mode="json") for c in claims],
        )
        last = [grounding]
        if bad:
            problems = "It states what no output shows:\n" + "\n".join(f"- {p}" for p in bad)
            continue
        (checklist, faithful), _ = stage_call(
            "verify",
            verify.review,
            llm,
            question,
            plan,
            att.code,
            run,
            att.result,
            draft,
            answer_mod.describe_checks(att.verdicts),
            number,
        )
        last = [grounding, checklist, faithful]
        if not checklist.passed:
            att.verdicts.extend(last)
            att.feedback = (
                f"A reviewer checked the output against the question and found: {checklist.detail}"
            )
            return
        if not faithful.passed:
            problems = f"A reviewer found: {faithful.detail}"
            continue
        att.verdicts.extend(last)
        att.answer, att.claims = draft, claims
        return
    att.verdicts.extend(last)
    att.ungrounded = problems or "no draft matched the evidence"


def header(data: bytes) -> str:
    """The first line of a text input (its column names may state units), or ''."""
    try:
        return data[:1000].decode().split("\n", 1)[0]
    except UnicodeDecodeError:
        return ""
