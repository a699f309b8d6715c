"""Grounding, round fifteen: numbers listed together are a claim about a printed sequence as
a whole: all of its values ("the values are 1"), one printed pair or interval ("the CI is
[0.2, 0.8]"), an order an output shows ("the sorted values are 1, 2, 3"). Pure functions: no
model, no sandbox."""

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
        ("The values are 1.", "array([1.,  2.,  3.])\n"),  # only some are 1
        ("The values are all 1.", "[1 2 3]\n"),
        ("The values are 1 and 2.", "[1 2 3]\n"),
        ("The array is [1, 2].", "result: [1, 2, 3]\n"),
    ],
)
def test_a_list_of_the_values_that_leaves_some_out_is_refused(answer: str, stdout: str) -> None:
    assert any("names them all" in p for p in problems(answer, stdout))


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The values are 1.", "[1 1 1]\n"),  # all of them are 1
        ("The values are 1, 2 and 3.", "array([1.,  2.,  3.])\n"),
        ("The values are 3, 2 and 1.", "[1 2 3]\n"),  # a set, in any order
        ("The array is [1, 2, 3].", "[1 2 3]\n"),
        ("The top values are 9 and 7.", "[9, 7, 5]\n"),  # not "the values": some of them
        ("The eigenvalues are 1.5 and 2.5.", "[1.5 2.5]\n"),
        ("The values are 50% and 20%.", "[50%, 20%]\n"),
    ],
)
def test_a_list_of_all_the_values_is_grounded(answer: str, stdout: str) -> None:
    assert problems(answer, stdout) == []


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The CI is [0.2, 0.8].", "ci: (0.2, 0.9)\nalpha: 0.8\n"),  # one end from elsewhere
        ("The CI is 0.2 to 0.8.", "ci: (0.2, 0.9)\nalpha: 0.8\n"),
        ("The interval is (0.9, 0.2).", "ci: (0.2, 0.9)\n"),  # a pair the other way round
        ("The bounds are 1.5 \u2013 7.", "bounds: [1.5, 2.5]\nn: 7\n"),
    ],
)
def test_a_pair_not_printed_together_is_refused(answer: str, stdout: str) -> None:
    assert any("only in a sequence" in p for p in problems(answer, stdout))


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The CI is [0.2, 0.9].", "ci: (0.2, 0.9)\nalpha: 0.8\n"),
        ("The CI is 0.2 to 0.9.", "ci: (0.2, 0.9)\n"),
        ("Scores were 90 and 85.", "scores: [85, 90]\n"),  # a plain list, any order
        ("Values range from 1 to 100.", "min: 1\nmax: 100\n"),  # not printed as a pair
        ("Sales went from 10 to 15.", "jan: 10\nfeb: 15\nall: [3, 10]\n"),
        ("The shape is (100, 3).", "rows: 100\ncols: 3\n"),
        # A plain list and a change may gather values printed in separate sequences.
        ("The accuracies were 0.91 and 0.88.", "train: (0.91, 0.85)\ntest: (0.88, 0.80)\n"),
        ("Sales rose from 10 to 15.", "2022: [10, 12]\n2023: [15, 17]\n"),
    ],
)
def test_a_pair_printed_together_or_apart_as_shown_is_grounded(answer: str, stdout: str) -> None:
    assert problems(answer, stdout) == []


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The sorted values are 1, 2, 3.", "sorted: [3, 2, 1]\n"),
        ("Sorted, the values are 1, 2, 3.", "[3, 2, 1]\n"),
        ("In order: 1, 2, 3.", "order: [3, 2, 1]\n"),
        ("Ranked, they are 98, 143, 210.", "North    210\nEast    143\nWest     98\n"),
        ("In descending order: 1, 2, 3.", "[1, 2, 3]\n"),  # printed so, but not descending
    ],
)
def test_an_order_no_output_shows_is_refused(answer: str, stdout: str) -> None:
    assert any("order" in p for p in problems(answer, stdout))


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The sorted values are 1, 2, 3.", "values: [3, 1, 2]\nsorted: [1, 2, 3]\n"),
        ("In descending order: 3, 2, 1.", "[3, 2, 1]\n"),
        ("Ranked: 210, 143, 98.", "North    210\nEast    143\nWest     98\n"),  # down lines
    ],
)
def test_an_order_an_output_shows_is_grounded(answer: str, stdout: str) -> None:
    assert problems(answer, stdout) == []


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The top 3 are 9, 7, 5.", "top: [9, 7, 5]\n"),  # 3 counts the list
        ("The top 2 regions are 210 and 143.", "North 210\nEast 143\nWest 98\n"),
        ("The bottom 2: 98, 143.", "North 210\nEast 143\nWest 98\n"),
    ],
)
def test_the_n_of_a_top_n_list_counts_the_list(answer: str, stdout: str) -> None:
    assert problems(answer, stdout) == []


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The top 3 are 9, 7.", "top: [9, 7, 5]\n"),  # two listed: 3 counts nothing shown
        ("The top 3 are 5, 9, 7.", "top: [9, 7, 5]\n"),  # not in rank order
    ],
)
def test_a_top_n_list_of_another_size_or_out_of_rank_is_refused(answer: str, stdout: str) -> None:
    assert problems(answer, stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("In order to compare, the means are 4 and 2.", "a: 2\nb: 4\n"),
        ("Customers ordered 5 and 3 items.", "East: 3\nWest: 5\n"),
    ],
)
def test_order_words_that_claim_no_order_do_not_order_the_list(answer: str, stdout: str) -> None:
    assert problems(answer, stdout) == []


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The value is 100.", "value: 1\ncount: 100\n"),
        ("The total is 100.", "total: 1\ncount: 100\n"),
        ("The result is 100.", "result: 1\ncount: 100\n"),
    ],
)
def test_a_generic_subject_names_the_key_it_is(answer: str, stdout: str) -> None:
    assert any("the outputs show" in p for p in problems(answer, stdout))


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The result is 1.", "result: 1\ncount: 100\n"),
        ("The total is 241.", "East    143\nWest     98\ntotal: 241\n"),
        ("The value of x is 3.", "x: 3\nvalue: 7\n"),  # not the whole subject
        ("The total number of rows is 100.", "rows: 100\ntotal: 5\n"),
        ("The sum of the values is 6.", "values: [1 2 3]\nsum: 6\n"),
        ("The result is 6.", "values: [1 2 3]\nresult: 6\n"),
    ],
)
def test_a_generic_word_that_is_not_the_subject_ties_no_key(answer: str, stdout: str) -> None:
    assert problems(answer, stdout) == []
