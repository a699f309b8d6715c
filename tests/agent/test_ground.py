"""The deterministic grounding check: what an answer may state, given the outputs it relies on.
Pure functions: no model, no sandbox."""

from __future__ import annotations

from typing import Any

import pytest

from execbox.agent import (
    comparison,
    ground,
    ground_numbers,
    ground_text,
    labels,
    quantities,
    values,
)
from execbox.agent import evidence as evidence_module
from execbox.agent.models import Claim, RunOutput, Verdict
from execbox.contract import Artifact


def claims(
    answer: str,
    *,
    stdout: str = "",
    result: Any = None,
    question: str = "Question?",
    code: str = "",
    heads: tuple[str, ...] = (),
    verdicts: list[Verdict] | None = None,
    artifacts: list[Artifact] | None = None,
) -> list[Claim]:
    evidence = evidence_module.Evidence.of(
        [RunOutput(run_id="run1", stdout=stdout, result=result)], artifacts or [], "run1"
    )
    context = evidence_module.Context(question, code, ("sales.csv",), heads)
    return ground.check(answer, evidence, context, verdicts or [])


def bad(answer: str, **kwargs: Any) -> list[str]:
    return [c.text for c in claims(answer, **kwargs) if not c.grounded]


def test_a_number_the_output_contradicts_is_named_with_the_nearest_evidence() -> None:
    claim, stated = claims("The result is 7.", stdout="sum 6\n6\n", result=6)
    assert not claim.grounded and claim.text == "7"
    assert "nearest is stdout line 1: sum 6" in claim.detail
    assert (stated.kind, stated.grounded) == ("result", False)


def test_a_number_the_output_shows_cites_its_run_and_line() -> None:
    [claim] = claims("The result is 6.", stdout="values 3 1 2\nsum 6\n")
    assert claim.grounded and claim.run_id == "run1" and claim.source == "stdout line 2: sum 6"


@pytest.mark.parametrize(
    ("answer", "value"),
    [
        ("Pi is 3.14.", 3.14159),  # rounded to the stated digits
        ("Pi is 3.1415, truncated.", 3.14159),  # truncated, as the answer says
        ("About 2.5 million people.", 2_497_312),
        ("Roughly 2,500,000 people.", 2_497_312),
        ("2,497,312 people.", 2_497_312),
        ("2.5M people.", 2_497_312),
        ("The share is 45%.", 0.4512),
        ("The share is 45.1%.", 0.4512),
        ("The share is 45.12 percent.", 0.4512),
        ("The rate is 1.2e-5.", 1.2e-05),
        ("The rate is 1.2 × 10^-5.", 1.2e-05),
        ("The change is -3.5.", -3.5),
        ("Sales fell by 3.5.", -3.5),
        ("Over 2 million people.", 2_497_312),
        ("Revenue was $1,234.50.", 1234.5),
    ],
)
def test_stated_rounding_and_number_formats_are_grounded(answer: str, value: float) -> None:
    assert bad(answer, result={"value": value}, question="How much, in dollars?") == []


@pytest.mark.parametrize(
    ("answer", "value"),
    [
        ("Pi is 3.15.", 3.14159),
        ("About 2.6 million people.", 2_497_312),
        ("2,497,313 people.", 2_497_312),
        ("The share is 46%.", 0.4512),
        ("The rate is 1.3e-5.", 1.2e-05),
        ("The change is 3.5.", -3.5),  # the sign is part of the value
        ("The change is -3.5.", 3.5),
        ("Under 2 million people.", 2_497_312),
    ],
)
def test_values_the_rounding_does_not_cover_are_not_grounded(answer: str, value: float) -> None:
    assert len(bad(answer, result={"value": value})) == 1


def test_question_numbers_list_markers_ordinals_and_line_numbers_need_no_evidence() -> None:
    answer = (
        "The top 5 regions in 2023:\n1. north\n2. east\nThe 3rd is south; the error was "
        "at line 12, rounded to 2 decimal places (run 0123456789abcdef0123456789abcdef)."
    )
    assert bad(answer, result=["north", "east", "south"], question="Top 5 regions in 2023?") == []


def test_a_markdown_answer_with_tables_lists_and_names_is_grounded() -> None:
    answer = (
        "### Top 3\n| region | units |\n|---|---|\n| north | 7 |\n| south | 3 |\n"
        "- 3/4 of rows were valid (p < 0.001, r = 0.87), COVID-19 cases aside."
    )
    result = {"north": 7, "south": 3, "valid": 0.75, "p": 0.00012, "r": 0.8712}
    assert bad(answer, result=result) == []
    assert bad("2/3 of rows were valid.", result=result) == ["2/3"]
    assert bad("p < 0.0001.", result=result) == ["0.0001"]


def test_a_long_number_is_checked_not_taken_for_a_run_id() -> None:
    assert bad("The product is 12345678901234567890.", result=[1]) == ["12345678901234567890"]


def test_counts_of_items_in_the_result_are_grounded() -> None:
    assert bad("There are 3 regions.", result={"north": 7, "east": 5, "south": 1}) == []
    assert bad("There are 4 regions.", result={"north": 7, "east": 5, "south": 1}) == ["4"]


@pytest.mark.parametrize(
    ("answer", "ok"),
    [
        ("Joined on 2024-01-05.", True),
        ("Joined on January 5, 2024.", True),
        ("Joined on 5 Jan 2024.", True),
        ("Joined in January 2024.", True),
        ("Joined on 2024-01-06.", False),
        ("Joined in March 2024.", False),
        ("Started on 2023-12-31, as asked.", True),  # the question's own date
    ],
)
def test_dates_must_match_an_output_date(answer: str, ok: bool) -> None:
    found = bad(answer, result={"joined": "2024-01-05"}, question="Who joined after 2023-12-31?")
    assert (found == []) is ok, found


def test_quoted_values_must_appear_as_whole_words() -> None:
    result = {"north": 17, "note": "values trimmed"}
    assert (
        bad(
            "'north' and \"values trimmed\" and `df.units`",
            result=result,
            code="print(df.units.sum())",
        )
        == []
    )
    assert bad('The best region is "west".', result=result) == ["west"]
    assert bad('The total is "7".', result=result) == ["7"]  # 17 is not 7


def test_a_unit_the_outputs_do_not_state_is_invented() -> None:
    found = claims("The total is 17 kg.", stdout="total: 17\n")
    assert [(c.kind, c.grounded) for c in found] == [("number", True), ("unit", False)]
    assert "'kg' appears in no output" in found[1].detail
    assert bad("The total is $17.", stdout="total: 17\n") == ["$17"]
    assert bad("The total is $17.", stdout="total: 17\n", heads=("item,price_usd",)) == []
    assert bad("The total is 17 kilograms.", stdout="total weight (kg): 17\n") == []


def test_artifact_sizes_ground_sizes_in_bytes_and_kilobytes() -> None:
    art = Artifact(path="chart.png", size=12288, sha256="0" * 64, mime_type="image/png")
    assert bad("chart.png is 12 KB (12288 bytes).", artifacts=[art]) == []
    assert bad("chart.png is 15 KB.", artifacts=[art]) == ["15 KB"]


def test_claimed_checks_must_have_run_and_passed() -> None:
    invariant = Verdict(check="invariant", passed=True, detail="counts are non-negative")
    failed_cross = Verdict(check="cross_check", passed=False, detail="disagrees")
    assert bad("The result is 6, verified by running the code.", result=6) == ["verified"]
    assert bad("The result is 6, verified.", result=6, verdicts=[invariant]) == []
    assert bad("6; all unit tests pass.", result=6, verdicts=[invariant]) == ["unit tests"]
    assert bad("6, cross-checked.", result=6, verdicts=[invariant, failed_cross]) == [
        "cross-checked"
    ]
    [claim] = [
        c
        for c in claims("6, verified.", result=6, verdicts=[invariant])
        if c.kind == "verification"
    ]
    assert claim.source is not None and "invariant" in claim.source


def test_fenced_program_and_output_lines_are_not_claims_other_fenced_lines_are() -> None:
    code = "x = sum(range(99))\nprint(x)\n"
    answer = "Computed with:\n```python\nx = sum(range(99))\nprint(x)\n```\nwhich printed\n```\nsum 6\n```"
    assert bad(answer, result=6, stdout="sum 6\n", code=code) == []
    assert bad(
        "Computed with:\n```\nx = sum(range(98))\n```\nThe result is 6.", result=6, code=code
    ) == ["98"]


@pytest.mark.parametrize(
    ("answer", "result", "ok"),
    [
        ("The result is shown in the output above.", 6, False),
        ("The answer is 6.", 6, True),
        ("About 2.5 million.", 2_497_312, True),
        ("East sold the most units.", "east", True),
        ("North sold the most units.", "east", False),
        ("Bob joined on January 5, 2024.", "2024-01-05", True),
        ("See the cleaned file.", {"rows": 4}, True),  # a structured result: its parts are claims
    ],
)
def test_a_single_value_result_must_be_stated(answer: str, result: Any, ok: bool) -> None:
    stated = [c for c in claims(answer, result=result) if c.kind == "result"]
    assert all(c.grounded for c in stated) is ok, stated


def test_a_written_table_is_summarized_by_its_columns_and_rows() -> None:
    data = b"name,city\nAlice,Paris\nBob,Berlin\nCarol,Rome\n"
    art = Artifact(
        path="people_clean.csv", size=len(data), sha256="0" * 64, mime_type="text/csv", data=data
    )
    found = claims("people_clean.csv has 3 rows with columns `name` and `city`.", artifacts=[art])
    assert all(c.grounded for c in found), found
    assert (
        found[-1].source == "artifact people_clean.csv: 4 lines, first: name,city (rows after it)"
    )
    assert bad("people_clean.csv has 5 rows.", artifacts=[art]) == ["5"]
    # Its values are not evidence: only what was printed is.
    assert bad("Bob lives in 'Berlin'.", artifacts=[art]) == ["Berlin"]


# -- issue 37: false claims the check let through -----------------------------------------------


@pytest.mark.parametrize(
    ("answer", "result", "stdout"),
    [
        ("The code printed 6, but the correct sum is seven.", 6, "sum 6\n"),  # number in words
        ("The result is 6 + 1.", 6, "sum 6\n"),  # an operation claims its value (7)
        ("The share of heads is 0.5%.", 0.5, ""),  # a ratio is not a percentage of itself
        ("Not a loss at all: the profit was 6.", -6, "profit -6\n"),  # the words deny the sign
        ("The revenue is 1 million dollars.", 1_999_999, ""),  # truncated, not rounded
        ("The sum is 6, about 10.", 6, ""),  # rounds to one digit, but off by two thirds
        ("The sum is more than 6.", 6, ""),  # a strict bound excludes the number itself
    ],
)
def test_false_claims_past_words_operations_percent_sign_and_bounds(
    answer: str, result: Any, stdout: str
) -> None:
    assert (
        bad(answer, result=result, stdout=stdout, question="What is 3 + 1 + 2, in dollars?") != []
    )


@pytest.mark.parametrize(
    ("answer", "result", "stdout"),
    [
        ("The sum is six.", 6, ""),
        ("The product is twenty-three times seventeen, 391.", 391, ""),
        ("3 + 1 + 2 = 6.", 6, ""),
        ("The sum of 3 + 1 + 2 is 6.", 6, ""),
        ("The share is 50%.", 0.5, ""),
        ("The share is 45.12%.", 45.12, "share 45.12%\n"),
        ("Sales fell by 6.", -6, ""),
        ("A loss of 6.", -6, ""),
        ("The revenue is 2 million dollars.", 1_999_999, ""),
        ("About 10 items.", 9.7, ""),
        ("About 0.3 of them.", 0.33, ""),
        ("At least 6.", 6, ""),
        ("More than 5.", 6, ""),
    ],
)
def test_true_claims_in_words_operations_percent_sign_and_bounds_hold(
    answer: str, result: Any, stdout: str
) -> None:
    assert (
        bad(
            answer,
            result=result,
            stdout=stdout,
            question="What are 3 + 1 + 2 and twenty-three times seventeen, in dollars?",
        )
        == []
    )


@pytest.mark.parametrize(
    "claim",
    [
        "confirmed",
        "checked twice",
        "all assertions passed",
        "proven correct",
        "re-checked by hand",
        "certified",
        "validated",
        "tested",
        "double-checked",
    ],
)
def test_verification_in_other_words_needs_a_check_that_passed(claim: str) -> None:
    assert bad(f"The result is 6, {claim}.", result=6) != []
    invariant = Verdict(check="invariant", passed=True, detail="sum is positive")
    tests = Verdict(check="tests", passed=True, detail="3 tests")
    cross = Verdict(check="cross_check", passed=True, detail="agrees")
    assert bad(f"The result is 6, {claim}.", result=6, verdicts=[invariant, tests, cross]) == []


# -- issue 37, second attack: number expressions read whole -------------------------------------


def grounded(answer: str, stdout: str, code: str = "") -> bool:
    """Whether `check` finds nothing ungrounded, as the agent loop decides (`problems`)."""
    evidence = evidence_module.Evidence.of([RunOutput(run_id="run1", stdout=stdout)], [])
    context = evidence_module.Context("How many rows are there?", code)
    return ground.problems(ground.check(answer, evidence, context, [])) == []


@pytest.mark.parametrize(
    ("answer", "stdout", "code"),
    [
        ("Revenue was $5bn.", "revenue: 6\n", ""),  # a magnitude glued to the digits
        ("The new version is 50x faster.", "speedup: 1.1\n", ""),  # a multiplier
        ("The clock runs at 5GHz.", "freq_mhz: 800\n", ""),  # a unit glued to the digits
        ("It finished in 24h.", "elapsed_s: 3\n", ""),
        ("There are a million rows.", "rows: 6\n", ""),  # magnitudes in words
        ("There are a hundred rows.", "rows: 6\n", ""),
        ("There are a dozen rows.", "rows: 6\n", ""),
        ("There are two billion rows.", "rows: 2\n", ""),
        ("Rows: 6 thousand.", "rows: 6\n", ""),
        ("Half of the rows are empty.", "empty: 1 of 6\n", ""),  # a fraction in words
        ("Only one test failed.", "failed: 3\n", ""),  # a lone "one" that is a count
        ("The total is:\n```\n999\n```", "total: 6\n", ""),  # fenced, not the program's
        ("The total is ```999```.", "total: 6\n", ""),
        ("The total is\n999. That is final.", "total: 6\n", ""),  # not a list marker
        ("The total is\n999) final.", "total: 6\n", ""),
        ("The total is\n1. That is all.", "total: 6\n", ""),  # a list of one is no list
        ("Between 3-500 rows.", "rows: 6\n3\n", ""),  # a range, not an identifier
        ("The total is `100`.", "total: 6\n", "for i in range(100): pass\nprint('total:', 6)"),
        ("The key has 12 digits.", "key_len: 6\n", ""),  # not a rounding statement
        ("Revenue fell by 3.", "revenue change: 3\n", ""),  # the output's change is +3
        ("Sales were up-40% this year.", "growth: 0.1\n", ""),
        ("The top-500 customers bought it.", "customers: 6\n", ""),
        ("The net cost was (300).", "cost: 300\n", ""),  # accounting: -300
        ("The mean is 1e3.", "mean: 1000.4\n", ""),  # scientific notation states its digits
        ("Rows: \u0669\u0669\u0669", "rows: 6\n", ""),  # Arabic-Indic digits
        ("Rows: 1\u200b2", "answer: 1\nother: 2\n", ""),  # a zero-width space inside 12
        ("Rows: \uff11\uff12", "answer: 1\nother: 2\n", ""),  # fullwidth digits
        ("The answer is 4 2.", "answer: 4\nother: 2\n", ""),  # digit groups are one number
        ("The answer is 1_2.", "answer: 1\nother: 2\n", ""),
        ("The answer is 1'2.", "answer: 1\nother: 2\n", ""),
        ("There are 6 K rows.", "rows: 6\n", ""),  # a spaced magnitude
        ("There are 6 millions of rows.", "rows: 6\n", ""),
        ("There are 6-million rows.", "rows: 6\n", ""),
        ("It cost 6 grand.", "cost: 6\n", ""),
        ("Rows: 6 squared.", "rows: 6\n", ""),  # operations in symbols and words claim their value
        ("Rows: 2^10.", "rows: 2\n10\n", ""),
        ("Rows: 6 times 10.", "rows: 6\n10\n", ""),
        ("It weighs 6 tonnes.", "weight: 6\n", ""),  # a unit no output states
        ("Revenue saw a 3 drop.", "revenue change: 3\n", ""),  # the direction named after it
        ("The total is `x = 999`.", "total: 6\n", "x = 999\nprint('total:', 6)"),
    ],
)
def test_false_number_expressions_are_refused(answer: str, stdout: str, code: str) -> None:
    assert not grounded(answer, stdout, code)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("There were over 1,000 rows.", "rows: 5000\n"),  # bounds
        ("There were fewer than 10 errors.", "errors: 0\n"),
        ("At least 1 row was dropped.", "dropped: 3\n"),
        ("Rows rose from 10 to 12, up 20%.", "before: 10\nafter: 12\n"),  # derived from two
        ("Rows went 10 -> 12, up 2.", "before: 10\nafter: 12\n"),  # an arrow is no bound
        ("The area is 10\u00b2.", "area: 100\n"),
        ("Rows fell by 3, from 9 to 6.", "before: 9\nafter: 6\n"),
        ("The share is two thirds.", "share: 0.6667\n"),  # a fraction the output rounded
        ("The share is 66.7%.", "share: 0.6667\n"),
        ("It took 1.5 seconds.", "elapsed: 1.5s\n"),  # the output's unit glued to its digits
        ("The total was 1.2 million.", "total: 1234567\n"),  # the rounding a magnitude implies
        ("The file is 2 KB.", "size_bytes: 2048\n"),
        ("The answer is forty-two.", "42\n"),
        ("The rate is 1.2 \u00d7 10\u207b\u2075.", "rate: 1.2e-05\n"),
        ("Revenue was $5bn.", "revenue_usd: 5000000000\n"),  # the honest twins of the above
        ("The new version is 1.1x faster.", "speedup: 1.1\n"),
        ("There are a dozen rows.", "rows: 12\n"),
        ("Half of the rows are empty.", "empty_share: 0.5\n"),
        ("The net cost was (300).", "net cost: -300\n"),
        ("Rows: 1\u200b2", "rows: 12\n"),
    ],
)
def test_honest_number_expressions_pass(answer: str, stdout: str) -> None:
    assert grounded(answer, stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("Rows rose from 10 to 12, up 30%.", "before: 10\nafter: 12\n"),  # wrong change
        ("Rows fell from 10 to 12, down 20%.", "before: 10\nafter: 12\n"),  # wrong direction
        ("Rows fell by 3, from 6 to 9.", "before: 6\nafter: 9\n"),
        (
            "Rows rose from 10 to 12. Sales were up 20%.",
            "before: 10\nafter: 12\n",
        ),  # another sentence
        ("Sales were 10 and rows 12, up 20%.", "sales: 10\nrows: 12\n"),  # no change stated
        ("There were fewer than 10 errors.", "errors: 50\nwarnings: 3\n"),  # the errors line says
        ("There were over 1,000 rows.", "rows: 5000000\n"),  # a bound is a claim about size
        ("The share is two thirds.", "share: 0.6\n"),
        ("The share is a third.", "share: 0.3\n"),  # one printed digit is no third
        ("The area is 10\u00b2.", "area: 102\n"),  # a superscript is a power
        ("It took 1.5 seconds.", "elapsed: 1.5\n"),  # no output states the unit
    ],
)
def test_bounds_changes_and_fractions_stay_tied_to_the_evidence(answer: str, stdout: str) -> None:
    assert not grounded(answer, stdout)


# -- issue 37, third attack: read conservatively, never generously ------------------------------


@pytest.mark.parametrize(
    ("answer", "stdout", "code"),
    [
        ("There are 42 rows.", "4 2\n", ""),  # G1: print(4, 2) is two numbers
        ("There are 6,500 rows.", "6 500\n", ""),
        ("There are 6,500 rows.", "counts: [6,500]\n", ""),  # a JSON list
        ("The year was 20235.", "2023 5\n", ""),
        ("There are 1,00,000 rows.", "rows: 1\nerrors: 0\n", ""),  # G2: read whole or literally
        ("There are 1.000.000 rows.", "rows: 1\n", ""),
        ("There are 10^{3} rows.", "base: 10\nexp: 3\n", ""),
        ("There are 10<sup>3</sup> rows.", "base: 10\nexp: 3\n", ""),
        ("There are 6 x 1000 rows.", "rows: 6\nlimit: 1000\n", ""),
        ("There are 6\u00b71000 rows.", "rows: 6\nlimit: 1000\n", ""),
        ("The mask is 0xFF.", "flags: 0\n", ""),
        ("\u00be of the rows failed.", "failed: 1\nrows: 4\ncols: 3\n", ""),
        ("\u00bd of the rows failed.", "failed: 1 of 6\ncols: 2\n", ""),
        ("3/4 of the rows failed.", "failed: 1\nrows: 4\nwarnings: 3\n", ""),
        ("The value is 1/0.", "value: 1\nzero: 0\n", ""),
        ("The run took 1:30.", "duration: 30\nruns: 1\n", ""),
        ("There were 5-7 rows.", "a: 5\nb: 7\nrows: 100\n", ""),
        ("The answer is 6e.", "answer: 6\n", ""),
        ("There were 5\u2030 errors.", "errors: 5%\n", ""),
        ("Revenue was 6 Mio.", "revenue: 6\n", ""),  # G3: magnitudes it does not know
        ("Revenue was 6 mil.", "revenue: 6\n", ""),
        ("Revenue was 6 Mrd.", "revenue: 6\n", ""),
        ("Revenue was 6T.", "revenue: 6\n", ""),
        ("Revenue was 6 thou.", "revenue: 6\n", ""),
        ("Thousands of rows failed.", "failed: 3\n", ""),
        ("Hundreds of tests failed.", "failed: 3\n", ""),
        ("Dozens of errors.", "errors: 2\n", ""),
        ("Rows rose from 1 to 2, up 100%.", "before: 1.4\nafter: 1.6\n", ""),  # G4
        (
            "Rows rose from 1 million to 2 million, up 100%.",
            "before: 1400000\nafter: 1600000\n",
            "",
        ),
        ("There were no more than 6 errors.", "errors: 50\n", ""),  # G5: bounds and signs
        ("There were no fewer than 10 errors.", "errors: 2\n", ""),
        ("More than 100 of the tests failed.", "failed: 3\ntotal: 500\n", ""),
        ("Revenue was 3% lower.", "growth: 3%\n", ""),
        ("Sales are 3% down.", "growth: 3%\n", ""),
        ("It was 3% cheaper.", "price change: 3%\n", ""),
        ("Nearly 1000 rows.", "rows: 1049\n", ""),
        ("The clock runs at 5 GHz.", "freq: 5 MHz\n", ""),  # G6: units are the value's own
        ("It took 3 hours.", "elapsed: 3 seconds\ntimeout: 2 hours\n", ""),
        ("The file is 5 GB.", "size: 5 MB\n", ""),
        ("It weighs 5 kg.", "weight: 5 lb\nunit: kg\n", ""),
        ("There are 50 rows.", "missing: 50%\n", ""),
        ("Rates rose 50 basis points.", "rate change: 50%\n", ""),
        ("Share rose 5 percentage points.", "share growth: 5%\n", ""),
        ("There are\n```\n999 rows\n```", "rows: 6\n", 'doc = """\n999 rows\n"""\nprint(6)'),  # G7
        ("The total is\n```\n999\n```", "rows: 6\n", "999\nprint(6)"),
        ("No tests failed.", "failed: 3\n", ""),  # G8: counts in words
        ("A single test failed.", "failed: 3\n", ""),
        ("Twice as fast.", "speedup: 1.1\n", ""),
        ("There are not 6 rows.", "rows: 6\n", ""),
        ("The loss is NaN.", "loss: 0.3\n", ""),
    ],
)
def test_false_answers_read_generously_are_refused(answer: str, stdout: str, code: str) -> None:
    assert not grounded(answer, stdout, code)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("There are 6,500 rows.", "rows: 6,500\n"),  # thousands grouping as one token
        ("There are 6,500 rows.", "rows: 6500\n"),
        ("There are 1,000 rows.", '{"rows": 1000}\n'),
        ("The run took 1:30.", "duration: 1:30\n"),  # literal runs an output shows
        ("It took 1h30m.", "elapsed: 1h30m\n"),
        ("3/4 of the rows failed.", "failed: 3/4\n"),
        ("3/4 of the rows failed.", "share failed: 0.75\n"),
        ("Rows rose from 10 to 12, up 20%.", "before: 10\nafter: 12\n"),
        ("There were no more than 6 errors.", "errors: 5\n"),
        ("More than 100 of the tests failed.", "failed: 300\ntotal: 500\n"),
        ("Revenue was 3% lower.", "growth: -3%\n"),
        ("Nearly 1000 rows.", "rows: 987\n"),
        ("The file is 5 MB.", "size: 5 MB\n"),
        ("The file is 5 MB.", "size_mb: 5\n"),
        ("The clock runs at 5 GHz.", "freq: 5000 MHz\n"),
        ("It took 90 minutes.", "elapsed: 1.5 hours\n"),
        ("Share rose 5 percentage points, from 10% to 15%.", "before: 10%\nafter: 15%\n"),
        ("The total is\n```\ntotal = 999 - 993\n```", "total: 6\n"),
        ("No tests failed.", "failed: 0\npassed: 12\n"),
        ("A single test failed.", "failed: 1\n"),
        ("Twice as fast.", "speedup: 2.0\n"),
    ],
)
def test_honest_answers_read_exactly_pass(answer: str, stdout: str) -> None:
    assert grounded(answer, stdout, "total = 999 - 993\nprint('total:', total)")


def test_a_large_output_costs_a_lookup_per_claim_not_a_scan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compared = 0
    real = comparison.matches

    def counting(*args: Any, **kwargs: Any) -> bool:
        nonlocal compared
        compared += 1
        return real(*args, **kwargs)

    for module in (ground_numbers, ground_text):
        monkeypatch.setattr(module, "matches", counting)
    stdout = "".join(" ".join(str(i * 8 + j) for j in range(8)) + "\n" for i in range(4000))
    answer = " ".join(f"Value {i}.5 fell by {10**7 + i}." for i in range(50))
    assert not grounded(answer + " The last is 31999.", stdout)
    assert grounded("The last is 31999.", stdout)
    assert compared < 20_000  # a scan compares each of 102 claims with all 32,000 numbers


def test_numbers_past_the_cap_are_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evidence_module, "MAX_NUMBERS", 1000)
    stdout = "".join(f"{i}\n" for i in range(2000))
    evidence = evidence_module.Evidence.of([RunOutput(run_id="run1", stdout=stdout)], [])
    assert len(evidence.numbers) == 1000
    assert grounded("The count is 999.", stdout) and not grounded("The count is 1500.", stdout)


def test_literal_claims_on_a_large_output_do_not_scan_it(monkeypatch: pytest.MonkeyPatch) -> None:
    scanned = 0
    real = ground_text.contains

    def counting(text: str, wanted: str, *, in_list: bool = False) -> bool:
        nonlocal scanned
        scanned += 1
        return real(text, wanted, in_list=in_list)

    for module in (ground_numbers, ground_text):
        monkeypatch.setattr(module, "contains", counting)
    stdout = "".join(" ".join(str(i * 8 + j) for j in range(8)) + "\n" for i in range(4000))
    answer = " ".join(f"Value {i}T here." for i in range(50))
    assert not grounded(answer, stdout)
    assert grounded("It took 1:30.", stdout + "elapsed: 1:30\n")
    assert scanned <= 4001 + 50  # one line-by-line search (the one that finds 1:30), not 50


# -- issue 37, fourth attack: durations, rounding, units and times read exactly -----------------

_DESCRIBE = "            units\ncount  100.000000\nmean   101.230000\n25%     85.000000\n"
_COUNTS = "region\nNorth    31\nSouth    27\nName: count, dtype: int64\n"


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The duration is 1h30m.", "duration: 1h03m\n"),  # the minutes were dropped
        ("It took 1h30m.", "elapsed: 1.3 hours\n"),
        ("It took 1h30.", "elapsed: 1.3 hours\n"),
        ("It took 1 hour 30 minutes.", "elapsed_s: 5000\n"),
        ("It took 1:30:00.", "elapsed_s: 5000\n"),
        ("It took 1 hour.", "elapsed: 1h45m\n"),  # a piece of a compound duration
        ("The mean is 3.1.", "mean: 3.19\n"),  # truncated, not rounded to the nearest
        ("The p-value is 0.04, significant.", "p: 0.0499\n"),
        ("The 25th percentile is 85%.", _DESCRIBE),  # the line's % is not the number's
        ("About 85% of units.", _DESCRIBE),
        ("It took 3 weeks.", "days: 3\n"),
        ("It took 3 µs.", "elapsed: 3 ns\n"),
        ("It took 3 us.", "elapsed: 3 ms\n"),
        ("It lasted 2 years.", "elapsed: 2 months\n"),
        ("It uses 5 GB of memory.", "memory: 5 Gb\n"),
        ("The link does 5 MB/s.", "speed: 5 Mb/s\n"),
        ("The file is 5 kb.", "size: 5 kB\n"),
        ("The file is 5 MiB.", "size: 5 MB\n"),
        ("The file is 5 KB.", "size: 5 KiB\n"),
        ("It started at 9 pm.", "start: 9\n"),
        ("It finished at 1:30 pm.", "finish: 01:30\n"),
        ("It finished at 9 am.", "finish: 21:00\n"),
        ("Net income was weak (300).", "net_income: 300\n"),  # accounting: -300
        ("The run took 50 us.", "elapsed: 50 ms\n"),
    ],
)
def test_false_answers_read_exactly_are_refused(answer: str, stdout: str) -> None:
    assert not grounded(answer, stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("It took 1.5 hours.", "elapsed_s: 5400\n"),
        ("It took 90 minutes.", "elapsed: 1h30m\n"),
        ("It took 1h30m.", "elapsed_s: 5400\n"),
        ("It took 1 hour 30 minutes.", "elapsed: 1:30:00\n"),
        ("It took 1:30:00.", "elapsed_s: 5400\n"),
        ("It took 2m30s.", "elapsed_s: 150\n"),
        ("It took 1h30.", "elapsed_s: 5400\n"),
        ("The mean is 3.2.", "mean: 3.19\n"),
        ("Pi is 3.1415, truncated.", "pi: 3.14159\n"),
        ("The 25th percentile is 85.", _DESCRIBE),
        ("Missing: 12%.", "missing: 12%\n"),
        ("It took 3 weeks.", "days: 21\n"),
        ("It took 3 µs.", "elapsed: 3000 ns\n"),
        ("It took 2 years.", "elapsed: 24 months\n"),
        ("It uses 5 GB of memory.", "memory: 5 GB\n"),
        ("The link does 40 Mbps.", "speed: 40 Mb/s\n"),
        ("The file is 5 MiB.", "size_bytes: 5242880\n"),
        ("The file is 5 KiB.", "size: 5 KiB\n"),
        ("It finished at 1:30 pm.", "finish: 13:30\n"),
        ("It started at 9 pm.", "start: 21:00\n"),
        ("North has the most rows (31).", _COUNTS),
        ("There are 5 NaN values.", "nulls: 5\n"),
        ("There are 50 US states.", "states: 50\n"),
        ("There are 5 missing (NaN) values.", "nulls: 5\n"),
    ],
)
def test_honest_answers_read_exactly_pass_too(answer: str, stdout: str) -> None:
    assert grounded(answer, stdout)


def test_a_unit_claim_on_a_large_output_looks_up_its_unit_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compared = 0
    real = ground_numbers.fits

    def counting(num: Any, fact: Any, *, loose: bool = False) -> bool:
        nonlocal compared
        compared += 1
        return real(num, fact, loose=loose)

    for module in (ground, ground_numbers):
        monkeypatch.setattr(module, "fits", counting)
    stdout = "".join(f"size: {i % 997} MB widget{i}\n" for i in range(20_000))
    answer = " ".join(f"{i} GB." for i in range(2, 102))  # "1 GB" is 500 to 1500 MB
    assert not grounded(answer, stdout)
    assert compared < 5_000  # one window spanning all unit ratios: 100 x 5,000 (the cap)
    assert grounded("It is 996 MB.", stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("It took 1.5 s.", "elapsed: 1.5 ms\n"),  # a spaced "s" is the answer's unit
        ("It took 2 s.", "elapsed: 2 h\n"),
        ("It took 90 s.", "elapsed: 90 ms\n"),
        ("The result is -0.", "result: 0.4\n"),  # a minus zero is a negative value
        ("The result is -0.0.", "result: 0.0\n"),
        ("The change was -0%.", "change: 0.3%\n"),
        ("The first order was on 5 March 2023.", "first: 03/05/2023\n"),  # or 3 May
        ("The first order was on March 5, 2023.", "first: 03/05/2023\n"),
        ("The first order was on 2023-03-05.", "first: 05/03/2023\n"),
        ("The first order was in March 2023.", "first: 03/05/2023\n"),
        ("The answer is $\\frac{1}{3}$.", "answer: 0.5\n"),  # a LaTeX fraction's value
        ("The answer is $\\dfrac{3}{4}$.", "answer: 0.7\n"),
        ("The result is 1,23.", "[1,23]\n"),  # a list's items, not one number
        ("The result is 1,00,000.", "[7,1,00,000]\n"),
        ("The date is 04/03/2023.", "date: 2023-03-04\n"),  # may be read as 3 April
        ("The date was 12/11/2023.", "date: 11/12/2023\n"),
        ("It took 3/4 hours.", "elapsed: 0.75 s\n"),  # a fraction's unit is its own
        ("The answer is 1/2 dollars.", "answer: 0.5 EUR\n"),
        ("It costs $3/4.", "price: 0.75 EUR\n"),
        ("The answer is $\\frac{1}{2}$ dollars.", "answer: 0.5 EUR\n"),
    ],
)
def test_false_answers_of_the_sixth_attack_are_refused(answer: str, stdout: str) -> None:
    assert not grounded(answer, stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("It took 1 hour 30 minutes.", "elapsed: 5400 s\n"),
        ("It took 90 minutes.", "elapsed: 5400 s\n"),
        ("It took 1,500 ms.", "elapsed: 1.5 s\n"),
        ("It took 1.5 s.", "elapsed: 1.5 s\n"),
        ("It took 2 h.", "elapsed: 120 min\n"),
        ("The minimum is -0.", "min: -0.0\n"),
        ("The minimum is -0.0.", "min: -0.04\n"),
        ("The minimum is 0.", "min: -0.0\n"),
        ("The first order was on 03/05/2023.", "first: 03/05/2023\n"),
        ("The first order was on 15 March 2023.", "first: 15/03/2023\n"),  # one reading
        ("The first order was on 5 March 2023.", "first: 2023-03-05\n"),
        ("The first order was in March 2023.", "first: 2023-03-05\n"),
        ("The answer is $\\frac{1}{2}$.", "answer: 0.5\n"),
        ("The answer is \\tfrac{3}{4}.", "answer: 0.75\n"),
        ("The population is 1,00,000.", "population: 1,00,000\n"),
        ("The answer is [1,5].", "[1,5]\n"),
        ("The date was 11.12.2023.", "date: 11/12/2023\n"),
        ("It took 3/4 hours.", "elapsed: 45 min\n"),
        ("It costs $3/4.", "price: $0.75\n"),
        ("It is 3/4 of the rows.", "share: 0.75\n"),
        ("It took 3/4 hours.", "3/4 hours\n"),
    ],
)
def test_honest_answers_of_the_sixth_attack_pass(answer: str, stdout: str) -> None:
    assert grounded(answer, stdout)


# -- issue 37: which line, key or column a value belongs to ---------------------------------------

_REGIONS = "region units\nNorth 120\nSouth 97\nEast 143\n"
_COUNTS = "region\nNorth    31\nSouth    27\nEast     22\nWest     20\nName: count, dtype: int64\n"
_FRAME = (
    "      region  units   revenue\n0      North    120  1.234e+06\n1      South     95  9.870e+05\n"
    "2       East    143  2.100e+06\n\n[3 rows x 3 columns]\n"
)
_DESCRIBE = (
    "            units\ncount  100.000000\nmean   101.230000\nstd     22.410000\n"
    "min     40.000000\n50%    100.500000\nmax    160.000000\n"
)
_MARKDOWN = "| region | units |\n|---|---|\n| East | 143 |\n| South | 97 |\n"
_CSV = "region,units,price\nEast,143,2.5\nSouth,97,3.5\n"


@pytest.mark.parametrize(
    ("answer", "stdout", "result"),
    [
        ("South sold 143 units.", _REGIONS, None),  # East's line
        ("South sold 143.", _MARKDOWN, None),
        ("South sold 143.", _CSV, None),
        ("South costs 2.5.", _CSV, None),
        ("The median is 4.2.", '{"mean": 4.2, "median": 3.9}\n', None),
        ("The median is 4.2.", "", {"mean": 4.2, "median": 3.9}),  # the result's keys
        ("North has 27 rows.", _COUNTS, None),  # value_counts labels swapped
        ("- North: 27\n- South: 31", _COUNTS, None),
        ("| metric | value |\n|---|---|\n| mean | 4 |\n| max | 3 |", "mean: 3\nmax: 4\n", None),
        ("min 3, max 9", "min 9 max 3\n", None),
        ("There are 12 users and 7 admins.", '{"users": 7, "admins": 12}\n', None),
        ("South has 143 units.", _FRAME, None),  # a DataFrame's row
        ("North's revenue is 143.", _FRAME, None),  # another column's value
        ("The mean is 100.5.", _DESCRIBE, None),  # the 50% row's
        ("The median is 101.23 units.", _DESCRIBE, None),  # the mean's, "median" is "50%"
        ("The average is 100.5.", _DESCRIBE, None),
        ("The ci is (0.2, 0.9) and alpha is 0.2.", "ci: (0.2, 0.9)\nalpha: 0.05\n", None),
    ],
)
def test_a_value_from_another_label_is_refused(answer: str, stdout: str, result: Any) -> None:
    found = claims(answer, stdout=stdout, result=result)
    refused = [c for c in found if not c.grounded and c.kind == "number"]
    assert refused and "the outputs show" in (refused[0].detail or "")


@pytest.mark.parametrize(
    ("answer", "stdout", "result"),
    [
        ("East had 143 sales.", _REGIONS, None),
        ("143 for East, 97 for South.", _REGIONS, None),
        ("East sold 143 units.", _REGIONS, None),
        ("The median (3.9) is below the mean (4.2).", '{"mean": 4.2, "median": 3.9}\n', None),
        ("The median is 3.9.", "", {"mean": 4.2, "median": 3.9}),
        ("North has the most rows (31), followed by South (27).", _COUNTS, None),
        ("North and South had 31 and 27 rows.", _COUNTS, None),  # a list: no tie read
        ("| region | count |\n|---|---|\n| North | 31 |\n| South | 27 |", _COUNTS, None),
        ("min 9, max 3", "min 9 max 3\n", None),
        ("There are 7 users and 12 admins.", '{"users": 7, "admins": 12}\n', None),
        ("South has 95 units; its revenue is 987,000.", _FRAME, None),  # a row, read both ways
        ("The units column holds 143 for East.", _FRAME, None),
        ("The mean is 101.23 units, the max 160.", _DESCRIBE, None),
        ("Units range from 40 to 160.", _DESCRIBE, None),
        ("The median is 100.5 and the standard deviation 22.41.", _DESCRIBE, None),
        ("The average is 101.23, the maximum 160.", _DESCRIBE, None),
        ("South sold 97.", _MARKDOWN, None),
        ("South sold 97 at 3.5.", _CSV, None),
        ("The mean is 4.2 ± 0.3.", "mean: 4.2\nstd: 0.3\n", None),
        ("It took 3 s for 500 rows.", "Processed 500 rows in 3 s\n", None),  # prose: no labels
        ("The average over 3 runs is 5.2.", "Average over 3 runs: 5.2\n", None),
        ("5 files had 12 errors.", "files: 5\nerrors: 12\n", None),  # files is 5's
        ("The 1000 rows span 5 columns.", "rows: 1000\ncolumns: 5\n", None),
        ("Sales in 2023 were 500.", "year: 2023\nsales: 500\n", None),  # "in" parts them
        ("Revenue for East was 2.1 million.", _FRAME, None),
        ("The answer is 42 for n = 7.", "n = 7\nanswer = 42\n", None),  # n is 7's
    ],
)
def test_a_value_on_its_own_label_still_grounds(answer: str, stdout: str, result: Any) -> None:
    assert bad(answer, stdout=stdout, result=result) == []


def test_a_label_with_too_many_cells_is_not_checked() -> None:
    """The cost stays bounded: past `MAX_CELLS` a label is left to the value check alone."""
    rows = "".join(f"count {i}\n" for i in range(labels.MAX_CELLS + 1))
    assert bad("The count is 70000.", stdout=rows + "other 70000\n") == []
    assert bad("The count is 70000.", stdout="count 5\nother 70000\n") == ["70000"]


def test_an_output_with_too_many_labelled_lines_checks_no_label() -> None:
    """Reading stops past `MAX_LINES` lines that name the answer's words: what is unread
    could hold the label's value, so no label is checked (the value check still is)."""
    many = "".join(f"mean of x{i}: 5\n" for i in range(labels.MAX_LINES)) + "mean 70000\n"
    few = "".join(f"mean of x{i}: 5\n" for i in range(10)) + "mean 70000\n"
    assert bad("The mean is 5.", stdout=many) == []
    assert bad("The mean is 5.", stdout=few) == ["5"]
    assert bad("The mean is 6.", stdout=many) == ["6"]


def _lines_run(work: Any) -> int:
    """How many lines of the agent package `work()` runs: its work, free of machine speed."""
    import sys
    from pathlib import Path
    from types import FrameType

    package = str(Path(ground.__file__).parent)
    count = 0

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        if not frame.f_code.co_filename.startswith(package):
            return None
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        work()
    finally:
        sys.settrace(None)
    return count


@pytest.mark.parametrize(
    ("line", "answer"),
    [
        ("count: 5, dates: [{}]", "The count is 5."),
        ("East {} 5", "East sold 5."),
    ],
)
@pytest.mark.parametrize(
    "date", ["Timestamp('2023-03-04 00:00:00')", "2023-03-04", "04/03/2023", "March 4, 2023"]
)
def test_many_dates_on_one_line_cost_work_linear_in_their_number(
    line: str, answer: str, date: str
) -> None:
    def work(n: int) -> int:
        stdout = line.format(", ".join([date] * n)) + "\n"
        return _lines_run(lambda: bad(answer, stdout=stdout))

    small, large = work(300), work(1200)
    assert large < 6 * small  # four times the dates: linear is about 4x, quadratic 16x


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("North sold the most, with 143 units.", "East    143\nWest     98\nNorth   210\n"),
        ("The top region is East, which sold 98.", "East: 143\nWest: 98\n"),
        ("East, with 98 units, led.", "East: 143\nWest: 98\n"),
        ("East, at 210 units, sold the most.", "East: 143\nWest: 98\nNorth: 210\n"),
        ("East sold the most, 98 units.", "East: 143\nWest: 98\n"),
        ("East led the regions. It had 98.", "East: 143\nWest: 98\n"),
    ],
)
def test_a_label_carried_across_a_comma_or_to_a_pronoun_is_checked(
    answer: str, stdout: str
) -> None:
    assert bad(answer, stdout=stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("North sold the most, with 210 units.", "East    143\nWest     98\nNorth   210\n"),
        ("The top region is East, which sold 143.", "East: 143\nWest: 98\n"),
        ("East led the regions. It had 143.", "East: 143\nWest: 98\n"),
        ("There are 12 users, 3 of them admins.", "users: 12\nadmins: 3\n"),
        ("Of the 12 users, 3 are admins.", "users: 12\nadmins: 3\n"),
        ("East sold 143. It had 12 returns.", "East: 143\nWest: 98\nreturns: 12\n"),
        ("East beat West, with 98 for West.", "East: 143\nWest: 98\n"),
    ],
)
def test_a_carried_label_does_not_refuse_honest_answers(answer: str, stdout: str) -> None:
    assert bad(answer, stdout=stdout) == []


@pytest.mark.parametrize(
    "stdout",
    [
        "[('East', 143), ('West', 98)]\n",
        "('East', 143)\n('West', 98)\n",
        "[('East', 143), ('West', 98), ('North', 12)]\n",  # Counter.most_common()
        '[{"name": "East", "units": 143}, {"name": "West", "units": 98}]\n',
        '[\n  {"name": "East", "units": 143},\n  {"name": "West", "units": 98}\n]\n',
        "{'East': {'units': 143}, 'West': {'units': 98}}\n",
        '{"regions": [{"name": "East", "units": 143}, {"name": "West", "units": 98}]}\n',
    ],
)
def test_printed_tuples_records_and_nested_dicts_label_their_numbers(stdout: str) -> None:
    assert bad("East sold 98 units.", stdout=stdout)
    assert bad("East sold 143 units.", stdout=stdout) == []


@pytest.mark.parametrize(
    "stdout",
    [
        "[('East', '143'), ('West', 98)]\n",  # a number in a string: the shape is unclear
        "[" + "[" * 300 + "]" * 300 + ", ('East', 143)]\n",
        "(" + "('East', 1), " * 5000 + ")\n",  # over the size read
    ],
)
def test_unclear_or_huge_printed_values_give_no_labels(stdout: str) -> None:
    assert bad("East sold 99 units.", stdout=stdout + "total: 99\n") == []


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("East sold 98 units.", "East      143 units\nWest       98 units\n"),
        ("East sold 98 units.", "East - 143 units\nWest - 98 units\n"),
        ("East sold 98 units.", "East sold 143 units\nWest sold 98 units\n"),
        ("East sold 98 units.", "East: 143 units (12%)\nWest: 98 units (31%)\n"),
        ("East had a 31% share.", "East: 143 units (12%)\nWest: 98 units (31%)\n"),
    ],
)
def test_a_label_before_a_counted_number_holds_it_and_its_share(answer: str, stdout: str) -> None:
    assert bad(answer, stdout=stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("East has a 39.2% share with 143 units.", "East: 143 units (39.2%)\n"),
        ("East sold 143 units, a 12% share.", "East: 143 units (12%)\nWest: 98 units (31%)\n"),
        ("West sold 98 units.", "East      143 units\nWest       98 units\n"),
        ("It read 500 rows in 3 s.", "Processed 500 rows in 3 s\n"),
    ],
)
def test_counted_lines_still_ground_honest_answers(answer: str, stdout: str) -> None:
    assert bad(answer, stdout=stdout) == []


def test_masking_an_answer_costs_work_linear_in_its_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each kind of claim is masked in one pass: the characters the masking copies grow with
    the answer, not with the answer times its claims."""
    copied = 0
    real = values.blank

    def counting(text: str, spans: Any) -> str:
        nonlocal copied
        copied += len(text)
        return str(real(text, spans))

    for module in (ground, quantities):
        monkeypatch.setattr(module, "blank", counting, raising=False)

    def work(n: int) -> int:
        nonlocal copied
        copied = 0
        answer = " ".join(
            f'Row "r{i}" on 2023-01-{i % 28 + 1:02d} is {i}, 1/{i + 2}, twice as big as one.'
            for i in range(n)
        )
        assert claims(answer, stdout="total: 5\n")
        return copied

    small, large = work(100), work(400)
    assert 0 < large < 6 * small  # four times the claims: linear is about 4x, quadratic 16x


_SUMMARY = (
    "           units      price\n"
    "count   7.000000   7.000000\n"
    "mean   14.142857   7.250000\n"
    "std     8.933618   4.677072\n"
    "min     5.000000   3.500000\n"
    "25%     8.000000   3.500000\n"
    "50%    12.000000   3.500000\n"
    "75%    18.000000  12.250000\n"
    "max    30.000000  12.250000\n"
)
_CROSSTAB = "product  A  B\nregion       \nEast     2  1\nNorth    1  1\nWest     1  1\n"


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("There are 8 rows.", _SUMMARY),  # 8 is the 25% quartile, the count is 7
        ("There are 8 values.", _SUMMARY),
        ("The data has 8 non-null values.", _SUMMARY),
        ("East bought product B twice.", _CROSSTAB),  # East bought B once
        ("North bought product A thrice.", _CROSSTAB),
    ],
)
def test_a_count_is_read_from_the_count_not_any_equal_cell(answer: str, stdout: str) -> None:
    assert bad(answer, stdout=stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("There are 7 rows.", _SUMMARY),
        ("There are 7 values.", _SUMMARY),
        ("East bought product A twice.", _CROSSTAB),
        ("There are 1,000 rows.", "1000\n"),
        ("North has 31 rows.", "region\nNorth    31\nSouth    27\nName: count, dtype: int64\n"),
        ("Sales were twice as high.", "ratio: 2.0\n"),
    ],
)
def test_an_honest_count_still_grounds(answer: str, stdout: str) -> None:
    assert bad(answer, stdout=stdout) == []


_HEAD = (
    "        date region product  units  price  revenue\n"
    "0 2023-01-02   East       A     12   3.50    42.00\n"
    "1 2023-01-03   West       B      7  12.25    85.75\n"
    "2 2023-02-06   East       A     30   3.50   105.00\n"
)


@pytest.mark.parametrize(
    "answer",
    [
        "The second order sold 30 units.",  # the second row sold 7; 30 is the third's
        "The first row has a price of 12.25.",
        "The last order brought in 85.75.",
        "The fifth order sold 7 units.",  # no fifth row is printed
    ],
)
def test_a_number_of_a_row_by_position_must_be_on_that_row(answer: str) -> None:
    assert bad(answer, stdout=_HEAD)


@pytest.mark.parametrize(
    "answer",
    [
        "The second order sold 7 units.",
        "The first row is East with 12 units at 3.50.",
        "The last order brought in 105.00, the 3rd row.",
        "The second East order sold 30 units.",  # the second of East's, not row 2
    ],
)
def test_a_number_on_the_row_it_names_grounds(answer: str) -> None:
    assert bad(answer, stdout=_HEAD) == []


_MONTHLY = (
    "date\n2023-01    19\n2023-02    35\n2023-03    31\n2023-04    14\nFreq: M, Name: units\n"
)
_DAILY = "date\n2023-01-31    19\n2023-02-28    35\n2023-03-31    31\n"


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("Units peaked in 2023-03.", _MONTHLY),  # the series peaks at 2023-02 (35)
        ("The weakest month was 2023-01.", _MONTHLY),  # it bottoms out at 2023-04
        ("Sales were highest on 2023-03-31.", _DAILY),
        ("The best day was 2023-03-31 00:00.", _DAILY.replace("    ", " 00:00:00    ")),
    ],
)
def test_a_date_at_a_series_extreme_must_be_where_it_peaks(answer: str, stdout: str) -> None:
    assert bad(answer, stdout=stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("Units peaked in 2023-02.", _MONTHLY),
        ("Units peaked in 2023-02 with 35, and were lowest in 2023-04.", _MONTHLY),
        ("In 2023-03 units were 31.", _MONTHLY),
        ("Sales were highest on 2023-02-28.", _DAILY),
        ("The peak was on 2023-03-04.", "peak: 2023-03-04\nlow: 2023-03-01\n"),
    ],
)
def test_a_date_where_the_series_peaks_grounds(answer: str, stdout: str) -> None:
    assert bad(answer, stdout=stdout) == []


_GAPS = "mean gap: 15 days 04:00:00\nmax gap: 34 days 00:00:00\n"


@pytest.mark.parametrize(
    "answer",
    ["The longest gap was 15 days.", "The max gap was 15 days.", "The mean gap is 34 days."],
)
def test_a_printed_timedelta_is_read_under_its_key(answer: str) -> None:
    assert bad(answer, stdout=_GAPS)


@pytest.mark.parametrize(
    "answer",
    [
        "The longest gap was 34 days.",
        "The mean gap is about 15 days.",
        "The mean gap is 15 days 04:00:00.",
        "The mean gap is 15 days, the longest 34 days.",
    ],
)
def test_a_timedelta_stated_as_printed_grounds(answer: str) -> None:
    assert bad(answer, stdout=_GAPS) == []


def test_a_timedelta_is_one_value() -> None:
    assert [s for s, _, _ in values.durations_in("gap: 15 days 04:00:00")] == [
        15 * 86400 + 4 * 3600
    ]


_YEARLY = "2022: 1,204\n2023: 1,530\nchange: +27.1%\n"
_REGIONS = "East Region: 143\nWest Region: 98\n"


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("2022 had 1,530 units.", _YEARLY),  # 1,530 is 2023's
        ("2023 sold 1,204 units.", _YEARLY),
        ("Region East sold 98.", _REGIONS),  # the label in the other order is still East's
    ],
)
def test_a_year_or_turned_label_holds_its_own_number(answer: str, stdout: str) -> None:
    assert bad(answer, stdout=stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("2022 had 1,204 units.", _YEARLY),
        ("2023 sold 1,530 units.", _YEARLY),
        ("Region East sold 143.", _REGIONS),
        ("East Region sold 143 and Region West 98.", _REGIONS),
        ("2022 had 1,204 units.", "units in 2022 were 1,204\n"),  # no line keyed by it
    ],
)
def test_a_year_or_turned_label_on_its_number_grounds(answer: str, stdout: str) -> None:
    assert bad(answer, stdout=stdout) == []


_STAMPED = "peak: 2023-03-04 13:00:00+00:00\n"


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The peak was at 13:00 EST.", _STAMPED),  # printed in UTC: 13:00 EST is 18:00 UTC
        ("The peak was at 1 pm PST.", "peak: 2023-03-04 13:00:00\n"),  # no zone stated
        ("The peak was at 13:00 UTC.", "peak: 2023-03-04 13:00:00-05:00\n"),
        ("The peak was at 13:00 (CET).", _STAMPED),
        ("The peak was at 23:30 (UTC+5).", "peak: 2023-03-04 23:30:00-05:00\n"),
    ],
)
def test_a_time_zone_no_output_states_is_refused(answer: str, stdout: str) -> None:
    assert bad(answer, stdout=stdout)


@pytest.mark.parametrize(
    ("answer", "stdout"),
    [
        ("The peak was at 13:00 UTC.", _STAMPED),
        ("The peak was at 13:00 EST.", "peak: 2023-03-04 13:00:00 EST\n"),
        ("The job ran at 13:00 GMT.", "ran: 2023-03-04 13:00:00Z\n"),
        ("The peak was at 13:00.", _STAMPED),
        ("The peak was at 23:30 (UTC-5).", "peak: 2023-03-04 23:30:00-05:00\n"),
    ],
)
def test_a_time_in_a_zone_an_output_states_grounds(answer: str, stdout: str) -> None:
    assert bad(answer, stdout=stdout) == []


_EUROS = "East: 257,250.00 \u20ac\nNorth: 110,250.00 \u20ac\nWest: 162,750.00 \u20ac\n"


@pytest.mark.parametrize(
    "answer",
    ["East earned \u20ac257,250.", "West brought in about \u20ac163k.", "East: 257,250 \u20ac."],
)
def test_a_currency_printed_after_the_number_grounds_its_unit(answer: str) -> None:
    assert bad(answer, stdout=_EUROS) == []


@pytest.mark.parametrize("answer", ["East earned $257,250.", "East earned 257,250 $."])
def test_another_currency_than_the_one_printed_after_is_refused(answer: str) -> None:
    assert bad(answer, stdout=_EUROS)


_SHARES = "East: 48.5%\nNorth: 20.8%\nWest: 30.7%\n"


@pytest.mark.parametrize(
    "answer",
    ["About a third of revenue came from West.", "Nearly half of revenue came from East."],
)
def test_a_rough_fraction_in_words_grounds_a_near_share(answer: str) -> None:
    assert bad(answer, stdout=_SHARES) == []


@pytest.mark.parametrize(
    "answer",
    [
        "About a third of revenue came from North.",  # 20.8%
        "About a quarter came from North.",  # 20.8% is 17% short of a quarter
        "Nearly half of revenue came from West.",
    ],
)
def test_a_rough_fraction_in_words_is_not_any_share(answer: str) -> None:
    assert bad(answer, stdout=_SHARES)


@pytest.mark.parametrize(
    ("answer", "stdout", "refused"),
    [
        ("East has 1 B sale.", _CROSSTAB, False),  # "B" is the column, not a billion
        ("North has 1 A sale.", _CROSSTAB, False),
        ("East has 2 B sales.", _CROSSTAB, True),
        ("Revenue was 1 B.", "revenue: 1000000000\n", False),  # no column B: a billion
        ("Revenue was 2 B.", "revenue: 1000000000\n", True),
    ],
)
def test_a_letter_after_a_number_is_a_shown_column_before_a_magnitude(
    answer: str, stdout: str, refused: bool
) -> None:
    assert bool(bad(answer, stdout=stdout)) is refused


@pytest.mark.parametrize(
    ("answer", "stdout", "refused"),
    [
        ("Values range from 1 to 10.", "min: 1\nmax: 9\nn: 10\n", True),  # 10 is the count
        ("Ages are between 18 and 65.", "min: 18\nmax: 70\n65\n", True),
        ("The range is 1\u20139.", "min: 1\nmax: 10\n9\n", True),
        ("Values range from 1 to 9.", "min: 1\nmax: 9\nn: 10\n", False),
        ("Units range from 5 to 30.", _SUMMARY, False),
        ("Ages are between 18 and 70.", "min: 18\nmax: 70\n65\n", False),
        ("The interquartile range runs from 8 to 18.", _SUMMARY, False),
    ],
)
def test_a_range_is_a_shown_min_and_max(answer: str, stdout: str, refused: bool) -> None:
    assert bool(bad(answer, stdout=stdout)) is refused


@pytest.mark.parametrize(
    ("answer", "stdout", "refused"),
    [
        ("The value doubled to 10.", "before: 4\nafter: 10\n", True),  # 2.5 times, not 2
        ("Costs halved to 50.", "before: 70\nafter: 50\n", True),
        ("The value doubled to 10.", "before: 5\nafter: 10\n", False),
        ("Costs halved to 50.", "before: 100\nafter: 50\n", False),
        ("Rows doubled from 6 to 12.", "before: 6\nafter: 12\n", False),
    ],
)
def test_doubled_to_needs_the_value_it_doubled_from(
    answer: str, stdout: str, refused: bool
) -> None:
    assert bool(bad(answer, stdout=stdout)) is refused
