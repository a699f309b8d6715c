"""execbox as a LangChain tool (`ExecboxTool`) and a toolkit with a session of its own
(`ExecboxSessionToolkit`): `pip install 'execbox[langchain]'`.

    from langchain.agents import create_agent
    from execbox.integrations.langchain import ExecboxTool

    with execbox.Executor() as ex:          # or execbox.Client(url, key): the same tool
        agent = create_agent(model, tools=[ExecboxTool(ex, limits=execbox.Limits(timeout_s=10))])

The tool's input schema and description are `execbox.tools`' (what the model may set: code,
stdin, input files, a wall time within the profile's maximum); limits, profile, environment and
network are the application's, fixed here. A call answers with a `ToolMessage` whose content is
the compact observation (`execbox.tools.format_observation`) and whose `artifact` is the
`RunResult`. What the code did, failures included, is the observation the model reads;
arguments the model got wrong are a `ToolMessage` with `status="error"` saying what to fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import ConfigDict, PrivateAttr

from ..contract import Limits, RunResult
from ..tools import MAX_OUTPUT_CHARS
from .runner import Backend, CodeTool, SessionOwner

try:
    from langchain_core.callbacks import CallbackManagerForToolRun
    from langchain_core.tools import BaseTool, BaseToolkit, ToolException
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "execbox.integrations.langchain needs langchain-core: pip install 'execbox[langchain]'"
    ) from exc

__all__ = ["ExecboxSessionToolkit", "ExecboxTool"]


class ExecboxTool(BaseTool):
    """Runs the model's code in execbox: a fresh sandbox per call (or, made by
    `ExecboxSessionToolkit`, the cells of one session).

    `executor`: an `execbox.Executor` or an `execbox.Client`. `limits`, `profile`, `network`
    (hosts runs may reach; None: no network), `environment` and `language` ("python",
    "javascript" or "bash") bound every run, whatever the model asks; the description tells
    the model what they are. `name` defaults to `execbox.tools.TOOL_NAMES[language]`.
    `code_tool`: a ready `CodeTool` instead of those settings (the toolkit passes its own);
    other keyword arguments are `BaseTool`'s.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"
    handle_tool_error: bool | str | None = True
    _code: CodeTool = PrivateAttr()

    def __init__(
        self,
        executor: Backend,
        *,
        limits: Limits | None = None,
        profile: str = "data",
        network: Sequence[str] | None = None,
        environment: str | None = None,
        language: str = "python",
        name: str | None = None,
        max_output_chars: int = MAX_OUTPUT_CHARS,
        code_tool: CodeTool | None = None,
        **kwargs: Any,
    ) -> None:
        code = code_tool or CodeTool(
            executor,
            limits=limits,
            profile=profile,
            network=network,
            environment=environment,
            language=language,
            name=name,
            max_output_chars=max_output_chars,
        )
        super().__init__(
            name=code.name, description=code.description, args_schema=code.parameters, **kwargs
        )
        self._code = code

    @property
    def code_tool(self) -> CodeTool:
        """The framework-free tool underneath (its schema, description and session)."""
        return self._code

    def _run(
        self, run_manager: CallbackManagerForToolRun | None = None, **arguments: Any
    ) -> tuple[str, RunResult]:
        outcome = self._code.call(arguments)
        if outcome.result is None:  # nothing ran: the model's call was wrong
            raise ToolException(outcome.observation)
        return outcome.observation, outcome.result


class ExecboxSessionToolkit(SessionOwner, BaseToolkit):
    """A `run_python` tool whose calls are cells of one execbox session: variables, imports
    and files persist from call to call. The session opens at the first call and ends with
    `close()` (or the `with` block); when code ends it (out of memory, a forbidden call), the
    next call starts a new one and tells the model its earlier state is gone.

    `executor`, `limits`, `profile`, `network`, `environment`: as for `ExecboxTool` (limits:
    memory, pids and disk for the whole session, wall and CPU time per call). `env`: variables
    the session's interpreter sees; `files`: workspace files it starts with.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    tool: ExecboxTool

    def __init__(
        self,
        executor: Backend,
        *,
        limits: Limits | None = None,
        profile: str = "data",
        network: Sequence[str] | None = None,
        environment: str | None = None,
        env: Mapping[str, str] | None = None,
        files: Mapping[str, bytes] | None = None,
        idle_timeout_s: float = 600.0,
        name: str | None = None,
        max_output_chars: int = MAX_OUTPUT_CHARS,
    ) -> None:
        code = CodeTool(
            executor,
            limits=limits,
            profile=profile,
            network=network,
            environment=environment,
            stateful=True,
            name=name,
            max_output_chars=max_output_chars,
            env=env,
            files=files,
            idle_timeout_s=idle_timeout_s,
        )
        super().__init__(tool=ExecboxTool(executor, code_tool=code))

    def get_tools(self) -> list[BaseTool]:
        return [self.tool]

    def _session_tool(self) -> CodeTool:
        return self.tool.code_tool
