"""Generate: minimal code for the plan, or a minimal fix for the last attempt's failure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..contract import Limits
from .llm import LLM
from .models import Plan, Program
from .plan import describe_files, schema_text

INSTRUCTIONS = """\
You write minimal Python 3.11 programs that run in a sandbox. There is no network and nothing
can be installed: use only the standard library, numpy, pandas, matplotlib (Agg backend: save
figures with savefig, never show) and scipy. Input files are in the current directory:
compute from them, never hard-code or invent values (a program that reads none of them fails
verification). Write every output file (cleaned data, charts as PNG) into the current
directory: they are returned as artifacts. Print every value the answer needs, and print the
result as one JSON value (json.dumps, default=str) on the last line of stdout; make its keys
those the invariants use. Do exactly what the checklist asks (if it asks for the top 5, print
5). When fixing a failed attempt, change the minimal lines that fix it and keep everything that
worked.
"""

TESTS_FIRST = """
Mode tests_first: put the reference implementation (functions only) in `solution`; put
example-based tests and property-style tests (random small inputs with a fixed seed, compared
with a brute-force version or checked against invariants; plain assert statements) in `tests`;
and put the program that uses the solution to answer the question in `code`. `tests` and `code`
each run after `solution` in the same file: do not import it.
"""

STEPS = """
Mode steps: give the program as `cells`, run in order in one stateful Python interpreter, like
notebook cells: each cell sees the variables and imports of the cells before it, so load data
once and build on it. The time limit applies to each cell. The last cell prints the result as
JSON on its last line. Set `code` to an empty string.
"""

MODE_TEXT = {"tests_first": TESTS_FIRST, "steps": STEPS}


def _limits_text(limits: Limits) -> str:
    return (
        f"Limits of each run: {limits.timeout_s:g} s wall time, {limits.memory_mib} MiB "
        f"memory, {limits.disk_mib} MiB disk, {limits.output_bytes} bytes of output."
    )


def generate(
    llm: LLM,
    question: str,
    plan: Plan,
    files: Mapping[str, bytes],
    limits: Limits,
    *,
    mode: str,
    schema: Mapping[str, Any] | None = None,
    previous: Program | None = None,
    feedback: str | None = None,
) -> Program:
    lines = [
        f"Question: {question}",
        "",
        describe_files(files),
        "",
        "Checklist:",
        *(f"- {item}" for item in plan.checklist),
    ]
    if plan.invariants:
        lines += [
            "Invariants (over `result`):",
            *(f"- {inv.description}: {inv.expression}" for inv in plan.invariants),
        ]
    if plan.approach:
        lines.append(f"Approach: {plan.approach}")
    if plan.cross_check:
        lines.append(f"Cross-check to provide in `cross_check`: {plan.cross_check}")
    lines.append(_limits_text(limits) + schema_text(schema))
    if previous is not None and feedback:
        lines += ["", "The previous attempt failed."]
        if previous.solution or previous.tests:
            lines += [
                "Previous solution:",
                previous.solution or "(none)",
                "Previous tests:",
                previous.tests or "(none)",
            ]
        if previous.cells:
            lines += [f"Previous cell {i}:\n{cell}" for i, cell in enumerate(previous.cells, 1)]
        else:
            lines += ["Previous code:", previous.code]
        lines += ["", "What went wrong:", feedback, "", "Fix the minimal lines."]
    instructions = INSTRUCTIONS + MODE_TEXT.get(mode, "")
    return llm.ask("generate", Program, instructions, "\n".join(lines))
