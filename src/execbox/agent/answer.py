"""Answer: state the answer from the verified outputs, citing what was printed."""

from __future__ import annotations

import json
from typing import Any

from ..contract import RunResult
from .llm import LLM
from .models import Draft, Plan

INSTRUCTIONS = """\
You state the answer to the question from the verified outputs of a program that was run.
Use only numbers and facts that appear in the outputs; meet every checklist item; name the
files that were written. Be brief.
"""


def tail(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else "…" + text[-limit:]


def draft_answer(llm: LLM, question: str, plan: Plan, run: RunResult, result: Any) -> str:
    arts = ", ".join(f"{a.path} ({a.size} bytes)" for a in run.artifacts) or "none"
    prompt = "\n".join([
        f"Question: {question}", "Checklist:", *(f"- {item}" for item in plan.checklist),
        f"Output (stdout of run {run.run_id}):", tail(run.stdout),
        f"Result: {json.dumps(result, default=str)[:4000]}", f"Files written: {arts}",
    ])
    return llm.ask("answer", Draft, INSTRUCTIONS, prompt).text
