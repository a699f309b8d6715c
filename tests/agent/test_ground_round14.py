"""Grounding, round fourteen: one rounding rule. A stated number grounds on an output value
that, correctly rounded to the answer's last digit, gives it; unsaid rounding keeps two
significant digits and a whole number claims a whole value; no digits the output does not
show. Pure functions: no model, no sandbox."""

from __future__ import annotations

import pytest

from execbox.agent import ground
from execbox.agent.evidence import Context, Evidence
from execbox.agent.models import RunOutput


def problems(answer: str, stdout: str) -> list[str]:
    evidence = Evidence.of([RunOutput(run_id="run1", stdout=stdout)], [], "run1")
    return ground.problems(ground.check(answer, evidence, Context("What is the result?"), []))


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The mean is 3.", "mean: 3.5\n"),  # the half rounds up, or to the even 4
        ("The mean is 3.1.", "mean: 3.15\n"),  # half-up and half-even both give 3.2
        ("The mean is -3.", "mean: -3.5\n"),
        ("The mean is 3.1.", "mean: 3.16\n"),  # truncated
        ("The total is 42.", '{"total": 41.6}\n'),  # a whole number hides the fraction
        ("The total is 4200.", '{"total": "4,200.5"}\n'),
        ("There are 1,234 rows.", "rows: 1,234.5\n"),
        ("The mean is 0.", "mean: 0.2\n"),
        ("The file is 5 GB.", "size_bytes: 5200000000\n"),
        ("The p-value is 0.05.", "p: 0.0549\n"),  # one significant digit left, unsaid
        ("East sold 0.1k units.", "East: 143\nWest: 98\n"),
        ("The mean is 3.1600.", "mean: 3.16\n"),  # digits the output does not show
        ("Accuracy is 92.90%.", "accuracy: 0.929\n"),
        ("The total is 1.2900 million.", "total: 1.29e+06\n"),
        ("About 3.", "value: 3.6\n"),  # a rounding word, but the wrong way
    ],
)
def test_unsaid_wrong_or_overprecise_rounding_is_refused(answer: str, stdout: str) -> None:
    assert problems(answer, stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The mean is 3.2.", "mean: 3.15\n"),  # half-up
        ("The share is 2.2.", "share: 2.25\n"),  # half-even, as Python's round() gives
        ("The share is 2.3.", "share: 2.25\n"),
        ("The change is -2.2.", "change: -2.25\n"),
        ("The change is -3.2.", "change: -3.15\n"),
        ("The correlation is -0.83.", "corr: -0.8312\n"),  # two significant digits kept
        ("Pi is 3.14.", "pi: 3.14159\n"),
        ("Revenue was $1.23 million.", "revenue: $1,234,567\n"),
        ("East has 39% of units.", "East: 143 units (39.2%)\n"),  # a whole percentage
        ("The error rate is 5%.", "error_rate: 0.046\n"),
        ("The total is 42, rounded.", '{"total": 41.6}\n'),
        ("The total is about 42.", '{"total": 41.6}\n'),
        ("The p-value is 0.05 to 2 decimal places.", "p: 0.0549\n"),
        ("The p-value is about 0.05.", "p: 0.0549\n"),
        ("The mean is 3.16.", "mean: 3.16\n"),
        ("The mean is 42.00.", "mean: 42\n"),  # a value printed whole is exact
        ("Revenue was $1,543.50.", "revenue: $1543.5\n"),  # cents on money
        ("The loss is -0.0.", "loss: -0.001\n"),
        ("Sales were 1,234,000.", "sales: 1.234e+06\n"),  # trailing zeros are no digits
        ("It took 1,500 ms.", "elapsed: 1.5 s\n"),
        ("It took 1.50 hours.", "elapsed: 5400.0 s\n"),
        (
            "The first three rows have 12, 7 and 15 units.",
            "0  East  12  3.50\n1  West  7  2.25\n2  North  15  4.00\n",
        ),
    ],
)
def test_correct_or_said_rounding_is_grounded(answer: str, stdout: str) -> None:
    assert problems(answer, stdout) == []


def test_a_refusal_for_rounding_names_the_shown_value_and_the_fix() -> None:
    [unsaid] = problems("The total is 42.", "total: 41.6\n")
    assert "total: 41.6" in unsaid and "say it is rounded" in unsaid
    [added] = problems("The mean is 3.1600.", "mean: 3.16\n")
    assert "mean: 3.16" in added and "do not add digits" in added


_DESCRIBE = "            units\ncount  100.000000\nmean   101.230000\nstd     22.410000\n"


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The total is 101.23 units.", _DESCRIBE),  # describe()'s mean called a total
        ("The sum is 101.23.", "mean: 101.23\n"),
        ("The mean is 1543.5.", "total_revenue    1543.5\n"),
        ("The median is 22.41.", _DESCRIBE),
    ],
)
def test_a_value_called_another_statistic_than_its_label_is_refused(
    answer: str, stdout: str
) -> None:
    [problem] = problems(answer, stdout)
    assert "the outputs show this value as the" in problem


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The mean is 101.23 units.", _DESCRIBE),
        ("The average is 101.23.", "mean: 101.23\n"),
        ("The mean is 4.2 \u00b1 0.3.", "mean: 4.2\nstd: 0.3\n"),  # 0.3 is not called a mean
        ("The mean is 42, the median 41 and the max 47.", "mean: 42\n50%: 41\nmax: 47\n"),
        ("The total number of rows is 100.", _DESCRIBE),  # a count is a total
        ("The total is 3.", '{"mean": 3, "total": 3}\n'),  # a line naming several says nothing
        ("The average total is 42.", "mean_total: 42\n"),
    ],
)
def test_a_value_called_its_own_statistic_is_grounded(answer: str, stdout: str) -> None:
    assert problems(answer, stdout) == []


_REGIONS = "Region East: 143 units\nRegion West: 98 units\n"


def test_a_name_under_a_category_word_is_that_label() -> None:
    assert problems("East sold 98 units.", _REGIONS)  # West's
    assert problems("East sold 98 units.", "Product East: 143\nProduct West: 98\n")
    assert problems("East sold 143 units.", _REGIONS) == []
    assert problems("West sold 98 units.", _REGIONS) == []
