"""The ask loop against the real sandbox, with a scripted model (no network)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from pydantic import BaseModel

import execbox
from execbox.agent import AskSettings, ask
from execbox.agent.trace import TraceStore
from tests.agent.agent_scripts import plan, program, result_of, script

SALES = b"region,units\nnorth,5\nsouth,3\nnorth,2\neast,7\n"


def test_correct_code_is_answered_on_the_first_try(executor: execbox.Executor) -> None:
    model = script(
        plans=[
            plan(
                "total units per region",
                invariants=[
                    (
                        "non-negative, each at most the total",
                        "all(0 <= v <= sum(result.values()) for v in result.values())",
                    )
                ],
            )
        ],
        programs=[
            program(
                "import pandas as pd, json\n"
                "df = pd.read_csv('sales.csv')\n"
                "totals = df.groupby('region').units.sum().to_dict()\n"
                "print(json.dumps({k: int(v) for k, v in totals.items()}))\n"
            )
        ],
    )
    answer = ask(
        "Total units per region?", executor=executor, model=model.model, files={"sales.csv": SALES}
    )
    assert answer.status == "answered", answer.failure
    assert answer.attempts == 1
    assert answer.outputs[0].result == {"east": 7, "north": 7, "south": 3}
    assert "'north': 7" in answer.answer or '"north": 7' in answer.answer
    assert all(v.passed for v in answer.verdicts)
    assert {v.check for v in answer.verdicts} >= {"status", "result", "invariant", "checklist"}
    for run_id in answer.run_ids:
        assert executor.store.get(run_id) is not None
    assert len(model.calls("generate")) == 1


def test_runtime_error_is_repaired_on_the_second_try(executor: execbox.Executor) -> None:
    model = script(
        plans=[plan("print the mean units")],
        programs=[
            program("import json\nvalues = []\nprint(json.dumps(sum(values) / len(values)))\n"),
            program(
                "import json\nvalues = [5, 3, 2, 7]\nprint(json.dumps(sum(values) / len(values)))\n"
            ),
        ],
    )
    answer = ask("Mean units?", executor=executor, model=model.model)
    assert answer.status == "answered", answer.failure
    assert answer.attempts == 2
    assert answer.outputs[0].result == 4.25
    repair_prompt = model.calls("generate")[1]
    assert "ZeroDivisionError" in repair_prompt
    assert "line: 3" in repair_prompt
    assert ">   3 | print(json.dumps(sum(values) / len(values)))" in repair_prompt
    assert "Fix the minimal lines" in repair_prompt


def test_failures_past_three_repairs_end_in_a_clean_failure_with_logs(
    executor: execbox.Executor,
) -> None:
    broken = [program(f"raise ValueError('broken {i}')\n") for i in range(4)]
    model = script(plans=[plan("anything")], programs=broken)
    answer = ask("Something?", executor=executor, model=model.model)
    assert answer.status == "failed"
    assert answer.failure is not None and answer.failure.kind == "repairs_exhausted"
    assert answer.attempts == 4  # the first try and 3 repairs, then it stops
    assert len(model.calls("generate")) == 4
    assert [log.error for log in answer.failure.logs] == [
        f"ValueError: broken {i}" for i in range(4)
    ]
    assert all(log.run_ids and log.feedback for log in answer.failure.logs)
    assert answer.answer == "" and answer.code is None


def test_verifier_catches_top_10_instead_of_top_5_and_the_retry_fixes_it(
    executor: execbox.Executor,
) -> None:
    def reviewer(prompt: str) -> dict[str, object]:
        top = result_of(prompt)
        ok = len(top) == 5
        return {
            "items": [
                {
                    "item": "exactly 5 numbers",
                    "met": ok,
                    "note": "" if ok else f"printed {len(top)} numbers, asked for 5",
                }
            ],
            "answers_question": ok,
            "problems": [],
            "answer_faithful": True,
        }

    model = script(
        plans=[plan("exactly 5 numbers", "largest first")],
        programs=[
            program("import json\nprint(json.dumps(sorted(range(50), reverse=True)[:10]))\n"),
            program("import json\nprint(json.dumps(sorted(range(50), reverse=True)[:5]))\n"),
        ],
        reviews=[reviewer, reviewer],
    )
    answer = ask("Top 5 of 0..49?", executor=executor, model=model.model)
    assert answer.status == "answered", answer.failure
    assert answer.attempts == 2
    assert answer.outputs[0].result == [49, 48, 47, 46, 45]
    assert "printed 10 numbers, asked for 5" in model.calls("generate")[1]


def test_policy_denial_leads_to_compliant_code(executor: execbox.Executor) -> None:
    model = script(
        plans=[plan("print the count")],
        programs=[
            program("import subprocess\nprint(subprocess.check_output(['wc', '-l']))\n"),
            program("import json\nprint(json.dumps(len('a b c'.split())))\n"),
        ],
    )
    answer = ask(
        "How many words in 'a b c'?",
        executor=executor,
        model=model.model,
        settings=AskSettings(profile="minimal"),
    )
    assert answer.status == "answered", answer.failure
    assert answer.outputs[0].result == 3
    repair_prompt = model.calls("generate")[1]
    assert "import.deny" in repair_prompt and "subprocess" in repair_prompt
    trace = TraceStore(executor.store.engine).get(answer.ask_id)
    assert trace is not None
    policy = [s for s in trace.stages if s.stage == "policy"]
    assert [s.status for s in policy] == ["deny", "allow"]
    executes = [s for s in trace.stages if s.stage == "execute"]
    assert [s.attempt for s in executes] == [2]  # the denied code never ran


def test_exec_time_budget_trips_into_a_clean_failure(executor: execbox.Executor) -> None:
    model = script(
        plans=[plan("wait")], programs=[program("import time\ntime.sleep(30)\nprint(1)\n")] * 4
    )
    settings = AskSettings(max_exec_s=1.0, limits=execbox.Limits(timeout_s=20))
    answer = ask("Wait a while?", executor=executor, model=model.model, settings=settings)
    assert answer.status == "failed"
    assert answer.failure is not None and answer.failure.kind == "exec_time"
    assert "budget" in answer.failure.message
    assert len(model.calls("generate")) == 1  # tripped: no repair after the budget is spent
    assert answer.failure.logs[0].status == "budget_exceeded"


def test_token_budget_trips_before_another_model_call(executor: execbox.Executor) -> None:
    model = script(
        plans=[plan("print 1")],
        programs=[program("raise SystemExit(1)\n")] * 4,
        tokens_per_call=1000,
    )
    answer = ask(
        "One?", executor=executor, model=model.model, settings=AskSettings(max_tokens=2500)
    )
    assert answer.status == "failed"
    assert answer.failure is not None and answer.failure.kind == "tokens"
    assert len(model.prompts) == 3  # plan, generate, generate: then 3000 > 2500 stops it
    assert answer.usage.total_tokens == 3000


def test_artifact_breaker_trips_on_too_many_files(executor: execbox.Executor) -> None:
    code = "for i in range(5):\n    open(f'out{i}.txt', 'w').write('x')\nprint(5)\n"
    model = script(plans=[plan("write files")], programs=[program(code)] * 4)
    answer = ask(
        "Write files?",
        executor=executor,
        model=model.model,
        settings=AskSettings(max_artifact_files=3),
    )
    assert answer.status == "failed"
    assert answer.failure is not None and answer.failure.kind == "artifacts"
    assert len(model.calls("generate")) == 1


def test_pure_text_question_runs_no_code(executor: execbox.Executor, traces: TraceStore) -> None:
    before = executor.store.count()
    model = script(
        plans=[{"needs_code": False, "answer": "A list is mutable; a tuple is not."}], programs=[]
    )
    answer = ask(
        "What is the difference between a list and a tuple?", executor=executor, model=model.model
    )
    assert answer.status == "answered"
    assert answer.answer == "A list is mutable; a tuple is not."
    assert answer.run_ids == [] and answer.code is None
    assert executor.store.count() == before
    assert [stage for stage, _ in model.prompts] == ["plan"]
    trace = traces.get(answer.ask_id)
    assert trace is not None
    assert [s.stage for s in trace.stages] == ["plan", "answer"]


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MESSY = (EXAMPLES / "agent_people.csv").read_bytes()  # the CSV example of docs/agent.md

CLEAN_CODE = """\
import csv, json
from datetime import datetime

FORMATS = ["%Y-%m-%d", "%d/%m/%Y", "%Y/%m/%d", "%d %b %Y"]

def iso(text):
    for fmt in FORMATS:
        try:
            return datetime.strptime(text, fmt).date().isoformat(), fmt != "%Y-%m-%d"
        except ValueError:
            pass
    raise ValueError(f"unknown date {text!r}")

with open("people.csv", newline="") as fh:
    rows = list(csv.reader(fh))
header = [h.strip() for h in rows[0]]
trimmed = dates_changed = 0
clean, seen, duplicates = [], set(), 0
for raw in rows[1:]:
    cells = [c.strip() for c in raw]
    trimmed += sum(1 for a, b in zip(raw, cells) if a != b)
    cells[2], changed = iso(cells[2])
    dates_changed += changed
    key = tuple(cells)
    if key in seen:
        duplicates += 1
        continue
    seen.add(key)
    clean.append(cells)
with open("people_clean.csv", "w", newline="") as fh:
    writer = csv.writer(fh)
    writer.writerow(header)
    writer.writerows(clean)
summary = {"rows_in": len(rows) - 1, "rows_out": len(clean), "cells_trimmed": trimmed,
           "dates_standardized": dates_changed, "duplicates_removed": duplicates}
for key, value in summary.items():
    print(f"{key}: {value}")
print(json.dumps(summary))
"""


class CleanSummary(BaseModel):
    rows_in: int
    rows_out: int
    cells_trimmed: int
    dates_standardized: int
    duplicates_removed: int


@pytest.mark.parametrize("schema", ["model", "json"])
def test_csv_normalization_end_to_end_with_counts_and_a_valid_cleaned_file(
    executor: execbox.Executor, schema: str
) -> None:
    expected = (
        CleanSummary
        if schema == "model"
        else json.loads((EXAMPLES / "agent_clean_summary.schema.json").read_text())
    )
    model = script(
        plans=[
            plan(
                "trim whitespace",
                "dates as YYYY-MM-DD",
                "remove duplicate rows",
                "report counts",
                "write people_clean.csv",
                invariants=[
                    (
                        "rows accounted for",
                        "result['rows_in'] == result['rows_out'] + result['duplicates_removed']",
                    ),
                    ("counts non-negative", "all(v >= 0 for v in result.values())"),
                ],
            )
        ],
        programs=[program(CLEAN_CODE)],
    )
    answer = ask(
        "Clean people.csv: trim whitespace, standardize dates, remove duplicates.",
        executor=executor,
        model=model.model,
        files={"people.csv": MESSY},
        expected_schema=expected,
    )
    assert answer.status == "answered", answer.failure
    # Bob's two rows become identical once trimmed and standardized: 2 duplicates in all.
    assert answer.outputs[0].result == {
        "rows_in": 6,
        "rows_out": 4,
        "cells_trimmed": 6,
        "dates_standardized": 3,
        "duplicates_removed": 2,
    }
    assert {v.check for v in answer.verdicts if v.passed} >= {"schema", "invariant"}
    cleaned = next(a for a in answer.artifacts if a.path == "people_clean.csv")
    assert cleaned.data is not None
    rows = list(csv.reader(io.StringIO(cleaned.data.decode())))
    assert rows == [
        ["name", "city", "joined"],
        ["Alice", "Paris", "2024-01-05"],
        ["Bob", "Berlin", "2024-02-05"],
        ["Carol", "Rome", "2024-03-07"],
        ["Dan", "Oslo", "2024-03-07"],
    ]


def test_schema_mismatch_goes_back_to_generate(executor: execbox.Executor) -> None:
    schema = {"type": "object", "required": ["count"], "properties": {"count": {"type": "integer"}}}
    model = script(
        plans=[plan("count")],
        programs=[
            program("import json\nprint(json.dumps({'n': 3}))\n"),
            program("import json\nprint(json.dumps({'count': 3}))\n"),
        ],
    )
    answer = ask("Count?", executor=executor, model=model.model, expected_schema=schema)
    assert answer.status == "answered", answer.failure
    assert answer.attempts == 2
    assert "'count' is a required property" in model.calls("generate")[1]


def test_failed_invariant_and_cross_check_go_back_to_generate(executor: execbox.Executor) -> None:
    probs_bad = "import json\nprint(json.dumps({'p': [0.5, 0.6]}))\n"
    probs_good = "import json\nprint(json.dumps({'p': [0.4, 0.6]}))\n"
    check = "assert result['p'] == [0.4, 0.6], result\n"
    model = script(
        plans=[
            plan(
                "probabilities",
                invariants=[("sum to 1", "abs(sum(result['p']) - 1) < 1e-9")],
                cross_check="recompute the probabilities",
            )
        ],
        programs=[program(probs_bad, cross_check=check), program(probs_good, cross_check=check)],
    )
    answer = ask("Probabilities?", executor=executor, model=model.model)
    assert answer.status == "answered", answer.failure
    assert answer.attempts == 2
    feedback = model.calls("generate")[1]
    assert "invariant: sum to 1" in feedback and "cross_check" in feedback
    assert {v.check for v in answer.verdicts if v.passed} >= {"invariant", "cross_check"}


MERGE_WRONG = """\
def merge(intervals):
    out = []
    for start, end in sorted(intervals):
        if out and start < out[-1][1]:   # misses touching intervals and nested ones
            out[-1][1] = end
        else:
            out.append([start, end])
    return out
"""

MERGE_RIGHT = """\
def merge(intervals):
    out = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out
"""

MERGE_TESTS = """\
import random

assert merge([[1, 3], [2, 6], [8, 10]]) == [[1, 6], [8, 10]]
assert merge([[1, 4], [4, 5]]) == [[1, 5]]

def covered(intervals):
    return {x for s, e in intervals for x in range(2 * s, 2 * e + 1)}

rng = random.Random(7)
for _ in range(300):
    xs = [sorted(rng.sample(range(20), 2)) for _ in range(rng.randint(1, 6))]
    got = merge([list(x) for x in xs])
    assert covered(got) == covered(xs), (xs, got)
    assert all(a[1] < b[0] for a, b in zip(got, got[1:])), (xs, got)
print("tests passed")
"""

MERGE_MAIN = "import json\nprint(json.dumps(merge([[1, 4], [2, 3], [6, 8], [8, 9]])))\n"


def test_tests_first_mode_rejects_a_wrong_implementation(executor: execbox.Executor) -> None:
    model = script(
        plans=[plan("merged intervals, sorted", mode="tests_first")],
        programs=[
            program(MERGE_MAIN, solution=MERGE_WRONG, tests=MERGE_TESTS),
            program(MERGE_MAIN, solution=MERGE_RIGHT, tests=MERGE_TESTS),
        ],
    )
    answer = ask("Merge [1,4],[2,3],[6,8],[8,9]", executor=executor, model=model.model)
    assert answer.status == "answered", answer.failure
    assert answer.attempts == 2
    assert answer.outputs[0].result == [[1, 4], [6, 9]]
    first = answer.plan and model.calls("generate")[1]
    assert first and "The tests failed" in first and "AssertionError" in first
    trace = TraceStore(executor.store.engine).get(answer.ask_id)
    assert trace is not None
    ran = [(s.attempt, s.detail["program"]) for s in trace.stages if s.stage == "execute"]
    assert ran[:3] == [(1, "tests"), (2, "tests"), (2, "main")]  # wrong code's main never ran
    assert answer.verdicts[0].check == "tests" and answer.verdicts[0].passed
    assert MERGE_RIGHT in (answer.code or "")


def test_tests_first_mode_never_answers_while_tests_fail(executor: execbox.Executor) -> None:
    wrong = program(MERGE_MAIN, solution=MERGE_WRONG, tests=MERGE_TESTS)
    model = script(plans=[plan("merged", mode="tests_first")], programs=[wrong] * 2)
    answer = ask("Merge", executor=executor, model=model.model, settings=AskSettings(max_repairs=1))
    assert answer.status == "failed"
    assert answer.failure is not None and answer.failure.kind == "repairs_exhausted"
    assert model.calls("answer") == [] and model.calls("verify") == []


def test_answer_json_carries_the_evidence(executor: execbox.Executor) -> None:
    model = script(plans=[plan("x")], programs=[program("import json\nprint(json.dumps(1))\n")])
    answer = ask("One?", executor=executor, model=model.model)
    data = json.loads(answer.model_dump_json())
    assert data["status"] == "answered"
    assert set(data) >= {
        "ask_id",
        "answer",
        "code",
        "outputs",
        "run_ids",
        "artifacts",
        "verdicts",
        "usage",
    }
    assert data["usage"]["requests"] == 4  # plan, generate, verify, answer


def test_no_model_configured_is_a_clear_usage_error(
    executor: execbox.Executor, no_model_env: None
) -> None:
    with pytest.raises(execbox.UsageError, match="EXECBOX_MODEL"):
        ask("Anything?", executor=executor)


CHART_CODE = """\
import json
import matplotlib.pyplot as plt
import pandas as pd
df = pd.read_csv('sales.csv')
totals = df.groupby('region').units.sum().sort_values(ascending=False)
ax = totals.plot.bar(title='Units by region')
ax.set_ylabel('units')
plt.tight_layout()
plt.savefig('units_by_region.png', dpi=80)
print(json.dumps({'bars': len(totals), 'chart': 'units_by_region.png'}))
"""


def test_chart_comes_back_as_a_png_artifact_of_the_cited_run(executor: execbox.Executor) -> None:
    model = script(
        plans=[
            plan(
                "bar chart of units per region",
                "saved as PNG",
                invariants=[("one bar per region", "result['bars'] == 3")],
            )
        ],
        programs=[program(CHART_CODE)],
    )
    answer = ask(
        "Chart units per region", executor=executor, model=model.model, files={"sales.csv": SALES}
    )
    assert answer.status == "answered", answer.failure
    chart = answer.artifacts[0]
    assert (chart.path, chart.mime_type) == ("units_by_region.png", "image/png")
    assert chart.data is not None and chart.data.startswith(b"\x89PNG\r\n\x1a\n")
    stored = executor.store.artifact_data(answer.outputs[0].run_id, "units_by_region.png")
    assert stored == chart.data
    assert "units_by_region.png" in model.calls("verify")[0]  # the reviewer sees the file


def test_limits_the_policy_refuses_are_a_usage_error_before_anything_runs(
    executor: execbox.Executor,
) -> None:
    model = script(plans=[], programs=[])
    with pytest.raises(execbox.UsageError, match="limits"):
        ask(
            "Anything?",
            executor=executor,
            model=model.model,
            settings=AskSettings(profile="minimal", limits=execbox.Limits(timeout_s=600)),
        )
    assert model.prompts == []


def test_steps_mode_runs_cells_in_one_session_that_keeps_state(executor: execbox.Executor) -> None:
    cells = [
        "import pandas as pd\ndf = pd.read_csv('sales.csv')\nprint('rows', len(df))",
        "totals = df.groupby('region').units.sum()\ntotals.to_csv('totals.csv')",
        "import json\nprint(json.dumps({k: int(v) for k, v in totals.items()}))",
    ]
    model = script(
        plans=[plan("units per region", mode="steps")], programs=[program("", cells=cells)]
    )
    answer = ask(
        "Units per region, step by step",
        executor=executor,
        model=model.model,
        files={"sales.csv": SALES},
    )
    assert answer.status == "answered", answer.failure
    assert answer.outputs[-1].result == {"east": 7, "north": 7, "south": 3}
    assert [o.stdout for o in answer.outputs[:2]] == ["rows 4\n", ""]
    sessions = {
        executor.store.get(o.run_id).result.session_id  # type: ignore[union-attr]
        for o in answer.outputs
    }
    assert len(sessions) == 1 and None not in sessions
    assert [a.path for a in answer.artifacts] == ["totals.csv"]


def test_steps_mode_repair_starts_a_fresh_session(executor: execbox.Executor) -> None:
    first = ["x = 10", "import json\nprint(json.dumps(x / y))"]
    second = ["x = 10\ny = 4", "import json\nprint(json.dumps(x / y))"]
    model = script(
        plans=[plan("x over y", mode="steps")],
        programs=[program("", cells=first), program("", cells=second)],
    )
    answer = ask("x / y?", executor=executor, model=model.model)
    assert answer.status == "answered", answer.failure
    assert answer.outputs[-1].result == 2.5
    feedback = model.calls("generate")[1]
    assert "NameError" in feedback and "in cell 2" in feedback
    assert ">   2 | print(json.dumps(x / y))" in feedback  # the snippet is the cell's own line
    trace = TraceStore(executor.store.engine).get(answer.ask_id)
    assert trace is not None
    by_attempt = {s.attempt: s.detail["session_id"] for s in trace.stages if s.stage == "execute"}
    assert by_attempt[1] != by_attempt[2]


def test_steps_mode_cells_share_the_exec_time_budget(executor: execbox.Executor) -> None:
    cells = ["import time\ntime.sleep(0.6)", "time.sleep(30)", "print(1)"]
    model = script(plans=[plan("wait", mode="steps")], programs=[program("", cells=cells)] * 4)
    answer = ask(
        "Wait?",
        executor=executor,
        model=model.model,
        settings=AskSettings(max_exec_s=1.0, limits=execbox.Limits(timeout_s=20)),
    )
    assert answer.status == "failed"
    assert answer.failure is not None and answer.failure.kind == "exec_time"
    assert len(model.calls("generate")) == 1
    assert len(answer.failure.logs[0].run_ids) == 2  # the third cell never started
