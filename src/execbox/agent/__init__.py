"""The execbox agent: plan, generate, check, run, verify, answer with evidence.

    answer = ask("Top 5 regions by units?", executor=ex, files=["sales.csv"], model="openai:gpt-4o")

One module per stage: `plan`, `generate`, `execute` (policy check and run), `verify`, `answer`;
`loop` ties them together with bounded repair and circuit breakers; `trace` stores every stage
and model call; `llm` is the model seam (pydantic-ai) with `ScriptedModel` as its fake.
"""

from __future__ import annotations

from .llm import ModelConfig, ScriptedModel, load_config, resolve_model
from .loop import ask
from .models import Answer, AskSettings, Failure, Plan, Program, Review, Verdict
from .trace import AskTrace, TraceStore

__all__ = [
    "Answer",
    "AskSettings",
    "AskTrace",
    "Failure",
    "ModelConfig",
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
