"""Unreliable models, over both model paths: the in-process scripted model and a scripted
OpenAI-compatible server on loopback. Every run goes through the real sandbox. Each case must
end in a corrected answer or a clean failure, never in a false `answered`."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import CliRunner

import execbox
from execbox.agent import Answer, AskSettings, ScriptedModel, ask
from execbox.cli import main
from tests.agent.agent_scripts import answer_from_result, approve, plan, program
from tests.agent.chat_server import Reply, serve

SALES = b"region,units\nnorth,5\nsouth,3\nnorth,2\neast,7\n"
READ_SALES = (
    "import json, pandas as pd\ndf = pd.read_csv('sales.csv')\n"
    "print('total units', int(df.units.sum()))\n"
    "print(json.dumps({'total': int(df.units.sum())}))\n"
)
HARD_CODED = "import json\nprint('total units', 17)\nprint(json.dumps({'total': 17}))\n"
SUM_CODE = (
    "import json\nvalues = [3, 1, 2]\nprint('sum', sum(values))\nprint(json.dumps(sum(values)))\n"
)

Script = dict[str, list[Any]]


class Asked:
    """One ask's outcome and the model calls it made, in order, with their prompts."""

    def __init__(self, answer: Answer, calls: list[tuple[str, str]]) -> None:
        self.answer = answer
        self.calls = calls

    @property
    def stages(self) -> list[str]:
        return [stage for stage, _ in self.calls]

    def prompts(self, stage: str) -> list[str]:
        return [prompt for s, prompt in self.calls if s == stage]


AskFn = Callable[..., Asked]


@pytest.fixture(params=["scripted", "wire"])
def asker(
    request: pytest.FixtureRequest, executor: execbox.Executor, no_model_env: None
) -> Iterator[AskFn]:
    """Runs an ask with the script given per stage, over the model path of the parameter."""

    def run(question: str, script: Script, **kwargs: Any) -> Asked:
        if request.param == "scripted":
            model = ScriptedModel(script)
            answer = ask(question, executor=executor, model=model.model, **kwargs)
            return Asked(answer, list(model.prompts))
        with serve({f"submit_{stage}": replies for stage, replies in script.items()}) as (
            chat,
            url,
        ):
            answer = ask(question, executor=executor, model="served-model", base_url=url, **kwargs)
        calls = []
        for _, body in chat.requests:
            stage = body["tools"][0]["function"]["name"].removeprefix("submit_")
            prompt = next(
                m["content"]
                for m in reversed(body["messages"])
                if m["role"] == "user" and isinstance(m["content"], str)
            )
            calls.append((stage, prompt))
        return Asked(answer, calls)

    yield run


def says(text: str) -> dict[str, str]:
    return {"text": text}


def test_an_answer_contradicting_the_output_is_corrected(asker: AskFn) -> None:
    """Reproduction 1: the program printed 6, the answer said 7 'verified by running'."""
    asked = asker(
        "What is 3 + 1 + 2?",
        {
            "plan": [plan("the sum")],
            "generate": [program(SUM_CODE)],
            "verify": [approve],
            "answer": [
                says("The result is 7, verified by running the code."),
                says("The result is 6."),
            ],
        },
    )
    answer = asked.answer
    assert answer.status == "answered", answer.failure
    assert answer.answer == "The result is 6."
    redraft = asked.prompts("answer")[1]
    assert "The result is 7, verified by running the code." in redraft
    assert "number '7': no output shows this value (the nearest is stdout line 1: sum 6)" in redraft
    assert "verification 'verified'" in redraft
    claim, stated = answer.claims
    assert (claim.text, claim.grounded, claim.run_id) == ("6", True, answer.outputs[0].run_id)
    assert (stated.kind, stated.grounded) == ("result", True)
    assert claim.source == "stdout line 1: sum 6"
    assert {v.check: v.passed for v in answer.verdicts}["grounding"] is True
    # The reviewer saw only the grounded draft: one review call.
    assert asked.stages == ["plan", "generate", "answer", "answer", "verify"]


def test_an_answer_that_keeps_contradicting_the_output_fails_with_the_result(asker: AskFn) -> None:
    asked = asker(
        "What is 3 + 1 + 2?",
        {
            "plan": [plan("the sum")],
            "generate": [program(SUM_CODE)],
            "verify": [approve],
            "answer": [says("The result is 7, verified by running the code.")] * 3,
        },
    )
    answer = asked.answer
    assert answer.status == "failed" and answer.answer == ""
    assert answer.failure is not None and answer.failure.kind == "ungrounded"
    run_id = answer.outputs[0].run_id
    assert (
        f"The program's result, not an answer (run {run_id}; checks passed: status, result): 6"
    ) in answer.failure.message
    assert answer.outputs[0].result == 6
    assert [v.check for v in answer.verdicts if not v.passed] == ["grounding"]
    assert asked.stages == ["plan", "generate", "answer", "answer", "answer"]


@pytest.mark.parametrize(
    "lie",
    [
        "The code printed 6, but the correct sum is seven.",
        "The result is 6 + 1.",
        "The sum is 6, about 10.",
        "The sum is more than 6.",
        "The result is 6, confirmed.",
        "The result is 6, all assertions passed.",
    ],
)
def test_a_false_claim_in_other_words_is_not_answered(asker: AskFn, lie: str) -> None:
    """Issue 37: with an approving reviewer, only the grounding check stands in the way."""
    asked = asker(
        "What is 3 + 1 + 2?",
        {
            "plan": [plan("the sum")],
            "generate": [program(SUM_CODE)],
            "verify": [approve] * 3,
            "answer": [says(lie)] * 3,
        },
    )
    answer = asked.answer
    assert answer.status == "failed" and answer.failure is not None
    assert answer.failure.kind == "ungrounded"


def test_a_lazy_plan_on_a_data_question_is_sent_back_and_then_runs(asker: AskFn) -> None:
    """Reproduction 2, corrected: a made-up total with no run is not an answer."""
    asked = asker(
        "What is the total of the units column in sales.csv?",
        {
            "plan": [{"needs_code": False, "answer": "The total is 42."}, plan("the total")],
            "generate": [program(READ_SALES)],
            "verify": [approve],
            "answer": [answer_from_result],
        },
        files={"sales.csv": SALES},
    )
    answer = asked.answer
    assert answer.status == "answered", answer.failure
    assert answer.outputs[0].result == {"total": 17} and "17" in answer.answer
    assert answer.evidence == "runs"
    assert "input files are given (sales.csv)" in asked.prompts("plan")[1]


def test_a_plan_that_insists_on_no_code_for_a_data_question_fails(
    asker: AskFn, executor: execbox.Executor
) -> None:
    """Reproduction 2: needs_code false and a made-up number, twice."""
    before = executor.store.count()
    # A number no id or count in the answer could contain by chance.
    lazy = {"needs_code": False, "answer": "The total is 9173.5."}
    asked = asker(
        "What is the total of the units column in sales.csv?",
        {"plan": [lazy, lazy]},
        files={"sales.csv": SALES},
    )
    answer = asked.answer
    assert answer.status == "failed" and answer.answer == ""
    assert answer.failure is not None and answer.failure.kind == "no_evidence"
    assert "input files are given" in answer.failure.message
    assert answer.plan is not None and answer.plan.answer is None  # the made-up total is gone
    assert "9173.5" not in answer.model_dump_json()
    assert asked.stages == ["plan", "plan"] and executor.store.count() == before


def test_a_computed_value_needs_code_even_without_files(asker: AskFn) -> None:
    lazy = {"needs_code": False, "answer": "It is 392."}
    asked = asker("What is 17 * 23?", {"plan": [lazy, lazy]})
    assert asked.answer.status == "failed"
    assert asked.answer.failure is not None and asked.answer.failure.kind == "no_evidence"
    assert "asks for a computed value ('17 * 23')" in asked.prompts("plan")[1]


@pytest.mark.parametrize(
    ("question", "reason"),
    [
        (
            "What is seventeen times twenty-three?",
            "computed value ('seventeen times twenty-three')",
        ),
        (
            "What is the population of the largest city of France, summed with the second largest?",
            "computed value ('summed with')",
        ),
        (
            "Sum the units column of the table below:\nregion,units\nnorth,5\nsouth,3",
            "the question holds data",
        ),
    ],
)
def test_a_computed_value_in_words_or_on_pasted_data_needs_code(
    asker: AskFn, question: str, reason: str
) -> None:
    lazy = {"needs_code": False, "answer": "It is 401."}
    asked = asker(question, {"plan": [lazy, lazy]})
    assert asked.answer.status == "failed" and "401" not in asked.answer.answer
    assert asked.answer.failure is not None and asked.answer.failure.kind == "no_evidence"
    assert reason in asked.prompts("plan")[1]


def test_a_general_knowledge_answer_carries_evidence_none(asker: AskFn) -> None:
    asked = asker(
        "What is the difference between a list and a tuple?",
        {"plan": [{"needs_code": False, "answer": "A list is mutable; a tuple is not."}]},
    )
    answer = asked.answer
    assert answer.status == "answered" and answer.evidence == "none"
    assert answer.run_ids == [] and asked.stages == ["plan"]


def test_hard_coded_output_that_ignores_the_inputs_goes_back_to_generate(asker: AskFn) -> None:
    """Reproduction 3: the printed number is even right; the program never opened the file."""
    asked = asker(
        "What is the total of the units column in sales.csv?",
        {
            "plan": [plan("the total")],
            "generate": [program(HARD_CODED), program(READ_SALES)],
            "verify": [approve],
            "answer": [answer_from_result],
        },
        files={"sales.csv": SALES},
    )
    answer = asked.answer
    assert answer.status == "answered", answer.failure
    assert answer.attempts == 2
    repair = asked.prompts("generate")[1]
    assert "inputs_used: the program read none of the given files (sales.csv)" in repair
    verdicts = {v.check: v for v in answer.verdicts}
    assert verdicts["inputs_used"].passed and verdicts["inputs_used"].detail == "read sales.csv"
    # The hard-coded attempt never reached the answer stage or the reviewer.
    assert asked.stages == ["plan", "generate", "generate", "answer", "verify"]


def test_hard_coded_output_with_an_approve_everything_verifier_never_answers(asker: AskFn) -> None:
    asked = asker(
        "What is the total of the units column in sales.csv?",
        {
            "plan": [plan("the total")],
            "generate": [program(HARD_CODED)] * 2,
            "verify": [approve] * 2,
            "answer": [answer_from_result] * 2,
        },
        files={"sales.csv": SALES},
        settings=AskSettings(max_repairs=1),
    )
    answer = asked.answer
    assert answer.status == "failed"
    assert answer.failure is not None and answer.failure.kind == "repairs_exhausted"
    assert "inputs_used" in answer.failure.message
    assert "verify" not in asked.stages and "answer" not in asked.stages


def test_invented_units_are_sent_back(asker: AskFn) -> None:
    asked = asker(
        "What is the total of the units column in sales.csv?",
        {
            "plan": [plan("the total")],
            "generate": [program(READ_SALES)],
            "verify": [approve],
            "answer": [says("The total is 17 kg."), says("The total is 17 units.")],
        },
        files={"sales.csv": SALES},
    )
    answer = asked.answer
    assert answer.status == "answered", answer.failure
    assert answer.answer == "The total is 17 units."
    assert "unit '17 kg': the unit 'kg' appears in no output" in asked.prompts("answer")[1]


def test_a_claimed_check_that_did_not_pass_is_sent_back(asker: AskFn) -> None:
    """The cross-check failed on the first attempt; the answer then claims tests that never
    ran. Only the checks that passed in the final attempt may be claimed."""
    check = "assert result == 6, result\n"
    asked = asker(
        "What is 3 + 1 + 2?",
        {
            "plan": [plan("the sum", cross_check="recompute the sum")],
            "generate": [
                program("import json\nprint(json.dumps(7))\n", cross_check=check),
                program(SUM_CODE, cross_check=check),
            ],
            "verify": [approve],
            "answer": [
                says("The result is 6; all unit tests pass."),
                says("The result is 6, cross-checked by an independent recomputation."),
            ],
        },
    )
    answer = asked.answer
    assert answer.status == "answered", answer.failure
    assert answer.attempts == 2
    assert "no tests check passed" in asked.prompts("answer")[1]
    claim = next(c for c in answer.claims if c.kind == "verification")
    assert claim.grounded and claim.source is not None and "cross_check" in claim.source
    cross = next(v for v in answer.verdicts if v.check == "cross_check")
    assert claim.run_id == cross.run_id


def careful_reviewer(prompt: str) -> dict[str, Any]:
    """A reviewer that checks the drafted answer names the region with the most units."""
    result = json.loads(prompt.split("Result: ", 1)[1].splitlines()[0])
    draft = prompt.split("Drafted answer:\n", 1)[1]
    top = max(result, key=result.get)
    ok = top in draft.lower() and "most" in draft.lower()
    return {
        "items": [],
        "answers_question": True,
        "problems": [],
        "answer_faithful": ok,
        "answer_problems": []
        if ok
        else [
            f"the question asks which region sold the most "
            f"({top}); the answer is about another question"
        ],
    }


def test_an_answer_to_a_different_question_is_caught_by_the_review(asker: AskFn) -> None:
    code = (
        "import json, pandas as pd\ndf = pd.read_csv('sales.csv')\n"
        "print(json.dumps({k: int(v) for k, v in df.groupby('region').units.sum().items()}))\n"
    )
    asked = asker(
        "Which region sold the most units?",
        {
            "plan": [plan("the region with the most units")],
            "generate": [program(code)],
            "verify": [careful_reviewer] * 2,
            "answer": [says("South sold the fewest units: 3."), says("East sold the most: 7.")],
        },
        files={"sales.csv": b"region,units\nnorth,5\nsouth,3\neast,7\n"},
    )
    answer = asked.answer
    assert answer.status == "answered", answer.failure
    assert answer.answer == "East sold the most: 7."
    assert "the answer is about another question" in asked.prompts("answer")[1]
    assert asked.stages == ["plan", "generate", "answer", "verify", "answer", "verify"]


def test_an_approve_everything_verifier_cannot_pass_a_contradicted_answer(asker: AskFn) -> None:
    asked = asker(
        "What is the total of the units column in sales.csv?",
        {
            "plan": [plan("the total")],
            "generate": [program(READ_SALES)],
            "verify": [approve] * 3,
            "answer": [says("The total is 18 units.")] * 3,
        },
        files={"sales.csv": SALES},
    )
    assert asked.answer.status == "failed"
    assert asked.answer.failure is not None and asked.answer.failure.kind == "ungrounded"
    message = asked.answer.failure.message
    assert "'18'" in message and 'inputs_used): {"total": 17}' in message


def test_an_honest_answer_costs_no_extra_model_call(asker: AskFn) -> None:
    asked = asker(
        "What is the total of the units column in sales.csv?",
        {
            "plan": [plan("the total", invariants=[("non-negative", "result['total'] >= 0")])],
            "generate": [program(READ_SALES)],
            "verify": [approve],
            "answer": [says("The total is 17 units (verified: the invariant check passed).")],
        },
        files={"sales.csv": SALES},
    )
    answer = asked.answer
    assert answer.status == "answered", answer.failure
    assert asked.stages == ["plan", "generate", "answer", "verify"]
    assert answer.usage.requests == 4
    assert [(c.kind, c.text, c.grounded) for c in answer.claims] == [
        ("number", "17", True),
        ("verification", "invariant", True),
        ("verification", "verified", True),
    ]
    checks = [v.check for v in answer.verdicts]
    assert checks[-3:] == ["grounding", "checklist", "answer"] and "inputs_used" in checks
    assert all(v.passed for v in answer.verdicts)


def test_the_cli_and_the_trace_show_the_evidence(
    executor: execbox.Executor, no_model_env: None
) -> None:
    script: dict[str, list[Reply]] = {
        "submit_plan": [plan("the sum")],
        "submit_generate": [program(SUM_CODE)],
        "submit_verify": [approve],
        "submit_answer": [says("The result is 7."), says("The result is 6.")],
    }
    with serve(script) as (_chat, url):
        result = CliRunner().invoke(
            main, ["ask", "What is 3 + 1 + 2?", "--model", "served-model", "--base-url", url]
        )
    assert result.exit_code == 0, result.output
    assert result.stdout == "The result is 6.\n"
    assert "[ok] number '6': run " in result.stderr and "stdout line 1: sum 6" in result.stderr
    assert "[pass] grounding" in result.stderr
    ask_id = result.stderr.split("execbox runs trace ")[1].split()[0]
    trace = CliRunner().invoke(main, ["runs", "trace", ask_id])
    assert trace.exit_code == 0, trace.output
    lines = trace.output.splitlines()
    ungrounded = next(
        i for i, line in enumerate(lines) if "answer    attempt 1 ungrounded (draft 1)" in line
    )
    assert "[NOT IN THE OUTPUTS] number '7': no output shows this value" in lines[ungrounded + 1]
    assert "grounding pass" in trace.output
    assert "answer    attempt 1 grounded (draft 2)" in trace.output

    no_code: dict[str, list[Reply]] = {
        "submit_plan": [{"needs_code": False, "answer": "A tuple is immutable."}]
    }
    with serve(no_code) as (_chat, url):
        result = CliRunner().invoke(
            main, ["ask", "What is a tuple?", "--model", "served-model", "--base-url", url]
        )
    assert result.exit_code == 0, result.output
    assert result.stdout == "A tuple is immutable.\n"
    assert "evidence: none (answered without running code" in result.stderr


CHANGE_CODE = (
    "import json\nprint('revenue: 6')\nprint('rows before: 10')\nprint('rows after: 12')\n"
    "print(json.dumps({'revenue': 6, 'before': 10, 'after': 12}))\n"
)


def test_glued_magnitudes_and_wrong_changes_are_redrafted_honest_ones_pass(asker: AskFn) -> None:
    """Issue 37's second attack, through the loop: "$5bn" and a wrong "up 40%" go back to the
    answer stage naming them; the change derived from two printed values passes."""
    honest = "Revenue was 6; rows rose from 10 to 12, up 20%."
    asked = asker(
        "How did revenue and rows change?",
        {
            "plan": [plan("revenue", "rows")],
            "generate": [program(CHANGE_CODE)],
            "verify": [approve],
            "answer": [says("Revenue was $5bn; rows rose from 10 to 12, up 40%."), says(honest)],
        },
    )
    answer = asked.answer
    assert answer.status == "answered", answer.failure
    assert answer.answer == honest
    redraft = asked.prompts("answer")[1]
    assert "number '$5bn': no output shows this value" in redraft
    assert "number '40%'" in redraft
    change = next(c for c in answer.claims if c.text == "20%")
    assert change.grounded and change.source == "the change from 10 to 12"
    assert asked.stages == ["plan", "generate", "answer", "answer", "verify"]


YOY_CODE = (
    "import json\nbefore, after = 1204, 1530\nchange = round((after / before - 1) * 100, 1)\n"
    "print(f'2022: {before:,}')\nprint(f'2023: {after:,}')\nprint(f'change: {change:+}%')\n"
    "print(json.dumps({'before': before, 'after': after, 'change_pct': change}))\n"
)


def test_growth_to_the_start_value_is_redrafted_the_end_value_passes(asker: AskFn) -> None:
    """Round thirteen through the loop: "grew 27.1% to 1,204" states two printed numbers,
    but 1,204 is the start; it goes back to the answer stage, and the end value passes."""
    honest = "Sales grew 27.1% to 1,530."
    asked = asker(
        "How much did sales grow from 2022 to 2023?",
        {
            "plan": [plan("the growth")],
            "generate": [program(YOY_CODE)],
            "verify": [approve],
            "answer": [says("Sales grew 27.1% to 1,204."), says(honest)],
        },
    )
    answer = asked.answer
    assert answer.status == "answered", answer.failure
    assert answer.answer == honest
    assert "number '1,204': a change of 27.1% to this value" in asked.prompts("answer")[1]
    assert asked.stages == ["plan", "generate", "answer", "answer", "verify"]
