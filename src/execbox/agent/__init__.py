"""The execbox agent: plan, generate, check, run, verify, answer with evidence.

    answer = ask("Top 5 regions by units?", executor=ex, files=["sales.csv"], model="openai:gpt-4o")

One module per stage: `plan`, `generate`, `execute` (policy check and run), `verify`, `answer`;
`loop` ties them together with bounded repair and circuit breakers; `trace` stores every stage
and model call; `llm` is the model seam (pydantic-ai) with `ScriptedModel` as its fake.
The names load lazily, so `execbox --help` does not import the agent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import lazy

__all__ = [
    "Answer",
    "AskSettings",
    "AskTrace",
    "Claim",
    "Failure",
    "ModelConfig",
    "ModelUnreachable",
    "Plan",
    "Program",
    "Review",
    "ScriptedModel",
    "TraceStore",
    "Verdict",
    "ask",
    "load_config",
    "resolve_model",
]

_WHERE = {
    "Answer": "models",
    "AskSettings": "models",
    "Claim": "models",
    "Failure": "models",
    "Plan": "models",
    "Program": "models",
    "Review": "models",
    "Verdict": "models",
    "ModelConfig": "llm",
    "ModelUnreachable": "llm",
    "ScriptedModel": "llm",
    "load_config": "llm",
    "resolve_model": "llm",
    "AskTrace": "trace",
    "TraceStore": "trace",
    "ask": "loop",
}

if TYPE_CHECKING:
    from .llm import ModelConfig, ModelUnreachable, ScriptedModel, load_config, resolve_model
    from .loop import ask
    from .models import Answer, AskSettings, Claim, Failure, Plan, Program, Review, Verdict
    from .trace import AskTrace, TraceStore


def __getattr__(name: str) -> Any:
    return lazy.attribute(__name__, _WHERE, globals(), name)
