"""Named values in an answer (months, weekdays, quarters, years, hours, versions, ranks) must be
shown by the outputs it relies on, or restate the question. Pure functions: no model, no sandbox."""

from __future__ import annotations

from typing import Any

import pytest

from execbox.agent import ground
from execbox.agent.evidence import Context, Evidence
from execbox.agent.models import Claim, RunOutput


def claims(
    answer: str, stdout: str, question: str = "What is the result?", **kw: Any
) -> list[Claim]:
    evidence = Evidence.of([RunOutput(run_id="run1", stdout=stdout, **kw)], [])
    return ground.check(answer, evidence, Context(question), [])


def refused(
    answer: str, stdout: str, question: str = "What is the result?", **kw: Any
) -> list[str]:
    return [c.text for c in claims(answer, stdout, question, **kw) if not c.grounded]


@pytest.mark.parametrize(
    ("answer", "stdout", "wrong"),
    [
        ("The peak was in March.", "peak: 2023-05-03\n", "March"),
        ("Sales peaked in December.", "month: 11\nsales: 500\n", "December"),
        ("Sales peaked in December.", "peak_month: 2023-11\n", "December"),
        ("Sales peaked in December.", "peak: November\n", "December"),
        ("The best month was March, with 500 sales.", "best_month: 4\nsales: 500\n", "March"),
        ("Sales peaked in Dec.", "sales: 500\n", "Dec"),  # no month shown at all
        ("The peak was on a Monday.", "peak: 2023-03-15\n", "Monday"),
        ("The peak was on Monday, 2023-03-15.", "peak: 2023-03-15\n", "Monday"),
        ("The busiest weekday is Friday.", "busiest: Thursday\n", "Friday"),
        ("The peak was in Q2.", "peak: 2023-03-15\n", "Q2"),
        ("The peak was in Q4 2023.", "quarter: 3\nyear: 2023\n4\n", "Q4"),
        ("The peak was in 2023 Q4.", "peak: 2023Q3\n", "Q4"),
        ("The 2nd quarter had 5 sales.", "q3: 5\n", "2nd quarter"),
        ("The best was the fourth quarter.", "best: 500\n", "fourth quarter"),
        ("In 2023 there were 500 sales.", "year: 2022\nsales: 500\n2023\n", "2023"),
        ("The peak was in 2022.", "peak: 2023-05-03\n2022\n", "2022"),
        ("It started at 9 o'clock.", "start_hour: 10\n9\n", "9 o'clock"),
        ("It uses Python 3.12.", "Python 3.11.4\n", "Python 3.12"),
        ("It uses Python 3.12.", "Python 3.11.4\n12\n", "Python 3.12"),
        ("numpy 2.0 is installed.", "numpy 1.96\n", "numpy 2.0"),
        ("pandas 2.1 is installed.", "pandas 2.14\n", "pandas 2.1"),
        ("The version is v2.", "version: 3\n2\n", "v2"),
        ("It runs version 7.", "status: ok\n7\n", "version 7"),
        ("It is the 3rd largest, at 5.", "rank: 4\nvalue: 5\n", "3rd largest"),
        ("It ranks 3rd.", "rank: 4\n", "ranks 3rd"),
        ("It ranks third.", "rank: 4\n", "ranks third"),
        ("It is ranked 3.", "rank: 4\n3\n", "ranked 3"),
        ("It placed second.", "score: 2\n", "placed second"),
        ("North ranked second.", "North: 31\nSouth: 27\n", "ranked second"),
    ],
)
def test_a_named_value_no_output_shows_is_refused(answer: str, stdout: str, wrong: str) -> None:
    assert wrong in refused(answer, stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The peak was in March.", "peak: 2023-03-04\n"),
        ("The peak was in Mar.", "peak: March\n"),
        ("The peak was in March.", "peak: Mar\n"),
        ("The peak was in March.", "peak_month: 3\n"),
        ("The peak was on a Saturday.", "peak: 2023-03-04\n"),
        ("The peak was on Sat, in Q1 2023.", "peak: 2023-03-04\n"),
        ("The busiest day is Fri.", "busiest: friday\n"),
        ("The peak was in the first quarter.", "peak: Q1\n"),
        ("The peak was in Q1.", "peak: first quarter\n"),
        ("The peak was in Q3 2023.", "peak: 2023Q3\n"),
        ("The peak was in the 3rd quarter.", "quarter: 3\n"),
        ("In 2023 there were 500 sales.", "year: 2023\nsales: 500\n"),
        ("In 2023 there were 500 sales.", "2023\nsales: 500\n"),  # no year shown: a number
        ("The peak was in 2023.", "peak: 2023-03-04\n"),
        ("It started at 9 o'clock.", "start: 09:00\n"),
        ("It started at 9 o'clock in the evening.", "start: 21:00\n"),
        ("It uses Python 3.11.", "Python 3.11.4\n"),
        ("numpy 1.26 is installed.", "numpy 1.26.4\n"),
        ("The installed version is 2.1.0.", "version: 2.1.0\n"),
        ("The version is v2.3.", "version: 2.3\n"),
        ("It ranks 2nd.", "rank: 2\n"),
        ("It ranks second.", "rank: 2\n"),
        ("North ranked second, with 31.", "North: 31 (2nd)\n"),
        ("The mean 3.2 is close to pi.", "mean 3.16\n"),  # no version after "mean"
        ("The first order was on March 15, 2023.", "first: 2023-03-15\n"),
        ("The first row's revenue is 120.", "revenue\n120\n"),
        ("The customer placed 3 orders.", "orders: 3\n"),  # a count, not a rank
        ("It ranks 3 regions by sales.", "regions: 3\n"),
        ("The value at position 3 is 5.", "position 3: 5\n"),
        ("May sales were 500.", "month: May\nsales: 500\n"),
        ("The second largest value is 7.", "second_largest: 7\n"),
    ],
)
def test_a_named_value_an_output_shows_passes(answer: str, stdout: str) -> None:
    assert refused(answer, stdout) == []


@pytest.mark.parametrize(
    ("answer", "question"),
    [
        ("Sales in March were 500.", "What were sales in March?"),
        ("Sales in Q2 were 500.", "What were sales in the second quarter?"),
        ("On Mondays sales were 500.", "What are sales on a Monday?"),
        ("Python 3.12 sold 500.", "How many did Python 3.12 sell?"),
        ("The third-ranked region sold 500, ranked 3rd.", "Which region ranked 3rd?"),
        ("In 2021 sales were 500.", "What were sales in 2021?"),
    ],
)
def test_a_named_value_the_question_states_is_no_claim(answer: str, question: str) -> None:
    assert refused(answer, "sales: 500\ndate: 2024-06-01\n", question) == []


def test_a_result_dict_shows_its_named_values() -> None:
    assert refused("The peak was in March, Q1.", "", result={"peak_month": 3}) == []
    assert refused("The peak was in April.", "", result={"peak_month": 3}) == ["April"]


def test_a_refused_named_value_says_what_the_outputs_show() -> None:
    [claim] = claims("The peak was in March.", "peak: 2023-05-03\n")
    assert not claim.grounded and "(they show May)" in claim.detail


SYS_VERSION = "3.11.4 (main, Jun  7 2023, 10:13:09) [GCC 12.2.0]\n"
VERSION_INFO = "sys.version_info(major=3, minor=11, micro=4, releaselevel='final', serial=0)\n"


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("Python 3.12 is installed.", SYS_VERSION),
        ("Python 3.12.1 is installed.", SYS_VERSION),
        ("Python 3.9 is installed.", SYS_VERSION),
        ("Python 3.12 is installed.", VERSION_INFO),
        ("Python 3.12 is installed.", "(3, 11, 4)\n"),
        ("Python 3.12 is installed.", "total: 5\n"),  # no version shown at all
        ("It runs Python3.12.", "Python 3.11.4\n"),
        ("It runs py3.12.", "Python 3.11.4\n"),
    ],
)
def test_a_python_version_no_output_shows_is_refused(answer: str, stdout: str) -> None:
    assert refused(answer, stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("Python 3.11 is installed.", SYS_VERSION),
        ("Python 3.11.4 is installed.", VERSION_INFO),
        ("Python 3.11.4 is installed.", "(3, 11, 4)\n"),
        ("It runs Python3.11.", "Python 3.11.4\n"),
        ("It needs Python 3.11+.", "requires_python: >=3.11\n"),
        ("Which Python? Python 3.12.", "total: 5\n"),
    ],
)
def test_a_python_version_an_output_shows_passes(answer: str, stdout: str) -> None:
    question = "Does it work on Python 3.12?" if answer.startswith("Which") else "What is it?"
    assert refused(answer, stdout, question) == []


_RANKED = "1. East\n2. West\n3. North\n"
_SERIES = "East    143\nWest     98\nNorth   210\n"


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("Sales peaked on March 5th.", "peak: 2023-03-04\n"),  # a month's day, no year
        ("Sales peaked on 5 March.", "peak: 2023-03-04\n"),
        ("Sales peaked on the 5th of March.", "peak: 2023-03-04\n"),
        ("The peak was on March 7.", "peak: 2023-03-04\ncount: 7\n"),
        ("The peak was on Mar 4.", "peak: 2023-04-03\n"),
        ("Sales peaked on 5 March.", "peak: 03/05/2023\n"),  # may be 3 May
        ("Sales peaked in april.", "peak: 2023-03-04\n"),  # lowercase
        ("Sales peaked in APRIL.", "peak: 2023-03-04\n"),
        ("Sales peaked in März.", "peak: 2023-04-04\n"),  # other languages
        ("Sales peaked in mars.", "peak: 2023-04-04\n"),
        ("Sales peaked in marzo.", "peak: 2023-04-04\n"),
        ("Sales peaked in avril 2023.", "peak: mars 2023\n"),
        ("Sales peaked on the 5th.", "peak: 2023-03-04\n"),  # a day, its month unsaid
        ("Sales peaked on Sat. the 5th.", "peak: 2023-03-04\n"),
    ],
)
def test_a_month_day_or_a_month_in_other_words_must_be_shown(answer: str, stdout: str) -> None:
    assert refused(answer, stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("Sales peaked on March 6.", "peak: 2023-03-06\n"),
        ("Sales peaked on 6 March.", "peak: 2023-03-06 00:00:00\n"),
        ("Sales peaked on Mar 6th.", "Timestamp('2023-03-06 00:00:00')\n"),
        ("The busiest day was Monday, March 6.", "busiest: 2023-03-06\n"),
        ("Sales peaked on the 6th of March.", "peak: March 6\n"),
        ("Sales peaked in march.", "peak: 2023-03-04\n"),
        ("Sales peaked in März.", "peak: 2023-03-04\n"),
        ("Sales peaked in March 2023.", "peak: mars 2023\n"),
        ("It was sunny on 6 March.", "rain: 0\n"),  # the question's
        ("Sales peaked on the 6th.", "peak: 2023-03-06\n"),
        ("It passed on the 3rd attempt.", "attempts: 3\n"),  # a position, no day
        ("Mars has 2 moons.", "moons: 2\n"),  # a planet, not March
    ],
)
def test_an_honest_month_day_or_month_passes(answer: str, stdout: str) -> None:
    question = "How was the weather on March 6?" if "sunny" in answer else "When?"
    assert refused(answer, stdout, question) == []


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("East came second.", _RANKED),
        ("East came in second.", _RANKED),
        ("East is the runner-up.", _RANKED),
        ("East is #2.", "East rank: 1\n"),
        ("East is ranked No. 2.", "rank  region\n   1    East\n   2    West\n"),
        ("East was the 2nd-largest region.", _RANKED),
        ("West was the second-largest region.", _SERIES),
        ("West came second.", _SERIES),
        ("West was the runner-up.", _SERIES),
        ("West is the largest region.", _SERIES),
        ("West had the most units.", _SERIES),
        ("North had the fewest units.", _SERIES),
    ],
)
def test_a_rank_the_outputs_ranking_contradicts_is_refused(answer: str, stdout: str) -> None:
    assert refused(answer, stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("West came second.", _RANKED),
        ("West is the runner-up.", _RANKED),
        ("East is #1.", "East rank: 1\n"),
        (
            "West is ranked second.",
            "   rank region  units\n0     1   East    143\n1     2   West     98\n",
        ),
        (
            "East ranks 1st with 143 units.",
            "   rank region  units\n0     1   East    143\n1     2   West     98\n",
        ),
        ("East was the second-largest region.", _SERIES),
        ("North is the largest region, West the smallest.", _SERIES),  # two labels: unchecked
        ("North had the most units (210).", _SERIES),
        ("West had the fewest units.", _SERIES),
        (
            "West is the second largest region with 98 units.",
            "East    143\nWest     98\nNorth    12\n",
        ),
        ("North, the largest region, sold 210.", _SERIES),
        ("The most recent order came from West.", _SERIES),  # no rank by value
    ],
)
def test_a_rank_the_outputs_ranking_bears_out_passes(answer: str, stdout: str) -> None:
    assert refused(answer, stdout) == []


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("Sales peaked in March.", "   month  sales\n0      3    500\n1      4    420\n"),
        (
            "Sales peaked in the first quarter.",
            "   quarter  sales\n0        1    900\n1        2    420\n",
        ),
        (
            "The peak hour is 2 pm with 50 orders.",
            "hour\n13    20\n14    50\nName: orders, dtype: int64\n",
        ),
        ("The peak hour is 2 pm.", "   hour  orders\n0    13      20\n1    14      50\n"),
        ("The peak month was March with 500 sales.", "   month  sales\n0      3    500\n"),
    ],
)
def test_a_month_quarter_or_hour_column_shows_its_values(answer: str, stdout: str) -> None:
    assert refused(answer, stdout) == []


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("Sales peaked in May.", "   month  sales\n0      3    500\n1      4    420\n"),
        (
            "Sales peaked in the third quarter.",
            "   quarter  sales\n0        1    900\n1        2    420\n",
        ),
        ("The peak hour is 3 pm.", "hour\n13    20\n14    50\nName: orders, dtype: int64\n"),
        ("The peak hour is 2 am.", "   hour  orders\n0    13      20\n1    14      50\n"),
    ],
)
def test_a_month_quarter_or_hour_no_column_shows_is_refused(answer: str, stdout: str) -> None:
    assert refused(answer, stdout)


_PEAK_LOW = "peak: 2023-03-07\nlow: 2023-03-04\n"  # a Tuesday and a Saturday


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The low was on Tuesday.", _PEAK_LOW),
        ("The peak was on Saturday.", _PEAK_LOW),
        ("The peak was in April.", "peak: 2023-03-07\nlow: 2023-04-04\n"),
        ("The low came in Q1.", "peak: 2023-03-07\nlow: 2023-04-04\n"),
        ("The peak day was Saturday.", "{'peak_day': '2023-03-07', 'low_day': '2023-03-04'}\n"),
    ],
)
def test_a_named_value_shown_under_another_label_is_refused(answer: str, stdout: str) -> None:
    assert refused(answer, stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The low was on Saturday.", _PEAK_LOW),
        ("The peak was on Tuesday, March 7.", _PEAK_LOW),
        ("The peak was on Tuesday and the low on Saturday.", _PEAK_LOW),
        ("The peak was in March.", "peak: 2023-03-07\nlow: 2023-04-04\n"),
        ("The peak day was Tuesday.", "{'peak_day': '2023-03-07', 'low_day': '2023-03-04'}\n"),
        ("Sales were low on Saturday.", _PEAK_LOW),
    ],
)
def test_a_named_value_shown_under_its_label_passes(answer: str, stdout: str) -> None:
    assert refused(answer, stdout) == []


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("Sales peaked at 9 o'clock.", "peak: 2023-03-04 21:00\n"),
        ("Sales peaked at 9 o'clock in the morning.", "peak: 2023-03-04 21:00\n"),
        ("Sales peaked at 9 o'clock in the evening.", "peak: 2023-03-04 09:00\n"),
        ("Sales peaked at 9 o'clock.", "hour  sales\n  21    500\n   8    420\n"),
    ],
)
def test_an_o_clock_is_the_hour_as_written_unless_it_says_the_half(
    answer: str, stdout: str
) -> None:
    assert refused(answer, stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("Sales peaked at 9 o'clock.", "peak: 2023-03-04 09:00\n"),
        ("Sales peaked at 9 o'clock in the evening.", "peak: 2023-03-04 21:00\n"),
        ("Sales peaked at 9 o'clock at night.", "peak: 2023-03-04 21:00\n"),
        ("Sales peaked at 9 o'clock pm.", "peak: 2023-03-04 21:00\n"),
        ("Sales peaked at 21 o'clock.", "peak: 2023-03-04 21:00\n"),
        ("Sales peaked at 9 o'clock.", "peak: 9 o'clock\n"),
    ],
)
def test_an_honest_o_clock_passes(answer: str, stdout: str) -> None:
    assert refused(answer, stdout) == []


_QUARTERS = "quarter  sales\nQ1  10\nQ2  20\nQ3  15\n"
_SERIES = "quarter\nQ1    10\nQ2    20\nQ3    15\nName: sales, dtype: int64\n"
_DAYS = "weekday\nMonday     500\nTuesday    420\nSaturday   120\nName: sales, dtype: int64\n"
_MONTHS = "month\nJan    3.5\nFeb    4.1\nMar    2.2\nName: revenue, dtype: float64\n"


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The peak was Q1.", _QUARTERS),
        ("Sales peaked in Q3.", _QUARTERS),
        ("Q1 had the highest sales.", _SERIES),
        ("The lowest quarter was Q2.", _SERIES),
        ("The busiest day was Tuesday.", _DAYS),
        ("Saturday had the most sales.", _DAYS),
        ("Revenue peaked in January.", _MONTHS),
        ("The weakest month was February.", _MONTHS),
    ],
)
def test_a_peak_or_low_named_by_period_must_be_the_series_extreme(answer: str, stdout: str) -> None:
    assert refused(answer, stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The peak was Q2.", _QUARTERS),
        ("Sales peaked in Q2 with 20.", _QUARTERS),
        ("Q1 had the lowest sales.", _SERIES),
        ("Sales peaked in Q2 and bottomed out in Q1.", _SERIES),
        ("The busiest day was Monday.", _DAYS),
        ("Saturday had the fewest sales.", _DAYS),
        ("Revenue peaked in February.", _MONTHS),
        ("The weakest month was March.", _MONTHS),
        ("Q1 had 10 sales.", _SERIES),
        ("Q3 sales were higher than Q1.", _SERIES),
    ],
)
def test_an_honest_peak_or_low_by_period_passes(answer: str, stdout: str) -> None:
    assert refused(answer, stdout) == []


_BY_QUARTER = "date\n2023Q1    85\n2023Q2    14\nFreq: Q-DEC\n"


@pytest.mark.parametrize(
    ("answer", "refuses"),
    [
        ("Q2 was the strongest quarter.", True),
        ("Sales peaked in Q2.", True),
        ("Q1 was the strongest quarter.", False),
        ("Sales peaked in Q1 and bottomed out in Q2.", False),
    ],
)
def test_a_series_of_pandas_periods_is_ranked(answer: str, refuses: bool) -> None:
    assert bool(refused(answer, _BY_QUARTER)) is refuses
