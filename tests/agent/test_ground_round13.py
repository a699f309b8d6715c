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


_FRAME = """      region  units   revenue
0      North    120  1.234e+06
1      South     95  9.870e+05
..       ...    ...        ...
98     North    101  1.010e+06
99     South     77  6.600e+05

[100 rows x 3 columns]
"""


@pytest.mark.parametrize(
    ("answer", "stdout", "refuse"),
    [
        ("The table has 99 rows.", _FRAME, True),  # the last index, not the length
        ("There are 3 rows.", _FRAME, True),  # the columns' count
        ("The dataframe has 100 columns.", _FRAME, True),
        ("The data has 3 rows.", "(7, 3)\n", True),  # df.shape
        ("The series has 2 rows.", "0    1\n1    2\nName: x, Length: 100, dtype: int64\n", True),
        ("The table has 100 rows and 3 columns.", _FRAME, False),
        ("There are over 90 rows.", _FRAME, False),
        ("The data has 7 rows.", "shape: (7, 3)\n", False),
        ("3 rows have a missing price.", _FRAME + "missing: 3\n", False),  # some rows, not all
        ("There are 3 rows with a missing price.", _FRAME + "missing: 3\n", False),
    ],
)
def test_a_count_of_a_frames_rows_or_columns_is_its_printed_size(
    answer: str, stdout: str, refuse: bool
) -> None:
    assert bool(refused(answer, stdout)) is refuse


@pytest.mark.parametrize(
    ("answer", "stdout", "refuse"),
    [
        ("The score is 3 out of 4.", "score: 3\ntotal: 5\n4\n", True),  # a stray 4
        ("The score is 3 out of 4.", "rate: 0.75\n", True),  # the ratio, not the counts
        ("The score is 3 out of 5.", "score: 3\ntotal: 4\n5\n", True),
        ("The score is 3 out of 4.", "score: 3\ntotal: 4\n", False),
        ("The score is 3 out of 4.", "score 3/4\n", False),
        ("The score is 3 out of 4.", "passed 3, tests 4\n", False),
    ],
)
def test_x_out_of_y_needs_the_count_and_its_whole_shown_together(
    answer: str, stdout: str, refuse: bool
) -> None:
    assert bool(refused(answer, stdout)) is refuse


@pytest.mark.parametrize(
    ("answer", "stdout", "refuse"),
    [
        ("Accuracy is 0.9.", "accuracy: 90%\n", True),  # a fraction for a printed percentage
        ("Accuracy is 0.9%.", "accuracy: 0.009\n", True),  # 0.009 may be a percentage already
        ("Accuracy is 0.9 as a decimal.", "accuracy: 90%\n", False),  # the answer says so
        ("Accuracy is 0.9, or 90%.", "accuracy: 90%\n", False),
        ("East is 42.9% of the rows.", "East     0.428571\n", False),
        ("The error rate is 0.9%.", "error_rate: 0.009\n", False),  # the label says share
        ("Accuracy is 90%.", "accuracy: 0.9\n", False),
        ("Units grew 84.2% in February.", "2023-02    0.842\n", False),  # pct_change
    ],
)
def test_a_fraction_is_its_percentage_only_where_a_share_is_said(
    answer: str, stdout: str, refuse: bool
) -> None:
    assert bool(refused(answer, stdout)) is refuse


@pytest.mark.parametrize(
    ("answer", "stdout", "refuse"),
    [
        ("The count was -1,200.", "rows: (1,200)\n", True),  # a tuple, not a loss
        ("The slope is -2.5.", "(2.5)\n", True),
        ("The net result was -1,200.", "net: (1,200)\n", False),  # accounting
        ("The change was -1,200.", "change: ($1,200)\n", False),
    ],
)
def test_parentheses_are_a_minus_only_on_a_money_line(
    answer: str, stdout: str, refuse: bool
) -> None:
    assert bool(refused(answer, stdout)) is refuse


_YOY = "2022: 1,204\n2023: 1,530\nchange: +27.1%\n"


@pytest.mark.parametrize(
    ("answer", "stdout", "refuse"),
    [
        ("Sales grew 27.1% to 1,204.", _YOY, True),  # the start, not the end
        ("Sales grew 30% to 1,530.", "2022: 1,204\n2023: 1,530\n", True),  # not the change
        ("Sales fell 27.1% to 1,204.", _YOY, True),  # a rise, not a fall
        ("Sales grew 27.1% to 1,530.", _YOY, False),
        ("Sales grew 27.1% to 1,530.", "2022: 1,204\n2023: 1,530\n", False),  # derived
        ("Sales fell 21.3% to 1,204.", "2022: 1,530\n2023: 1,204\n", False),
    ],
)
def test_growth_to_an_end_value_is_the_change_between_shown_values(
    answer: str, stdout: str, refuse: bool
) -> None:
    assert bool(refused(answer, stdout)) is refuse


_HEAD = """        date region product  units  price  revenue
0 2023-01-02   East       A     12   3.50    42.00
1 2023-01-03   West       B      7  12.25    85.75
2 2023-02-06   East       A     30   3.50   105.00
"""
_DAILY = "2023-03-04: 40\n2023-03-05: 35\n"


@pytest.mark.parametrize(
    ("answer", "stdout", "refuse"),
    [
        ("The East order on 2023-01-02 sold 30 units.", _HEAD, True),  # another row's 30
        ("On 2023-03-05 sales were 40.", _DAILY, True),
        ("Sales were 40 on 2023-03-05.", _DAILY, True),
        ("The East order on 2023-01-02 sold 12 units.", _HEAD, False),
        ("On 2023-03-05 sales were 35, up from 40 on 2023-03-04.", _DAILY, False),
        ("Sales were 35 on 2023-03-05.", _DAILY, False),
    ],
)
def test_a_number_of_a_dated_row_is_on_that_dates_line(
    answer: str, stdout: str, refuse: bool
) -> None:
    assert bool(refused(answer, stdout)) is refuse


@pytest.mark.parametrize(
    ("answer", "stdout", "refuse"),
    [
        ("Sales peaked in H2.", "peak: 2023-03-04\n", True),
        ("Sales peaked in the second half of the year.", "peak: 2023-03-04\n", True),
        ("Sales peaked in FY24.", "peak: 2023-03-04\n", True),  # a calendar no output gives
        ("Sales peaked in FY2023.", "peak: 2023-03-04\n", True),
        ("Sales peaked on Sun.", "peak: 2023-03-04\n", True),  # a Saturday
        ("Sales peaked on weekends.", "peak: 2023-03-06\n", True),  # a Monday
        ("Sales are higher on weekdays.", "Saturday    500\nMonday    20\n", True),
        ("Sales peaked in Q3.", "peak: 2023-03-04\n", True),
        ("Sales peaked in April.", "peak: M\u00e4rz 2023\n", True),
        ("Sales peaked in H1.", "peak: 2023-03-04\n", False),
        ("Sales peaked in H2 2023.", "half: H2 2023\npeak: 2023-03-04\n", False),
        ("Sales peaked in FY24.", "peak: FY2024\n", False),
        ("Sales peaked on Sat.", "peak: 2023-03-04\n", False),
        ("Sales peaked on weekends.", "peak: 2023-03-04\n", False),
        ("Sales are higher on weekends.", "Saturday    500\nSunday    450\n", False),
        ("Sales peaked in M\u00e4rz.", "peak: 2023-03-04\n", False),  # read, and true
        ("The busiest weekday is Monday.", "weekday\nMonday    78\nFriday    9\n", False),
    ],
)
def test_a_period_word_is_read_or_refused_when_no_output_states_it(
    answer: str, stdout: str, refuse: bool
) -> None:
    assert bool(refused(answer, stdout)) is refuse


_PCT_CHANGE = "date\n2023-01      NaN\n2023-02    0.842\n2023-03   -0.114\n2023-04   -0.548\n"


@pytest.mark.parametrize(
    ("answer", "stdout", "refuse"),
    [
        ("Units fell 11.4% in March and 84.2% in February.", _PCT_CHANGE, True),  # a rise
        (
            "Units grew 84.2% in February, then fell 11.4% in March and 54.8% in April.",
            _PCT_CHANGE,
            False,
        ),
        ("Total: 1,234.56 EUR", "total: 1234.56\ncurrency: EUR\n", False),
        ("Total: $1,234.56", "total: 1234.56\ncurrency: EUR\n", True),
    ],
)
def test_a_change_after_and_keeps_its_direction_and_a_stated_currency_grounds(
    answer: str, stdout: str, refuse: bool
) -> None:
    assert bool(refused(answer, stdout)) is refuse


@pytest.mark.parametrize(
    ("answer", "stdout", "refuse"),
    [
        ("numpy 2.0.0 is installed.", "numpy 2.0.0rc1\n", True),  # a prerelease
        ("numpy 2.0.0rc1 is installed.", "numpy 2.0.0rc1\n", False),
        ("numpy 1.26 is installed.", "numpy 1.26.4\n", False),
    ],
)
def test_a_release_is_not_grounded_by_its_prerelease(
    answer: str, stdout: str, refuse: bool
) -> None:
    assert bool(refused(answer, stdout)) is refuse
