"""execbox as a pydantic-ai toolset (`ExecboxToolset`), and one whose calls are the cells of a
session of its own (`ExecboxSessionToolset`): `pip install 'execbox[pydantic-ai]'`.

    from pydantic_ai import Agent
    from execbox.integrations.pydantic_ai import ExecboxToolset

    with execbox.Executor() as ex:          # or execbox.Client(url, key): the same toolset
        agent = Agent("openai:gpt-4.1", toolsets=[ExecboxToolset(ex)])

The tool's JSON schema and description are `execbox.tools`' (what the model may set: code,
stdin, input files, a wall time within the profile's maximum); limits, profile, environment and
network are the application's, fixed here. What the code did, failures included, is the tool's
return (the compact observation), with the `RunResult` as the `ToolReturn`'s metadata for the
application. Arguments the model got wrong go back through pydantic-ai's retry (a retry prompt
saying what to fix, counted against the tool's `max_retries`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import anyio.to_thread

from ..contract import Limits
from ..tools import MAX_OUTPUT_CHARS, RunPython
from .runner import Backend, CodeTool, SessionOwner

try:
    from pydantic_ai import ModelRetry, RunContext, ToolDefinition, ToolReturn
    from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "execbox.integrations.pydantic_ai needs pydantic-ai: pip install 'execbox[pydantic-ai]'"
    ) from exc

__all__ = ["ExecboxSessionToolset", "ExecboxToolset"]


class _Arguments:
    """The tool's arguments checked against `RunPython` (the schema the model was given), as
    pydantic-ai's validator protocol asks: a ValidationError becomes its retry prompt."""

    def validate_json(self, input: str | bytes | bytearray, **_: Any) -> dict[str, Any]:
        return RunPython.model_validate_json(input).model_dump(exclude_unset=True)

    def validate_python(self, input: Any, **_: Any) -> dict[str, Any]:
        return RunPython.model_validate(input).model_dump(exclude_unset=True)


_ARGUMENTS = _Arguments()


class ExecboxToolset(AbstractToolset[Any]):
    """One tool, `run_python` (or the tool of `language`), that runs the model's code in a
    fresh execbox sandbox per call.

    `executor`: an `execbox.Executor` or an `execbox.Client`. `limits`, `profile`, `network`
    (hosts runs may reach; None: no network), `environment` and `language` ("python",
    "javascript" or "bash") bound every run, whatever the model asks; the description tells
    the model what they are. `max_retries`: how many calls with wrong arguments the model may
    make in a row before the agent run fails. `id`: the toolset's id (for durable execution).
    `code_tool`: a ready `CodeTool` instead of those settings (the session toolset's own).
    """

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
        max_retries: int = 2,
        id: str | None = None,
        code_tool: CodeTool | None = None,
    ) -> None:
        self._code = code_tool or CodeTool(
            executor,
            limits=limits,
            profile=profile,
            network=network,
            environment=environment,
            language=language,
            name=name,
            max_output_chars=max_output_chars,
        )
        self._max_retries = max_retries
        self._id = id
        self._definition = ToolDefinition(
            name=self._code.name,
            description=self._code.description,
            parameters_json_schema=self._code.parameters,
        )

    @property
    def id(self) -> str | None:
        return self._id

    @property
    def code_tool(self) -> CodeTool:
        """The framework-free tool underneath (its schema, description and session)."""
        return self._code

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        return {
            self._code.name: ToolsetTool(
                toolset=self,
                tool_def=self._definition,
                max_retries=self._max_retries,
                args_validator=_ARGUMENTS,
            )
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> ToolReturn:
        # A run blocks for as long as the code runs: off the event loop, as pydantic-ai runs
        # a plain function tool.
        outcome = await anyio.to_thread.run_sync(self._code.call, tool_args)
        if outcome.result is None:  # nothing ran: the model's call was wrong
            raise ModelRetry(outcome.observation)
        return ToolReturn(return_value=outcome.observation, metadata=outcome.result)


class ExecboxSessionToolset(SessionOwner, ExecboxToolset):
    """`run_python` whose calls are cells of one execbox session: variables, imports and files
    persist from call to call, and across agent runs that share this toolset. The session
    opens at the first call and ends with `close()` (or the `with` block); when code ends it
    (out of memory, a forbidden call), the next call starts a new one and tells the model its
    earlier state is gone.

    Arguments as for `ExecboxToolset` (limits: memory, pids and disk for the whole session,
    wall and CPU time per call); `env`: variables the session's interpreter sees; `files`:
    workspace files it starts with.
    """

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
        max_retries: int = 2,
        id: str | None = None,
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
        super().__init__(executor, max_retries=max_retries, id=id, code_tool=code)

    def _session_tool(self) -> CodeTool:
        return self._code
