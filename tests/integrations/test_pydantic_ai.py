"""execbox as a pydantic-ai toolset and a session toolset, driven by pydantic-ai's own offline
models (FunctionModel scripted turn by turn, TestModel) through `Agent(toolsets=[...])`, with the
model's code running in the real sandbox, locally and through `execbox serve`."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

import execbox
from execbox import tools
from execbox.contract import RunResult, Status
from execbox.errors import SessionClosed, UsageError
from execbox.integrations.pydantic_ai import ExecboxSessionToolset, ExecboxToolset

from .conftest import docs_example, modules_the_one_box_path_imports


def returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    return [
        p
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]


def run_python(code: str, **args: Any) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart("run_python", {"code": code, **args})])


def assert_ended(session: Any) -> None:
    try:
        assert session.closed
    except UsageError:  # a server forgets an ended session: the same thing, seen remotely
        pass


def test_the_one_box_path_never_imports_pydantic_ai(tmp_path: Path) -> None:
    assert modules_the_one_box_path_imports(tmp_path, "pydantic_ai") == []


def test_the_model_sees_execbox_tool_schema_and_the_apps_settings(
    executor: execbox.Executor,
) -> None:
    limits = execbox.Limits(timeout_s=7, memory_mib=300)
    seen: list[AgentInfo] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(info)
        return ModelResponse(parts=[TextPart("nothing to run")])

    toolset = ExecboxToolset(executor, limits=limits, network=["pypi.org"])
    Agent(FunctionModel(model), toolsets=[toolset]).run_sync("hi")
    (tool,) = seen[0].function_tools
    assert tool.name == "run_python"
    assert tool.parameters_json_schema == tools.parameters_schema(limits)
    assert tool.description == tools.describe_environment(limits, network=["pypi.org"])
    assert "7 s wall time" in tool.description and "pypi.org" in tool.description


def test_an_agent_fixes_its_error_and_keeps_state_across_steps_and_runs(backend: Any) -> None:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = returns(messages)
        if len(done) == 0:
            return run_python("total = sum(valuez)")
        if len(done) == 1:
            assert "NameError" in str(done[0].content)  # the model reads its error
            return run_python(
                "values = [int(x) for x in open('nums.csv')]\ntotal = sum(values)",
                files={"nums.csv": "3\n4\n5\n"},
            )
        if len(done) in (2, 3) and isinstance(messages[-1].parts[-1], ToolReturnPart):
            found = re.search(r"output: (\d+)", str(done[-1].content))
            return ModelResponse(parts=[TextPart(f"The answer is {found[1] if found else '?'}.")])
        return run_python("total * 2")  # the second agent run, on the first one's state

    with ExecboxSessionToolset(backend, limits=execbox.Limits(timeout_s=10)) as toolset:
        agent = Agent(FunctionModel(model), toolsets=[toolset])
        first = agent.run_sync("Sum nums.csv.")
        second = agent.run_sync("Now double it.", message_history=first.all_messages())
        session = toolset.session
        assert session is not None
    assert second.output == "The answer is 24."
    failed, loaded, doubled = returns(second.all_messages())
    assert failed.outcome == "success"  # the code failed, the tool did not: data for the model
    assert isinstance(failed.metadata, RunResult) and failed.metadata.status is Status.error
    assert failed.metadata.error is not None and failed.metadata.error.type == "NameError"
    assert loaded.metadata.ok and doubled.metadata.ok
    assert {failed.metadata.session_id, doubled.metadata.session_id} == {session.id}
    assert_ended(session)
    with pytest.raises(SessionClosed):
        toolset.code_tool.call({"code": "1"})


def test_wrong_arguments_go_back_through_the_retry_and_nothing_runs(backend: Any) -> None:
    calls = [
        ToolCallPart("run_python", {"source": "print(1)"}),  # fails the schema
        ToolCallPart("run_python", {"code": "print(1)", "files": {"../x": "y"}}),  # the request
        ToolCallPart("run_python", {"code": "print('fixed')"}),
    ]

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = len(returns(messages))
        return ModelResponse(parts=[calls[n]] if n < len(calls) else [TextPart("ok")])

    result = Agent(FunctionModel(model), toolsets=[ExecboxToolset(backend)]).run_sync("go")
    schema, request, fixed = returns(result.all_messages())
    assert schema.outcome == "retried" and schema.retry is not None
    assert schema.retry.cause == "validation_error" and "source" in str(schema.content)
    assert request.outcome == "retried" and request.retry is not None
    assert request.retry.cause == "model_retry" and "invalid_arguments" in str(request.content)
    assert schema.metadata is None and request.metadata is None  # neither ran
    assert fixed.outcome == "success" and fixed.metadata.stdout == "fixed\n"


def test_the_documented_test_model_example_runs_with_execbox_swapped_in(backend: Any) -> None:
    # pydantic-ai's testing guide: override the agent's model with TestModel, which calls every
    # tool with arguments made from its schema.
    agent = Agent("openai:gpt-4.1", toolsets=[ExecboxToolset(backend)], defer_model_check=True)
    with agent.override(model=TestModel()):
        result = agent.run_sync("Run something.")
    (ret,) = returns(result.all_messages())
    assert ret.outcome == "success" and isinstance(ret.metadata, RunResult)
    assert str(ret.content).startswith(f"status: {ret.metadata.status.value}")
    assert "run_python" in result.output


def test_the_docs_example_runs_with_an_offline_model(
    executor: execbox.Executor, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = returns(messages)
        if len(done) == 0:
            return run_python(
                "import pandas as pd\ndf = pd.read_csv('sales.csv')\nlist(df.columns)"
            )
        if len(done) == 2:
            return ModelResponse(parts=[TextPart(f"Top: {done[-1].metadata.stdout.strip()}.")])
        if isinstance(messages[-1].parts[-1], ToolReturnPart):
            return ModelResponse(parts=[TextPart("Columns: see above.")])
        return run_python("print(df.groupby('region').units.sum().idxmax())")  # df is kept

    code = docs_example(
        "pydantic-ai.md",
        {
            '"openai:gpt-4.1"': "FunctionModel(model)",
            "execbox.Executor()": "contextlib.nullcontext(executor)",
        },
    )
    monkeypatch.chdir(Path(__file__).parents[2])  # the example reads examples/sales.csv
    exec(
        code,
        {
            "contextlib": contextlib,
            "executor": executor,
            "FunctionModel": FunctionModel,
            "model": model,
        },
    )
    assert re.fullmatch(r"Top: \w+\.\n", capsys.readouterr().out)


@pytest.mark.hostile
def test_a_hostile_session_sees_no_host_secret_and_its_bombs_are_contained(
    jailed: execbox.Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "plugs-pydantic-ai-secret-93c0e1"
    monkeypatch.setenv("EXECBOX_PLUG_TEST_SECRET", secret)
    steps = [
        "import os, glob\nx = 1\nprint(dict(os.environ))\n"
        "for p in glob.glob('/proc/*/environ'):\n"
        "    try: print(p, open(p, 'rb').read())\n"
        "    except OSError as e: print(p, e)\n",
        "print(x)",
        "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass\n",
        "print(x)",
        "b = bytearray(1 << 30)",
        "print('fresh')",
    ]

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = len(returns(messages))
        return run_python(steps[n]) if n < len(steps) else ModelResponse(parts=[TextPart("ok")])

    limits = execbox.Limits(timeout_s=3, pids=24, memory_mib=256)
    with ExecboxSessionToolset(jailed, limits=limits) as toolset:
        result = Agent(FunctionModel(model), toolsets=[toolset]).run_sync("go")
    stole, kept, bombed, after_bomb, exploded, fresh = returns(result.all_messages())
    assert stole.metadata.ok and secret not in stole.metadata.stdout + stole.metadata.stderr
    assert secret not in str(stole.content)
    assert kept.metadata.ok and kept.metadata.stdout == "1\n"
    # The fork bomb outlived its interrupt, so the session was ended; the next call ran in a
    # new one (the state is gone) and its observation says so.
    assert bombed.metadata.status in (Status.timeout, Status.cpu_limit)
    assert "hint:" in str(bombed.content)
    assert str(after_bomb.content).startswith("note: session ")
    assert after_bomb.metadata.session_id != kept.metadata.session_id
    assert after_bomb.metadata.error is not None
    assert after_bomb.metadata.error.type == "NameError"
    assert exploded.metadata.status is Status.memory_limit
    assert str(fresh.content).startswith("note: session ") and fresh.metadata.ok
    assert fresh.metadata.session_id != exploded.metadata.session_id


@pytest.mark.hostile
def test_a_session_the_code_ended_is_replaced_and_the_model_is_told(jailed_backend: Any) -> None:
    toolset = ExecboxSessionToolset(jailed_backend, limits=execbox.Limits(memory_mib=256))
    try:
        assert toolset.code_tool.call({"code": "x = 1"}).observation.startswith("status: ok")
        ended = toolset.session
        exploded = toolset.code_tool.call({"code": "b = bytearray(1 << 30)"})
        assert exploded.result is not None and exploded.result.status is Status.memory_limit
        after = toolset.code_tool.call({"code": "print(x)"})
        assert after.observation.startswith("note: ") and "new session" in after.observation
        assert after.result is not None and after.result.error is not None
        assert after.result.error.type == "NameError"
        assert toolset.session is not None and toolset.session is not ended
    finally:
        toolset.close()
    assert_ended(ended)


def test_a_javascript_toolset_runs_node_under_its_own_tool_name(backend: Any) -> None:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        assert [t.name for t in info.function_tools] == ["run_javascript"]
        if returns(messages):
            return ModelResponse(parts=[TextPart("ok")])
        return ModelResponse(
            parts=[ToolCallPart("run_javascript", {"code": "console.log(typeof require, 6 * 7)"})]
        )

    toolset = ExecboxToolset(backend, language="javascript")
    (ret,) = returns(Agent(FunctionModel(model), toolsets=[toolset]).run_sync("go").all_messages())
    assert ret.content == "status: ok\nstdout:\nfunction 42"
