"""execbox as a LangChain tool and a session toolkit, driven by a scripted chat model through
LangChain's own agent (`create_agent`) and its documented tool-calling loop, with the model's
code running in the real sandbox, locally and through `execbox serve`."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "langchain_core", reason="the langchain extra: pip install 'execbox[langchain]'"
)

from langchain.agents import create_agent
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field

import execbox
from execbox import tools
from execbox.contract import RunResult, Status
from execbox.errors import SessionClosed, UsageError
from execbox.integrations.langchain import ExecboxSessionToolkit, ExecboxTool

from .conftest import docs_example, modules_the_one_box_path_imports

Turn = Callable[[list[BaseMessage]], AIMessage]


class ScriptedChatModel(BaseChatModel):
    """A chat model whose every turn the test computes from the conversation so far. It binds
    tools as LangChain's provider models do: their OpenAI-format schemas reach each turn."""

    turn: Turn
    tools_seen: list[list[dict[str, Any]]] = Field(default_factory=list)

    def bind_tools(
        self, tools: Sequence[Any], *, tool_choice: str | None = None, **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.tools_seen.append(kwargs.get("tools", []))
        return ChatResult(generations=[ChatGeneration(message=self.turn(messages))])

    @property
    def _llm_type(self) -> str:
        return "scripted"


def call(code: str, n: int, **args: Any) -> AIMessage:
    return AIMessage(
        content="",
        tool_calls=[{"name": "run_python", "args": {"code": code, **args}, "id": f"call_{n}"}],
    )


def tool_messages(messages: Sequence[BaseMessage]) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage)]


def assert_ended(session: Any) -> None:
    try:
        assert session.closed
    except UsageError:  # a server forgets an ended session: the same thing, seen remotely
        pass


def test_the_one_box_path_never_imports_langchain(tmp_path: Path) -> None:
    assert modules_the_one_box_path_imports(tmp_path, "langchain_core", "langchain") == []


def test_the_model_sees_execbox_tool_schema_and_the_apps_settings(
    executor: execbox.Executor,
) -> None:
    limits = execbox.Limits(timeout_s=7, memory_mib=300)
    tool = ExecboxTool(executor, limits=limits, network=["pypi.org"])
    seen = convert_to_openai_tool(tool)["function"]
    assert seen["parameters"] == tools.parameters_schema(limits)
    assert seen["description"] == tools.describe_environment(limits, network=["pypi.org"])
    assert "7 s wall time" in seen["description"] and "300 MiB memory" in seen["description"]
    stateful = convert_to_openai_tool(ExecboxSessionToolkit(executor).get_tools()[0])
    assert stateful == tools.openai_tool(stateful=True)


def test_an_agent_fixes_its_error_and_keeps_state_across_steps_in_a_session(
    backend: Any,
) -> None:
    def turn(messages: list[BaseMessage]) -> AIMessage:
        done = tool_messages(messages)
        if not done:
            return call("total = sum(valuez)", 1)
        if len(done) == 1:
            assert "NameError" in str(done[0].content)  # the model reads its error
            return call(
                "values = [int(x) for x in open('nums.csv')]\ntotal = sum(values)",
                2,
                files={"nums.csv": "3\n4\n5\n"},
            )
        if len(done) == 2:
            return call("total * 2", 3)
        found = re.search(r"output: (\d+)", str(done[-1].content))
        return AIMessage(content=f"The answer is {found[1] if found else '?'}.")

    model = ScriptedChatModel(turn=turn)
    with ExecboxSessionToolkit(backend, limits=execbox.Limits(timeout_s=10)) as toolkit:
        agent = create_agent(model, tools=toolkit.get_tools())
        state = agent.invoke({"messages": [HumanMessage("Double the sum of nums.csv.")]})
        session = toolkit.session
        assert session is not None
    assert state["messages"][-1].content == "The answer is 24."
    first, second, third = tool_messages(state["messages"])
    assert first.status == "success"  # the code failed, the tool did not: data, not an error
    assert isinstance(first.artifact, RunResult) and first.artifact.status is Status.error
    assert first.artifact.error is not None and first.artifact.error.type == "NameError"
    assert second.artifact.ok and third.artifact.ok
    assert {first.artifact.session_id, third.artifact.session_id} == {session.id}
    assert model.tools_seen[0] == [
        tools.openai_tool(stateful=True, limits=execbox.Limits(timeout_s=10))
    ]
    assert_ended(session)
    with pytest.raises(SessionClosed):
        toolkit.get_tools()[0].invoke({"code": "1"})


def test_the_documented_tool_calling_loop_runs_with_execbox_swapped_in(backend: Any) -> None:
    # LangChain's tool-calling how-to: bind the tools, invoke, run each tool call, invoke again.
    def turn(messages: list[BaseMessage]) -> AIMessage:
        done = tool_messages(messages)
        if not done:
            return AIMessage(
                content="",
                tool_calls=[
                    {
                        "name": "run_python",
                        "args": {"code": "print(open('a.txt').read().upper())"}
                        | {"files": {"a.txt": "shout"}},
                        "id": "call_1",
                    },
                    {"name": "run_python", "args": {"source": "print(1)"}, "id": "call_2"},
                ],
            )
        return AIMessage(content=" | ".join(str(m.content) for m in done))

    tool = ExecboxTool(backend)
    llm_with_tools = ScriptedChatModel(turn=turn).bind_tools([tool])
    messages: list[BaseMessage] = [HumanMessage("Shout the file.")]
    ai_msg = llm_with_tools.invoke(messages)
    messages.append(ai_msg)
    for tool_call in ai_msg.tool_calls:
        messages.append(tool.invoke(tool_call))
    answer = llm_with_tools.invoke(messages)
    ran, refused = tool_messages(messages)
    assert ran.content == "status: ok\nstdout:\nSHOUT" and ran.artifact.stdout == "SHOUT\n"
    # Arguments the model got wrong: LangChain's error shape, saying what to fix; nothing ran.
    assert refused.status == "error" and refused.artifact is None
    assert "code: Field required" in str(refused.content)
    assert "source: Extra inputs are not permitted" in str(refused.content)
    assert "SHOUT" in str(answer.content) and "invalid_arguments" in str(answer.content)


def test_the_docs_example_runs_with_an_offline_model(
    executor: execbox.Executor, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def turn(messages: list[BaseMessage]) -> AIMessage:
        done = tool_messages(messages)
        if not done:
            code = "import pandas as pd\nprint(pd.read_csv('sales.csv').groupby('region').units.sum().idxmax())"
            return call(code, 1)
        return AIMessage(content=f"The top region: {done[-1].artifact.stdout.strip()}.")

    code = docs_example(
        "langchain.md",
        {
            "from langchain_openai import ChatOpenAI\n": "",
            'ChatOpenAI(model="gpt-4.1")': "ScriptedChatModel(turn=turn)",
            "execbox.Executor()": "contextlib.nullcontext(executor)",
        },
    )
    monkeypatch.chdir(Path(__file__).parents[2])  # the example reads examples/sales.csv
    exec(
        code,
        {
            "contextlib": contextlib,
            "executor": executor,
            "ScriptedChatModel": ScriptedChatModel,
            "turn": turn,
        },
    )
    assert re.fullmatch(r"The top region: \w+\.\n", capsys.readouterr().out)


def test_an_async_agent_runs_the_tool_off_its_event_loop(backend: Any) -> None:
    def turn(messages: list[BaseMessage]) -> AIMessage:
        done = tool_messages(messages)
        return AIMessage(content=str(done[0].content)) if done else call("print(6 * 7)", 1)

    agent = create_agent(ScriptedChatModel(turn=turn), tools=[ExecboxTool(backend)])
    state = asyncio.run(agent.ainvoke({"messages": [HumanMessage("Go.")]}))
    assert state["messages"][-1].content == "status: ok\nstdout:\n42"


def test_a_bad_file_name_is_refused_before_anything_runs(backend: Any) -> None:
    message = ExecboxTool(backend).invoke(
        {
            "type": "tool_call",
            "id": "call_1",
            "name": "run_python",
            "args": {"code": "print(1)", "files": {"../escape.txt": "x"}},
        }
    )
    assert message.status == "error" and message.artifact is None
    assert str(message.content).startswith("status: invalid_arguments")


@pytest.mark.hostile
def test_a_hostile_agent_sees_no_host_secret_and_its_fork_bomb_is_contained(
    jailed_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "plugs-langchain-secret-6f1d2a"
    monkeypatch.setenv("EXECBOX_PLUG_TEST_SECRET", secret)
    steal = (
        "import os, glob\nprint(dict(os.environ))\n"
        "for p in glob.glob('/proc/*/environ'):\n"
        "    try: print(p, open(p, 'rb').read())\n"
        "    except OSError as e: print(p, e)\n"
    )
    bomb = "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass\n"

    def turn(messages: list[BaseMessage]) -> AIMessage:
        n = len(tool_messages(messages))
        if n < 3:
            return call([steal, bomb, "print('still here')"][n], n)
        return AIMessage(content="done")

    limits = execbox.Limits(timeout_s=3, pids=24)
    agent = create_agent(
        ScriptedChatModel(turn=turn), tools=[ExecboxTool(jailed_backend, limits=limits)]
    )
    state = agent.invoke({"messages": [HumanMessage("Go.")]})
    stolen, bombed, after = tool_messages(state["messages"])
    assert stolen.artifact.ok and secret not in stolen.artifact.stdout + stolen.artifact.stderr
    assert secret not in str(stolen.content)
    assert bombed.artifact.status in (Status.timeout, Status.cpu_limit)
    assert str(bombed.content).startswith(f"status: {bombed.artifact.status.value}")
    assert "hint:" in str(bombed.content)
    assert after.artifact.ok and after.artifact.stdout == "still here\n"
