"""Plan: does the question need code, and what exactly does it ask for (the checklist)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from .llm import LLM
from .models import Plan
from .spelled import WORD_NUMBER

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
    return (
        "\nThe result (the JSON printed on the last line) must match this JSON schema:\n"
        + json.dumps(schema, indent=1)
    )


# A question that asks for a computed value: arithmetic on numbers it gives, or a statistic.
_COMPUTED = re.compile(
    r"\d+\s*(?:[+*^\u00d7\u00f7]|\*\*|mod\b|to the power of)\s*\(?\d+|"
    r"\d+\s+[-/%]\s+\(?\d+|"
    r"\b(?:calculate|compute|evaluate|solve|simulate|sum of|total of|average|mean of|median|"
    r"percentile|standard deviation|variance|correlation|factorial of)\b|"
    r"\b(?:summed|added|subtracted|multiplied|divided)\s+(?:with|to|by|from)\b",
    re.I,
)
# The same in words: "seventeen times twenty-three".
_NUM = rf"(?:\d+(?:\.\d+)?|{WORD_NUMBER.pattern})"
_COMPUTED_IN_WORDS = re.compile(
    rf"{_NUM}\s+(?:times|plus|minus|over|multiplied by|divided by|to the power of)\s+{_NUM}", re.I
)
# Data pasted into the question: two or more lines of separated fields, some of them numbers.
_TABLE_ROW = re.compile(r"^[^\n]*?[^\s,;|\t][ \t]*[,;|\t][^\n]*\d[^\n]*$", re.M)


def code_required(question: str, files: Mapping[str, bytes]) -> str | None:
    """Why this question cannot be answered without running code, or None. A plan without
    code is sent back once for these: an answer about data or a computed value needs a run."""
    if files:
        return (
            f"input files are given ({', '.join(sorted(files))}): the answer must come "
            "from reading them"
        )
    match = _COMPUTED.search(question) or _COMPUTED_IN_WORDS.search(question)
    if match:
        return f"the question asks for a computed value ({match[0].strip()!r})"
    if len(_TABLE_ROW.findall(question)) >= 2:
        return "the question holds data (rows of values): the answer must come from reading them"
    return None


def make_plan(
    llm: LLM,
    question: str,
    files: Mapping[str, bytes],
    schema: Mapping[str, Any] | None = None,
    *,
    sent_back: str | None = None,
) -> Plan:
    prompt = f"Question: {question}\n\n{describe_files(files)}{schema_text(schema)}"
    if sent_back:
        prompt += (
            f"\n\nA plan without code was rejected: {sent_back}. Plan the code that "
            "computes the answer (needs_code true)."
        )
    return llm.ask("plan", Plan, INSTRUCTIONS, prompt)
