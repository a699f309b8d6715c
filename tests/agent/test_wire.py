"""The real OpenAI-compatible provider path over HTTP (a scripted server on loopback), the CLI,
and the stored trace."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import execbox
from execbox.agent import ask
from execbox.agent.trace import TraceStore
from execbox.cli import main
from tests.agent.agent_scripts import answer_from_result, approve, plan, program
from tests.agent.chat_server import Reply, serve

CODE = (
    "import json\nvalues = [3, 1, 2]\nprint('sum', sum(values))\nprint(json.dumps(sum(values)))\n"
)


def chat_script() -> dict[str, list[Reply]]:
    return {
        "submit_plan": [plan("the sum of 3, 1 and 2", invariants=[("positive", "result > 0")])],
        "submit_generate": [program(CODE)],
        "submit_verify": [approve],
        "submit_answer": [answer_from_result],
    }


def test_openai_compatible_server_drives_the_whole_ask_over_http(
    executor: execbox.Executor, no_model_env: None
) -> None:
    with serve(chat_script()) as (chat, url):
        answer = ask("What is 3 + 1 + 2?", executor=executor, model="served-model", base_url=url)
    assert answer.status == "answered", answer.failure
    assert answer.answer == "The result is 6."
    paths = [path for path, _ in chat.requests]
    assert paths == ["/v1/chat/completions"] * 4
    bodies = [body for _, body in chat.requests]
    assert {b["model"] for b in bodies} == {"served-model"}
    plan_tool = bodies[0]["tools"][0]["function"]
    assert plan_tool["name"] == "submit_plan"
    assert {"needs_code", "checklist", "invariants"} <= set(plan_tool["parameters"]["properties"])
    assert bodies[0]["messages"][0]["role"] == "system"  # the stage's instructions
    # Token usage as the server reported it reaches the answer and the stored trace.
    assert answer.usage.input_tokens == sum(u[0] for u in chat.usages)
    assert answer.usage.output_tokens == sum(u[1] for u in chat.usages)
    trace = TraceStore(executor.store.engine).get(answer.ask_id)
    assert trace is not None
    assert [(c.input_tokens, c.output_tokens) for c in trace.model_calls] == chat.usages
    assert trace.model == "openai:served-model"


def test_stored_trace_shows_every_stage_each_calls_tokens_and_the_cited_runs(
    executor: execbox.Executor, no_model_env: None
) -> None:
    with serve(chat_script()) as (chat, url):
        answer = ask("What is 3 + 1 + 2?", executor=executor, model="served-model", base_url=url)
    assert answer.ok
    result = CliRunner().invoke(main, ["runs", "trace", answer.ask_id, "--json"])
    assert result.exit_code == 0, result.output
    trace = json.loads(result.output)
    stages = [(s["stage"], s["status"]) for s in trace["stages"]]
    assert stages == [
        ("plan", "code"),
        ("generate", "first"),
        ("policy", "allow"),
        ("execute", "ok"),
        ("answer", "grounded"),
        ("verify", "passed"),
        ("answer", "answered"),
    ]
    # One review call judges both the output and the drafted answer.
    assert [c["stage"] for c in trace["model_calls"]] == ["plan", "generate", "answer", "verify"]
    assert all(c["input_tokens"] > 0 and c["output_tokens"] > 0 for c in trace["model_calls"])
    assert trace["run_ids"] == answer.run_ids and len(answer.run_ids) == 2  # program, invariants
    executed = next(s for s in trace["stages"] if s["stage"] == "execute")
    assert executed["run_id"] == answer.outputs[0].run_id
    for run_id in trace["run_ids"]:
        assert executor.store.get(run_id) is not None
    text = CliRunner().invoke(main, ["runs", "trace", answer.ask_id])
    assert text.exit_code == 0
    assert "execute" in text.output and answer.outputs[0].run_id in text.output
    checks = next(s for s in trace["stages"] if s["stage"] == "verify")["detail"]["check_runs"]
    assert checks == [r for r in answer.run_ids if r != answer.outputs[0].run_id]
    assert f"checks ran as {checks[0]}" in text.output
    listed = CliRunner().invoke(main, ["runs", "asks", "--json"])
    assert answer.ask_id in listed.output


def test_cli_ask_prints_the_answer_as_json_and_writes_artifacts(
    executor: execbox.Executor, no_model_env: None, tmp_path: object
) -> None:
    from pathlib import Path

    out = Path(str(tmp_path)) / "out"
    data = Path(str(tmp_path)) / "numbers.csv"
    data.write_text("n\n3\n1\n2\n")
    code = (
        "import json, pandas as pd\ndf = pd.read_csv('numbers.csv')\n"
        "df.sort_values('n').to_csv('sorted.csv', index=False)\n"
        "print(json.dumps(int(df.n.sum())))\n"
    )
    script = chat_script() | {"submit_generate": [program(code)]}
    with serve(script) as (_chat, url):
        result = CliRunner().invoke(
            main,
            [
                "ask",
                "Sum of n, and write it sorted?",
                "--file",
                str(data),
                "--model",
                "served-model",
                "--base-url",
                url,
                "--json",
                "--artifacts-dir",
                str(out),
            ],
        )
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["status"] == "answered" and answer["outputs"][0]["result"] == 6
    assert [a["path"] for a in answer["artifacts"]] == ["sorted.csv"]
    assert (out / "sorted.csv").read_text() == "n\n1\n2\n3\n"


def test_cli_ask_without_a_model_is_a_usage_error(no_model_env: None) -> None:
    result = CliRunner().invoke(main, ["ask", "Anything?"])
    assert result.exit_code == 2
    assert "no model configured" in result.output and "EXECBOX_MODEL" in result.output


def test_bare_model_name_without_a_server_is_a_usage_error(no_model_env: None) -> None:
    from execbox.agent import resolve_model

    with pytest.raises(execbox.UsageError, match="names no provider"):
        resolve_model("llama3")
