"""Answer: state the answer from the verified outputs, citing what was printed.

The draft is checked before it is returned (`ground`): a value the outputs do not show, or a
check claimed that did not pass, sends it back here with the discrepancy named.
"""

from __future__ import annotations

import json
from typing import Any

from .llm import LLM
from .models import Draft, Plan, RunOutput, Verdict

INSTRUCTIONS = """\
You state the answer to the question from the verified outputs of a program that was run.
Use only numbers, dates, names and units that appear in the outputs, as printed (rounding is
fine when you say so: "about 2.5 million"); never add a unit the outputs do not state. Put
in quotes only text copied from the outputs. Do not claim any verification, test or
cross-check other than the checks listed as passed. Meet every checklist item; name the files
that were written. Be brief.
"""


def tail(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else "…" + text[-limit:]


def describe_checks(verdicts: list[Verdict]) -> str:
    passed = [
        f"{v.check} ({v.detail.splitlines()[0][:100]})" if v.detail else v.check
        for v in verdicts
        if v.passed
    ]
    return "; ".join(passed) or "none"


def draft_answer(
    llm: LLM,
    question: str,
    plan: Plan,
    outputs: list[RunOutput],
    result: Any,
    artifacts: str,
    verdicts: list[Verdict],
    *,
    previous: str | None = None,
    feedback: str | None = None,
) -> str:
    lines = [f"Question: {question}", "Checklist:", *(f"- {item}" for item in plan.checklist)]
    for out in outputs:
        lines += [f"Output (stdout of run {out.run_id}):", tail(out.stdout)]
    lines += [
        f"Result: {json.dumps(result, default=str)[:4000]}",
        f"Files written: {artifacts}",
        f"Checks passed: {describe_checks(verdicts)}",
    ]
    if previous is not None and feedback:
        lines += [
            "",
            "Your previous answer was rejected:",
            previous,
            "",
            "What is wrong:",
            feedback,
            "",
            "State the answer again from the outputs above.",
        ]
    return llm.ask("answer", Draft, INSTRUCTIONS, "\n".join(lines)).text
