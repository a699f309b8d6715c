"""smolagents' CodeAgent with execbox as its executor: a scripted model (smolagents' `Model`
seam) writes each step's code, which runs as a cell of one real execbox session, in this
process and through a real `execbox serve`."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.integrations.extras import example, requires

requires("smolagents")

from smolagents import CodeAgent, tool  # noqa: E402
from smolagents.models import ChatMessage, MessageRole, Model  # noqa: E402
from smolagents.utils import AgentError  # noqa: E402

import execbox  # noqa: E402
from execbox.integrations.smolagents import ExecboxExecutor  # noqa: E402

pytestmark = pytest.mark.integrations


class ScriptedModel(Model):
    """Answers each step with the next scripted code, and keeps what it was shown."""

    def __init__(self, *codes: str) -> None:
        super().__init__(model_id="scripted")
        self.codes = list(codes)
        self.prompts: list[str] = []

    def generate(self, messages: list[Any], *args: Any, **kwargs: Any) -> ChatMessage:
        self.prompts.append(str(messages))
        code = self.codes.pop(0)
        return ChatMessage(
            role=MessageRole.ASSISTANT, content=f"Thought: go\n<code>\n{code}\n</code>"
        )


@tool  # type: ignore[untyped-decorator]
def double(x: int) -> int:
    """Doubles a number.

    Args:
        x: the number to double
    """
    return 2 * x


def test_a_code_agents_steps_share_one_execbox_session(backend: Any) -> None:
    model = ScriptedModel(
        "import os\ny = double(21)\nprint('y is', y, 'in', os.getcwd(), os.getuid())",
        "1 / 0",
        "final_answer({'y': y, 'big': 'z' * 20000})",  # past execbox's 16 KiB error message
    )
    with CodeAgent(tools=[double], model=model, executor=ExecboxExecutor(backend)) as agent:
        answer = agent.run("compute")
        steps = agent.memory.steps[1:]
    assert answer == {"y": 42, "big": "z" * 20000}
    assert "y is 42 in /workspace" in str(steps[0].observations)  # the tool ran in the jail
    assert not str(steps[0].observations).rstrip().endswith(" 0")  # not as root
    # The error came back to the model in smolagents' shape, and the session went on.
    assert "ZeroDivisionError" in str(steps[1].error)
    assert "ZeroDivisionError: division by zero" in model.prompts[2]


def test_cleanup_ends_the_execbox_session(executor: execbox.Executor) -> None:
    before = {s.id for s in executor.live_sessions()}
    runner = ExecboxExecutor(executor)
    assert runner.session.id in {s.id for s in executor.live_sessions()}
    runner.cleanup()
    runner.cleanup()  # twice is harmless
    assert {s.id for s in executor.live_sessions()} == before


def test_a_step_past_its_time_is_stopped_and_the_session_goes_on(
    executor: execbox.Executor,
) -> None:
    model = ScriptedModel("y = 7", "while True:\n    pass", "final_answer(y)")
    runner = ExecboxExecutor(executor, limits={"timeout_s": 1})
    with CodeAgent(tools=[], model=model, executor=runner) as agent:
        assert agent.run("go") == 7
        spun = agent.memory.steps[2]
    assert "KeyboardInterrupt" in str(spun.error) and "interrupted" in str(spun.error)


def test_modules_missing_from_the_environment_are_named(executor: execbox.Executor) -> None:
    with pytest.raises(AgentError, match="no_such_module_36a") as info:
        ExecboxExecutor(executor, additional_imports=["numpy", "no_such_module_36a.sub"])
    assert "numpy" not in str(info.value).split("environment:")[1].split(";")[0]
    ExecboxExecutor(executor, additional_imports=["numpy", "pandas.*"]).cleanup()


def test_smolagents_example_runs_with_execbox_swapped_in(backend: Any) -> None:
    module = example("smolagents_executor")
    model = ScriptedModel(
        "a, b = 0, 1\nfor _ in range(100):\n    a, b = b, a + b\nprint(a)",
        "final_answer(a)",
    )
    assert module.main(model, module.QUESTION, backend) == 354224848179261915075


SECRET = "plugs36a-smol-secret-9f8e7d"


@pytest.mark.hostile
def test_a_hostile_step_cannot_read_the_hosts_environment(
    jailed: execbox.Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLUGS36A_SECRET", SECRET)
    assert os.environ["PLUGS36A_SECRET"] == SECRET
    code = (
        "import glob, os\nseen = [repr(dict(os.environ))]\n"
        "for p in glob.glob('/proc/*/environ'):\n"
        "    try:\n        seen.append(open(p, 'rb').read().decode(errors='replace'))\n"
        "    except OSError:\n        pass\n"
        "final_answer(f'scanned {len(seen)} ' + '\\n'.join(seen))"
    )
    with CodeAgent(tools=[], model=ScriptedModel(code), executor=ExecboxExecutor(jailed)) as agent:
        answer = agent.run("look")
    assert isinstance(answer, str) and answer.startswith("scanned") and SECRET not in answer


@pytest.mark.hostile
def test_a_fork_bomb_step_is_contained_and_reported(jailed: execbox.Executor) -> None:
    bomb = "import os\nwhile True:\n    os.fork()"
    model = ScriptedModel(bomb, "final_answer('after')")
    runner = ExecboxExecutor(jailed, limits={"pids": 32, "timeout_s": 5})
    with CodeAgent(tools=[], model=model, executor=runner, max_steps=3) as agent:
        answer = agent.run("go")
        error = str(agent.memory.steps[1].error)
    assert "BlockingIOError" in error or "TimeoutError" in error, error
    assert answer == "after"  # the session went on after it
    assert jailed.run("print(1)").stdout == "1\n"  # the host's executor is untouched
