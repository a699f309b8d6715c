"""Scripted plans, programs, reviews and answers for the agent tests (`ScriptedModel`)."""

from __future__ import annotations

import json
import re
from typing import Any

from execbox.agent import ScriptedModel


def plan(
    *checklist: str,
    invariants: list[tuple[str, str]] | None = None,
    mode: str = "run",
    cross_check: str | None = None,
) -> dict[str, Any]:
    return {
        "needs_code": True,
        "checklist": list(checklist),
        "mode": mode,
        "invariants": [{"description": d, "expression": e} for d, e in invariants or []],
        "cross_check": cross_check,
        "approach": "",
    }


def program(code: str, **extra: Any) -> dict[str, Any]:
    return {"code": code, **extra}


def approve(_prompt: str) -> dict[str, Any]:
    """A reviewer that approves everything: the output and the drafted answer."""
    return {
        "items": [],
        "answers_question": True,
        "problems": [],
        "answer_faithful": True,
        "answer_problems": [],
    }


def answer_from_result(prompt: str) -> dict[str, Any]:
    """An answer stage that states the printed result, as a model would."""
    match = re.search(r"^Result: (.*)$", prompt, re.M)
    return {"text": f"The result is {match.group(1) if match else 'missing'}."}


def script(
    *,
    plans: list[Any],
    programs: list[Any],
    reviews: list[Any] | None = None,
    answers: list[Any] | None = None,
    tokens_per_call: int = 150,
) -> ScriptedModel:
    return ScriptedModel(
        {
            "plan": plans,
            "generate": programs,
            "verify": reviews if reviews is not None else [approve] * 10,
            "answer": answers if answers is not None else [answer_from_result] * 10,
        },
        tokens_per_call=tokens_per_call,
    )


def result_of(prompt: str) -> Any:
    match = re.search(r"^Result: (.*)$", prompt, re.M)
    assert match, prompt
    return json.loads(match.group(1))
