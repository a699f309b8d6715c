"""What the agent's stages produce and what an ask returns: plain pydantic models, no I/O.

The stage outputs (`Plan`, `Program`, `Review`, `Draft`) are what the model is asked to fill in,
so their field descriptions are part of the prompt. `Answer` is the evidence bundle returned to
the caller and stored with the trace.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..contract import Artifact, Limits


class Invariant(BaseModel):
    """A property the program's result must have."""

    description: str = Field(
        description="What must hold, in words, e.g. 'counts are non-negative'."
    )
    expression: str = Field(
        description="A Python boolean expression over `result` (the JSON value the program prints "
        "on its last stdout line), e.g. \"all(v >= 0 for v in result['counts'].values())\"."
    )


class Plan(BaseModel):
    """The plan for answering the question."""

    needs_code: bool = Field(
        description="True when answering requires running code (the question is about the given "
        "files, or needs computation, data cleaning, a chart or an algorithm)."
    )
    answer: str | None = Field(
        None, description="The complete answer, only when needs_code is false."
    )
    checklist: list[str] = Field(
        default_factory=list,
        description="The question's requirements as short checkable items: how many items, units, "
        "rounding, output format, files to write.",
    )
    invariants: list[Invariant] = Field(
        default_factory=list, description="Properties the result must satisfy."
    )
    mode: Literal["run", "tests_first", "steps"] = Field(
        "run",
        description="'tests_first' for algorithmic tasks (write a function, test it, then "
        "use it); 'steps' for multi-step work whose later steps build on the "
        "state of earlier ones (cells in one stateful session); 'run' "
        "otherwise.",
    )
    cross_check: str | None = Field(
        None,
        description="A cheap independent re-computation to run (brute force on small input), "
        "when one exists; null otherwise.",
    )
    approach: str = Field("", description="The approach in one or two sentences.")


class Program(BaseModel):
    """The Python code to run in the sandbox."""

    code: str = Field(
        description="The main program. Its last stdout line must be one JSON value: the result."
    )
    solution: str | None = Field(
        None,
        description="tests_first mode: the reference implementation (functions only, no "
        "top-level work). It is placed before `tests` and before `code`.",
    )
    tests: str | None = Field(
        None,
        description="tests_first mode: example-based and property-style tests (plain "
        "assert statements; random small inputs with a fixed seed compared with "
        "a brute-force version). Must exit non-zero on any failure.",
    )
    cells: list[str] | None = Field(
        None,
        description="steps mode: the cells, run in order in one stateful interpreter "
        "(each sees the variables of the cells before it); the last cell "
        "prints the result as JSON on its last line. `code` is then ignored.",
    )
    cross_check: str | None = Field(
        None,
        description="When the plan asks for a cross-check: a program that recomputes the "
        "result independently (brute force on small input) and asserts it "
        "matches `result` (a variable already holding the main program's JSON "
        "result). The input files are available too.",
    )
    notes: str = Field("", description="What changed since the previous attempt, if any.")

    @field_validator("code", "solution", "tests", "cross_check")
    @classmethod
    def _no_fence(cls, value: str | None) -> str | None:
        return strip_fence(value) if value is not None else None

    @field_validator("cells")
    @classmethod
    def _no_fences(cls, value: list[str] | None) -> list[str] | None:
        return [strip_fence(cell) for cell in value] if value is not None else None


def strip_fence(text: str) -> str:
    """Models often wrap code in a Markdown fence; the sandbox wants the code alone."""
    stripped = text.strip()
    if stripped.startswith("```") and stripped.endswith("```") and "\n" in stripped:
        body = stripped[stripped.index("\n") + 1 : -3]
        return body.rstrip() + "\n"
    return text


class ChecklistItem(BaseModel):
    item: str = Field(description="The checklist item.")
    met: bool = Field(description="Whether the output meets it.")
    note: str = Field("", description="Why not, when it is not met.")


class Review(BaseModel):
    """A skeptical check of the output against the question and the checklist."""

    items: list[ChecklistItem] = Field(default_factory=list, description="One entry per item.")
    answers_question: bool = Field(
        description="True only when the output fully answers the question as asked (e.g. "
        "asked for the top 5 and exactly 5 were printed)."
    )
    problems: list[str] = Field(default_factory=list, description="What is wrong, if anything.")
    answer_faithful: bool = Field(
        description="True only when the drafted answer answers the question asked (not a "
        "different one), states only what the output shows, and claims no check "
        "that is not listed as passed."
    )
    answer_problems: list[str] = Field(
        default_factory=list, description="What is wrong with the drafted answer, if anything."
    )


class Draft(BaseModel):
    """The answer to give the user."""

    text: str = Field(description="The answer, stated from the outputs; cite numbers as printed.")


class Claim(BaseModel):
    """A value the answer states (a number, date, quoted text, unit, a claim that something
    was verified, or the single-value result it must state) and the evidence it came from."""

    text: str = Field(description="As written in the answer, e.g. '2.5 million'.")
    kind: Literal["number", "date", "quote", "unit", "verification", "result"]
    grounded: bool
    run_id: str | None = Field(None, description="The run whose output shows it.")
    source: str | None = Field(
        None,
        description="Where: 'stdout line 2: sum 6', 'result[\"north\"] = 7', "
        "'the question', or the check that passed.",
    )
    detail: str = Field("", description="Why it is not grounded.")


class Verdict(BaseModel):
    """One verification check and its outcome."""

    check: Literal[
        "status",
        "result",
        "schema",
        "invariant",
        "cross_check",
        "checklist",
        "tests",
        "policy",
        "inputs_used",
        "grounding",
        "answer",
    ]
    passed: bool
    detail: str = ""
    attempt: int = 0
    run_id: str | None = None


class TokenUsage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    requests: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class AttemptLog(BaseModel):
    """What one generate-run-verify attempt did, kept for failures and the trace."""

    attempt: int
    run_ids: list[str] = Field(default_factory=list)
    status: str = Field(description="The run status, or 'policy_denied' / 'not_run'.")
    error: str | None = None
    stdout_tail: str = ""
    stderr_tail: str = ""
    feedback: str | None = Field(None, description="What was sent back to Generate.")


class Failure(BaseModel):
    """Why the agent stopped without an answer, with the logs of every attempt."""

    kind: Literal[
        "repairs_exhausted",
        "exec_time",
        "tokens",
        "artifacts",
        "model_error",
        "ungrounded",
        "no_evidence",
    ]
    message: str
    logs: list[AttemptLog] = Field(default_factory=list)


class RunOutput(BaseModel):
    """An output the answer relies on."""

    run_id: str
    stdout: str
    result: Any = None


class Answer(BaseModel):
    """The answer with its evidence: what was run, what it printed, how it was checked."""

    ask_id: str = Field(description="The trace id: `execbox runs trace ASK_ID` shows every stage.")
    status: Literal["answered", "failed"]
    question: str
    answer: str = ""
    code: str | None = Field(None, description="The final program (solution included).")
    outputs: list[RunOutput] = Field(default_factory=list)
    run_ids: list[str] = Field(default_factory=list, description="Runs the answer cites.")
    artifacts: list[Artifact] = Field(default_factory=list)
    verdicts: list[Verdict] = Field(
        default_factory=list, description="Verdicts of the final attempt."
    )
    evidence: Literal["runs", "none"] = Field(
        "runs",
        description="'none': answered without running code (a definition or general "
        "knowledge); nothing was computed or checked.",
    )
    claims: list[Claim] = Field(
        default_factory=list, description="Each value the answer states and where it came from."
    )
    plan: Plan | None = None
    attempts: int = 0
    usage: TokenUsage = Field(default_factory=TokenUsage)
    failure: Failure | None = None

    @property
    def ok(self) -> bool:
        return self.status == "answered"


class AskSettings(BaseModel):
    """Bounds of one ask. The circuit breakers end the ask with a clean failure, never a loop."""

    model_config = ConfigDict(extra="forbid")

    max_repairs: int = Field(3, ge=0, le=20, description="Repairs after the first attempt.")
    max_exec_s: float = Field(120.0, gt=0, description="Total sandbox execution time in seconds.")
    max_tokens: int = Field(200_000, gt=0, description="Total model tokens (input + output).")
    max_artifact_bytes: int = Field(50 << 20, ge=0, description="Total artifact bytes of all runs.")
    max_artifact_files: int = Field(200, ge=0, description="Total artifact files of all runs.")
    limits: Limits | None = Field(
        None, description="Limits of each run (fields set override the profile's defaults)."
    )
    profile: str = Field("data", description="Policy profile of the runs.")
    mode: Literal["auto", "run", "tests_first", "steps"] = Field(
        "auto", description="'auto' follows the plan; the others force a mode."
    )
