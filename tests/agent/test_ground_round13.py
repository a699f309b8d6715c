"""Grounding, round thirteen: counts of a frame's rows, "X out of Y", spelled numbers, a
fraction for a percentage, growth "to" an end value, a row picked by its date, period words.
Pure functions: no model, no sandbox."""

from __future__ import annotations

import pytest

from execbox.agent import ground
from execbox.agent.evidence import Context, Evidence
from execbox.agent.models import RunOutput


def refused(answer: str, stdout: str) -> list[str]:
    """The texts of the answer's claims the output does not ground."""
    evidence = Evidence.of([RunOutput(run_id="run1", stdout=stdout)], [], "run1")
    claims = ground.check(answer, evidence, Context("What is the result?"), [])
    return [c.text for c in claims if not c.grounded]


@pytest.mark.parametrize(
    ("answer", "stdout", "refuse"),
    [
        ("It is one hundred.", "value: 1\n101\n", True),  # 101 is not "one hundred"
        ("There are two thousand rows.", "rows: 2013\n", True),
        ("There are fifteen hundred rows.", "rows: 1540\n", True),
        ("There are one hundred rows.", "rows: 100\n", False),
        ("There are about two thousand rows.", "rows: 2013\n", False),  # stated rounding
        ("Nearly a hundred rows are null.", "null: 97\n", False),
        ("There are two million rows.", "rows: 2013000\n", False),  # a magnitude rounds
    ],
)
def test_a_spelled_number_beyond_ten_is_exact_unless_it_says_about(
    answer: str, stdout: str, refuse: bool
) -> None:
    assert bool(refused(answer, stdout)) is refuse
