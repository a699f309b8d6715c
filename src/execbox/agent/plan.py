"""Plan: does the question need code, and what exactly does it ask for (the checklist)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .llm import LLM
from .models import Plan

INSTRUCTIONS = """\
You plan how to answer a question by running Python code in a sandbox, when code is needed.
Code is needed for anything about the given files, for computation, data cleaning, charts and
algorithms; definitions and general knowledge need no code: then set needs_code to false and
give the whole answer. Otherwise list the question's requirements as a checklist of short
checkable items (how many items, units, rounding, output format, files to write), and name the
invariants the result must satisfy as Python boolean expressions over `result`, the JSON value
the program will print on its last line (for example counts are non-negative, probabilities sum
to about 1, row counts are accounted for). Choose mode 'tests_first' for algorithmic tasks
(merging intervals, similarity ranking, a queue simulation: a function to write and test), and
'run' otherwise. Ask for a cross-check when a cheap independent recomputation exists (brute
force on a small input). Be skeptical and precise: the checklist is what the answer is judged by.
"""


def describe_files(files: Mapping[str, bytes]) -> str:
    """Names, sizes and the first lines of text files: what the model needs to write code."""
    if not files:
        return "No input files."
    parts = []
    for name, data in files.items():
        head = data[:600]
        try:
            lines = head.decode().splitlines()[:6]
            preview = "\n".join("    " + line for line in lines)
        except UnicodeDecodeError:
            preview = "    (binary)"
        parts.append(f"- {name} ({len(data)} bytes), first lines:\n{preview}")
    return "Input files (in the current directory):\n" + "\n".join(parts)


def schema_text(schema: Mapping[str, Any] | None) -> str:
    if not schema:
        return ""
    return ("\nThe result (the JSON printed on the last line) must match this JSON schema:\n"
            + json.dumps(schema, indent=1))


def make_plan(llm: LLM, question: str, files: Mapping[str, bytes],
              schema: Mapping[str, Any] | None = None) -> Plan:
    prompt = f"Question: {question}\n\n{describe_files(files)}{schema_text(schema)}"
    return llm.ask("plan", Plan, INSTRUCTIONS, prompt)
