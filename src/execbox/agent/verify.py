"""Verify, skeptical by design: the run ended well, printed a result, the result has the
expected shape, the plan's invariants hold, the cross-check agrees, and a model judging the
output against the checklist is satisfied. Cheap deterministic checks go first; the model is
asked only when they pass. Model-written checks (invariants, cross-checks) run in the sandbox,
never in this process.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from ..budget import Budget
from ..contract import RunResult
from ..executor import Executor
from .answer import tail
from .llm import LLM
from .models import Invariant, Plan, Review, Verdict

NO_RESULT = object()

INVARIANT_CHECKER = """\
import json, math
result = json.load(open("result.json"))
verdicts = []
for expression in json.load(open("invariants.json")):
    try:
        verdicts.append([bool(eval(expression, {"math": math, "result": result})), ""])
    except Exception as exc:
        verdicts.append([False, f"{type(exc).__name__}: {exc}"])
print(json.dumps(verdicts))
"""

CROSS_CHECK_PREAMBLE = 'import json; result = json.load(open("result.json"))\n'

REVIEW_INSTRUCTIONS = """\
You are a skeptical reviewer. Judge whether the program's output answers the question exactly
as asked, item by item against the checklist: the right number of items (asked for the top 5,
printed 10: not met), units, rounding, format, files written. Do not trust the code's intent:
judge what it printed and wrote. answers_question is true only when every item is met.
Then judge the drafted answer: answer_faithful is true only when it answers the question that
was asked (not a different one), states only what the output shows, and claims no check other
than those listed as passed.
"""


def parse_result(stdout: str) -> Any:
    """The JSON value on the last non-empty stdout line, or NO_RESULT."""
    for line in reversed(stdout.splitlines()):
        if line.strip():
            try:
                return json.loads(line)
            except ValueError:
                return NO_RESULT
    return NO_RESULT


def check_run(run: RunResult, attempt: int) -> Verdict:
    if run.ok:
        return Verdict(
            check="status", passed=True, detail="exit 0", attempt=attempt, run_id=run.run_id
        )
    return Verdict(
        check="status",
        passed=False,
        attempt=attempt,
        run_id=run.run_id,
        detail=describe_failure(run),
    )


def describe_failure(run: RunResult, code: str | None = None) -> str:
    """A structured error for the model: status, type, message, line and the failing snippet."""
    parts = [f"status: {run.status.value}"]
    if run.error is not None:
        err = run.error
        parts.append(f"error: {err.type}: {err.message}")
        if err.rule:
            parts.append(f"policy rule: {err.rule}")
        if err.line is not None:
            parts.append(f"line: {err.line}")
            if code is not None:
                parts.append("failing snippet:\n" + snippet(code, err.line))
        if err.traceback:
            parts.append("traceback:\n" + tail(err.traceback, 2000))
    elif run.stderr.strip():
        parts.append("stderr:\n" + tail(run.stderr, 2000))
    return "\n".join(parts)


def snippet(code: str, line: int, context: int = 2) -> str:
    lines = code.splitlines()
    lo, hi = max(1, line - context), min(len(lines), line + context)
    return "\n".join(
        f"{'>' if n == line else ' '}{n:4d} | {lines[n - 1]}" for n in range(lo, hi + 1)
    )


def check_result_present(result: Any, attempt: int, run_id: str) -> Verdict:
    if result is NO_RESULT:
        return Verdict(
            check="result",
            passed=False,
            attempt=attempt,
            run_id=run_id,
            detail="the last stdout line is not a JSON value: print the result "
            "with print(json.dumps(result, default=str)) as the last line",
        )
    return Verdict(
        check="result",
        passed=True,
        detail="JSON result on the last line",
        attempt=attempt,
        run_id=run_id,
    )


def check_schema(result: Any, schema: Mapping[str, Any] | type[BaseModel], attempt: int) -> Verdict:
    """`schema` is a JSON schema or a pydantic model class the result must validate against."""
    import jsonschema

    if isinstance(schema, type):
        try:
            schema.model_validate(result)
        except ValidationError as exc:
            problems = "; ".join(
                f"at {'/'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
                for e in exc.errors()[:5]
            )
            return Verdict(
                check="schema",
                passed=False,
                attempt=attempt,
                detail=f"the result does not match {schema.__name__}: {problems}",
            )
        return Verdict(
            check="schema", passed=True, attempt=attempt, detail=f"matches {schema.__name__}"
        )
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(result), key=lambda e: list(e.absolute_path))
    if not errors:
        return Verdict(
            check="schema", passed=True, detail="matches the expected schema", attempt=attempt
        )
    detail = "; ".join(
        f"at {'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
        for e in errors[:5]
    )
    return Verdict(
        check="schema",
        passed=False,
        attempt=attempt,
        detail=f"the result does not match the expected schema: {detail}",
    )


def check_invariants(
    executor: Executor, invariants: list[Invariant], result: Any, budget: Budget, attempt: int
) -> tuple[list[Verdict], RunResult]:
    files = {
        "result.json": json.dumps(result, default=str).encode(),
        "invariants.json": json.dumps([inv.expression for inv in invariants]).encode(),
    }
    run = executor.run(INVARIANT_CHECKER, files=files, budget=budget)
    if not run.ok:
        return [
            Verdict(
                check="invariant",
                passed=False,
                attempt=attempt,
                run_id=run.run_id,
                detail="the invariant check did not run: " + describe_failure(run),
            )
        ], run
    outcomes = json.loads(run.stdout.strip().splitlines()[-1])
    return [
        Verdict(
            check="invariant",
            passed=ok,
            attempt=attempt,
            run_id=run.run_id,
            detail=f"{inv.description} ({inv.expression})"
            + (f": {why}" if why else "" if ok else ": false"),
        )
        for inv, (ok, why) in zip(invariants, outcomes, strict=True)
    ], run


def cross_check(
    executor: Executor,
    program: str,
    result: Any,
    files: Mapping[str, bytes],
    budget: Budget,
    limits: Any,
    profile: str,
    attempt: int,
) -> tuple[Verdict, RunResult]:
    code = CROSS_CHECK_PREAMBLE + program
    inputs = dict(files) | {"result.json": json.dumps(result, default=str).encode()}
    run = executor.run(code, files=inputs, budget=budget, limits=limits, profile=profile)
    if run.ok:
        return Verdict(
            check="cross_check",
            passed=True,
            attempt=attempt,
            run_id=run.run_id,
            detail="an independent recomputation agrees",
        ), run
    return Verdict(
        check="cross_check",
        passed=False,
        attempt=attempt,
        run_id=run.run_id,
        detail="the cross-check disagrees or failed:\n" + describe_failure(run, code),
    ), run


def describe_artifacts(run: RunResult) -> str:
    return ", ".join(f"{a.path} ({a.size} bytes, {a.mime_type})" for a in run.artifacts) or "none"


def review(
    llm: LLM,
    question: str,
    plan: Plan,
    code: str,
    run: RunResult,
    result: Any,
    answer: str,
    checks: str,
    attempt: int,
) -> tuple[Verdict, Verdict]:
    """The model's judgement of the output against the checklist and of the drafted answer
    against the question and the output, in one call: (checklist verdict, answer verdict)."""
    prompt = "\n".join(
        [
            f"Question: {question}",
            "Checklist:",
            *(f"- {item}" for item in plan.checklist),
            "Code:",
            code,
            "Output (stdout):",
            tail(run.stdout),
            f"Result: {json.dumps(result, default=str)[:4000]}",
            f"Files written: {describe_artifacts(run)}",
            f"Checks passed: {checks}",
            "Drafted answer:",
            answer,
        ]
    )
    verdict = llm.ask("verify", Review, REVIEW_INSTRUCTIONS, prompt)
    unmet = [f"{i.item}: {i.note or 'not met'}" for i in verdict.items if not i.met]
    passed = verdict.answers_question and not unmet
    detail = (
        "every checklist item met"
        if passed
        else "; ".join(unmet + verdict.problems) or "the output does not answer the question"
    )
    faithful = verdict.answer_faithful and not verdict.answer_problems
    return (
        Verdict(
            check="checklist", passed=passed, attempt=attempt, run_id=run.run_id, detail=detail
        ),
        Verdict(
            check="answer",
            passed=faithful,
            attempt=attempt,
            run_id=run.run_id,
            detail="the answer states the output faithfully"
            if faithful
            else "; ".join(verdict.answer_problems)
            or "the answer does not state the output faithfully or answers a different question",
        ),
    )


def check_inputs_used(run: RunResult, files: Mapping[str, bytes], attempt: int) -> Verdict:
    """Given files, a program must read at least one of them: a result computed from nothing
    (hard-coded, or made up) is not evidence about the data."""
    names = ", ".join(sorted(files))
    if run.inputs_read is None:
        return Verdict(
            check="inputs_used",
            passed=False,
            attempt=attempt,
            run_id=run.run_id,
            detail="the sandbox did not report which input files were read",
        )
    if not run.inputs_read:
        return Verdict(
            check="inputs_used",
            passed=False,
            attempt=attempt,
            run_id=run.run_id,
            detail=f"the program read none of the given files ({names}): compute "
            "the result from them, never hard-code or invent values",
        )
    return Verdict(
        check="inputs_used",
        passed=True,
        attempt=attempt,
        run_id=run.run_id,
        detail="read " + ", ".join(run.inputs_read),
    )
