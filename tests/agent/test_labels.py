"""Which label a printed number belongs to, read from the shapes programs print: several
labelled numbers on a line, pretty-printed JSON and dicts, parallel arrays, a label after the
number. A claim tying a number to another label is refused; honest ones pass. Pure functions."""

from __future__ import annotations

import pytest

from execbox.agent import ground
from execbox.agent.evidence import Context, Evidence
from execbox.agent.models import RunOutput


def refused(answer: str, stdout: str) -> list[str]:
    evidence = Evidence.of([RunOutput(run_id="run1", stdout=stdout)], [])
    claims = ground.check(answer, evidence, Context("What is the result?"), [])
    return [c.text for c in claims if not c.grounded]


_JSON = '{\n  "East": {\n    "units": 143,\n    "revenue": 1200\n  },\n  "West": {\n    "units": 98,\n    "revenue": 800\n  }\n}\n'
_RECORDS = (
    '[\n  {\n    "region": "East",\n    "units": 143\n  },\n'
    '  {\n    "region": "West",\n    "units": 98\n  }\n]\n'
)
_PPRINT = (
    "{'East': {'revenue': 1200, 'units': 143},\n 'North': {'revenue': 2100, 'units': 210},\n"
    " 'West': {'revenue': 800, 'units': 98}}\n"
)
_NESTED = '{\n  "sales": {\n    "regions": [\n      {"name": "East", "units": 143},\n      {"name": "West", "units": 98}\n    ]\n  }\n}\n'
_NUMPY = "['East' 'West' 'North']\n[143  98 210]\n"
_LISTS = "names = ['East', 'West', 'North']\nunits = [143, 98, 210]\n"
_KEYED = "regions: ['East', 'West', 'North']\nunits: [143, 98, 210]\n"
_PANDAS = "Index(['East', 'West', 'North'], dtype='object')\narray([143,  98, 210])\n"


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The p99 is 12 ms.", "p50=12ms p99=30ms\n"),
        ("The p50 was 30 ms.", "latency p50=12ms p99=30ms\n"),
        ("The p50 was 30 ms.", "latency: p50 12ms, p99 30ms\n"),
        ("The max is 3.", "min 3 max 9 mean 5.5\n"),
        ("The mean is 9.", "min 3 max 9 mean 5.5\n"),
        ("West sold 143.", "East: 143, West: 98\n"),
        ("West sold 143 units.", "East=143 West=98 North=210\n"),
        ("Train accuracy was 0.85.", "accuracy: train=0.92 test=0.85\n"),
        ("Test acc was 0.92.", "train acc 0.92 test acc 0.85\n"),
        ("Train accuracy was 0.85.", "train acc 0.92 test acc 0.85\n"),
        ("There were 98 user accounts.", "users: 143\nadmins: 98\n"),  # the other number
        ("The user count was 98.", "users: 143\nadmins: 98\n"),
        ("Easts sold 98.", "East: 143\nWest: 98\n"),
    ],
)
def test_several_labelled_numbers_on_a_line_each_belong_to_their_label(
    answer: str, stdout: str
) -> None:
    assert refused(answer, stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("East had 98 units.", _JSON),
        ("East's revenue was 800.", _JSON),
        ("The revenue for East was 800.", _JSON),
        ("East had 98 units.", _RECORDS),
        ("East sold 98.", _RECORDS),
        ("East had 98 units.", _PPRINT),
        ("North's revenue was 800.", _PPRINT),
        ("East had 98 units.", _NESTED),
    ],
)
def test_a_value_printed_over_several_lines_is_labelled_by_its_keys(
    answer: str, stdout: str
) -> None:
    assert refused(answer, stdout)


@pytest.mark.parametrize("stdout", [_NUMPY, _LISTS, _KEYED, _PANDAS])
@pytest.mark.parametrize("answer", ["East had 98 units.", "North sold 143.", "West: 210."])
def test_parallel_arrays_label_each_position_by_the_same_position(answer: str, stdout: str) -> None:
    assert refused(answer, stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The answer is 98 (East).", "East: 143\nWest: 98\n"),
        ("The best was 98 units (East).", "East: 143\nWest: 98\n"),
        ("It sold 210 (West).", "East    143\nWest     98\nNorth   210\n"),
        ("East sold 143 units (31%).", "East: 143 units (12%)\nWest: 98 units (31%)\n"),
    ],
)
def test_a_label_in_parentheses_after_a_number_is_its_label(answer: str, stdout: str) -> None:
    assert refused(answer, stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The p99 is 30 ms and the p50 12 ms.", "p50=12ms p99=30ms\n"),
        ("The p50 was 12 ms.", "latency: p50 12ms, p99 30ms\n"),
        ("The max is 9, the mean 5.5.", "min 3 max 9 mean 5.5\n"),
        ("West sold 98.", "East: 143, West: 98\n"),
        ("There are 143 users and 98 admin accounts.", "users: 143\nadmins: 98\n"),
        ("Train accuracy was 0.92.", "accuracy: train=0.92 test=0.85\n"),
        ("Train accuracy was 0.92, test accuracy 0.85.", "train acc 0.92 test acc 0.85\n"),
        ("It processed 500 rows in 3 s.", "Processed 500 rows in 3 s\n"),
        ("East had 143 units and a revenue of 1200.", _JSON),
        ("West sold 98.", _RECORDS),
        ("North's revenue was 2100.", _PPRINT),
        ("West had 98 units.", _NESTED),
        ("East had 143 units, North 210.", _NUMPY),
        ("West sold 98.", _LISTS),
        ("North sold 210.", _KEYED),
        ("West sold 98.", _PANDAS),
        ("The answer is 98 (West).", "East: 143\nWest: 98\n"),
        ("The best was 143 units (East).", "East: 143\nWest: 98\n"),
        ("East sold 143 units (12%).", "East: 143 units (12%)\nWest: 98 units (31%)\n"),
        ("East sold 143 units (39%).", "East: 143\nWest: 98\nshare: 0.39\n"),
        ("North had the highest sales (210).", "East    143\nWest     98\nNorth   210\n"),
        ("East had the highest revenue (1543.50).", "East     1543.50\nWest       98.00\n"),
    ],
)
def test_honest_answers_on_these_shapes_pass(answer: str, stdout: str) -> None:
    assert refused(answer, stdout) == []


@pytest.mark.parametrize(
    "stdout",
    [
        "['East' 'West']\n[143  98 210]\n",  # another length
        "['East' 'West' 'North']\n[143  '98' 210]\n",  # not all numbers
        '{\n  "East": {\n    "note": "143 (est.)",\n    "x": 143\n  }\n}\n',  # in a string
        "{\n"
        + "".join(f'  "k{i}": {i},\n' for i in range(3000))
        + '  "East": {\n    "x": 143\n  }\n}\n',  # too long to parse
    ],
)
def test_unclear_printed_values_give_no_labels(stdout: str) -> None:
    assert refused("East sold 98.", stdout + "total: 98\n") == []


_EW = "East: 143\nWest: 98\n"
_FRAME = (
    "        region  units  share\n0         East    143   0.12\n"
    "1         West     98   0.31\n2        North    210   0.57\n"
)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("98, for East.", _EW),
        ("98 is East's total.", _EW),
        ("98 belongs to East.", _EW),
        ("98 units went to East.", _EW),
        ("It had 98 units in East.", _FRAME),
        ("98 units were sold in East.", _FRAME),
        ("Looking at East, it sold 98 units.", _EW),
    ],
)
def test_a_label_after_the_number_in_prose_is_its_label(answer: str, stdout: str) -> None:
    assert refused(answer, stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("98, for West.", _EW),
        ("98 is West's total.", _EW),
        ("It had 98 units in West.", _FRAME),
        ("98 units were sold in West.", _FRAME),
        ("Looking at West, it sold 98 units.", _EW),
        ("West sold 98, while East sold 143.", _EW),
        ("West had 98 units against East's 143.", _EW),
        ("98 units went to West, not East.", _EW),
        ("The gap is 45 between East and West.", _EW + "gap: 45\n"),
        ("In total, East sold 143 units.", _EW),
        ("For comparison, West sold 98.", _EW),
    ],
)
def test_honest_labels_after_the_number_pass(answer: str, stdout: str) -> None:
    assert refused(answer, stdout) == []


# As pandas prints them: a MultiIndex shows its first level once per run of rows.
_MULTI = (
    "                units  revenue\nregion product                \n"
    "East   A          143     1200\n       B           98      800\n"
    "West   A          210     1500\n"
)
_PIVOT = "product      A     B\nregion              \nEast     143.0  98.0\nWest     210.0  77.0\n"
_GROUPED = (
    "region  product\nEast    A          143\n        B           98\nWest    A          210\n"
    "Name: units, dtype: int64\n"
)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("East sold 98 units of A.", _MULTI),
        ("East product A sold 98 units.", _MULTI),
        ("West's B revenue was 800.", _MULTI),
        ("For East, B was 77.", _PIVOT),
        ("For West, A was 98.", _PIVOT),
        ("East's B was 77.", _PIVOT),
        ("East sold 98 of A.", _GROUPED),
        ("West B: 98.", _GROUPED),
    ],
)
def test_a_row_and_a_column_label_name_one_cell(answer: str, stdout: str) -> None:
    assert refused(answer, stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("East sold 98 units of B.", _MULTI),
        ("East product B sold 98 units.", _MULTI),
        ("East's B revenue was 800.", _MULTI),
        ("West's A revenue was 1500.", _MULTI),
        ("For East, B was 98.", _PIVOT),
        ("For West, B was 77.", _PIVOT),
        ("East's A was 143.", _PIVOT),
        ("East sold 98 of B.", _GROUPED),
        ("West A sold 210.", _GROUPED),
        ("West sold 98 units.", _FRAME),
        (
            "The mean price is 10.5.",
            "       units  price\nmean   42.0   10.5\nmax    47.0   12.3\n",
        ),
    ],
)
def test_honest_cells_of_a_row_and_a_column_pass(answer: str, stdout: str) -> None:
    assert refused(answer, stdout) == []


# As pandas prints them (describe() of two columns, value_counts(normalize=True), head(),
# corr(), a groupby of month names and of quarters).
_DESCRIBE = (
    "           units      price\ncount   7.000000   7.000000\nmean   14.142857   7.250000\n"
    "std     8.933618   4.677072\nmin     5.000000   3.500000\n25%     8.000000   3.500000\n"
    "50%    12.000000   3.500000\n75%    18.000000  12.250000\nmax    30.000000  12.250000\n"
)
_SHARES = (
    "region\nEast     0.428571\nWest     0.285714\nNorth    0.285714\n"
    "Name: proportion, dtype: float64\n"
)
_MONEY = "East: $257.25\nNorth: $110.25\nWest: $162.75\n"
_HEAD = (
    "        date region product  units  price  revenue\n"
    "0 2023-01-02   East       A     12   3.50    42.00\n"
    "1 2023-01-03   West       B      7  12.25    85.75\n"
    "2 2023-02-06   East       A     30   3.50   105.00\n"
)
_CORR = (
    "         units  price  revenue\nunits    1.000 -0.748    0.305\n"
    "price   -0.748  1.000    0.353\nrevenue  0.305  0.353    1.000\n"
)
_BY_MONTH = "date\nApril       14\nFebruary    35\nJanuary     19\nMarch       31\nName: units, dtype: int64\n"
_BY_DAY = "date\nFriday      9\nMonday     78\nTuesday    12\nName: units, dtype: int64\n"


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The median units is 8.", _DESCRIBE),
        ("The median price is 12.25.", _DESCRIBE),
        ("West accounts for 43% of rows.", _SHARES),
        ("North brought in about $160.", _MONEY),
        ("Units range from 3.5 to 30.", _DESCRIBE),
        ("The best month was March with 35 units.", _BY_MONTH),
        ("Monday sold 12 units.", _BY_DAY),
        ("The first row is West with 12 units.", _HEAD),
        ("West sold 30 units.", _HEAD),
        ("Units and price correlate at 0.305.", _CORR),
        ("The correlation between price and revenue is -0.748.", _CORR),
    ],
)
def test_labels_in_pandas_summaries_hold_their_own_numbers(answer: str, stdout: str) -> None:
    assert refused(answer, stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The median units is 12.", _DESCRIBE),
        ("The median price is 3.5.", _DESCRIBE),
        ("West accounts for 29% of rows.", _SHARES),
        ("North brought in about $110.", _MONEY),
        ("Units range from 5 to 30.", _DESCRIBE),
        ("The best month was February with 35 units.", _BY_MONTH),
        ("Monday sold 78 units.", _BY_DAY),
        ("The first row is East with 12 units.", _HEAD),
        ("East sold 30 units on 2023-02-06.", _HEAD),
        ("Units and revenue correlate at 0.305.", _CORR),
        ("The correlation between price and units is -0.748.", _CORR),
    ],
)
def test_honest_claims_on_pandas_summaries_pass(answer: str, stdout: str) -> None:
    assert refused(answer, stdout) == []


_IDXMAX = "best_region: East\nbest_units: 51\nworst_region: North\n"


@pytest.mark.parametrize(
    ("answer", "refuses"),
    [
        ("The best region was North.", True),
        ("West was the worst region.", True),
        ("The best region is East.", False),
        ("North was the worst region, East the best.", False),
        ("It was the best region by far.", False),
    ],
)
def test_a_name_given_a_key_must_be_the_name_it_shows(answer: str, refuses: bool) -> None:
    assert bool(refused(answer, _IDXMAX)) is refuses


_CROSSTAB = "product  A  B\nregion       \nEast     2  1\nNorth    1  1\nWest     1  1\n"
_SERIES_DESCRIBE = (
    "count     7.000000\nmean     14.142857\nstd       8.933618\nmin       5.000000\n"
    "25%       8.000000\n50%      12.000000\n75%      18.000000\nmax      30.000000\n"
    "Name: units, dtype: float64\n"
)
_RATES = "conversion_rate: 0.0342\nclicks: 12,480\nconversions: 427\n"


@pytest.mark.parametrize(
    ("answer", "stdout", "refuses"),
    [
        ("East has 1 A sale.", _CROSSTAB, True),
        ("East has 2 A sales.", _CROSSTAB, False),
        ("The upper quartile is 30.", _SERIES_DESCRIBE, True),
        ("The upper quartile is 18.", _SERIES_DESCRIBE, False),
        ("The lower quartile is 12.", _SERIES_DESCRIBE, True),
        ("The conversion rate is 3.42%.", _RATES, False),
        ("The conversion rate is 4.27%.", _RATES, True),
    ],
)
def test_a_capital_a_quartiles_and_the_longest_label(
    answer: str, stdout: str, refuses: bool
) -> None:
    assert bool(refused(answer, stdout)) is refuses


_BY_MONTH_START = (
    "date\n2023-01-01    19\n2023-02-01    35\n2023-03-01    31\n2023-04-01    14\nFreq: MS\n"
)
_CHANGES = "date\n2023-01      NaN\n2023-02    0.842\n2023-03   -0.114\n2023-04   -0.548\nFreq: M\n"
_QUARTERS = "date\n2023Q1    85\n2023Q2    14\nFreq: Q-DEC\n"


@pytest.mark.parametrize(
    ("answer", "stdout", "refuses"),
    [
        ("February had 31 units.", _BY_MONTH_START, True),
        ("January sold 35.", _BY_MONTH_START, True),
        ("February had 35 units.", _BY_MONTH_START, False),
        ("January sold 19, February 35.", _BY_MONTH_START, False),
        ("Units rose 84.2% in March.", _CHANGES, True),
        ("Units fell 11.4% in April.", _CHANGES, True),
        ("Units rose 84.2% in February.", _CHANGES, False),
        ("Units fell 54.8% in April.", _CHANGES, False),
        ("Q1 sold 14 units.", _QUARTERS, True),
        ("Q1 sold 85 units.", _QUARTERS, False),
    ],
)
def test_rows_a_date_or_period_labels_hold_their_own_numbers(
    answer: str, stdout: str, refuses: bool
) -> None:
    assert bool(refused(answer, stdout)) is refuses


@pytest.mark.parametrize(
    ("answer", "refuses"),
    [
        ("East and West had 98 and 143 respectively.", True),
        ("West and East sold 143 and 98, respectively.", True),
        ("East and West had 143 and 98 respectively.", False),
        ("West and East sold 98 and 143, respectively.", False),
        ("East, West and North had 143, 98 and 210 respectively.", False),
    ],
)
def test_labels_and_numbers_respectively_pair_in_order(answer: str, refuses: bool) -> None:
    assert bool(refused(answer, "East: 143\nWest: 98\nNorth: 210\n")) is refuses


@pytest.mark.parametrize(
    "answer",
    [
        "The gap of 45 units favours East.",
        "A margin of 45 units favored East.",
        "45 units separate West, which trails East.",
    ],
)
def test_a_label_after_a_word_making_it_anothers_ties_nothing(answer: str) -> None:
    assert refused(answer, "East: 143\nWest: 98\ndiff: 45\n") == []
