"""execbox as smolagents' code executor (`pip install 'execbox[smolagents]'`).

    from smolagents import CodeAgent
    from execbox.integrations.smolagents import ExecboxExecutor

    with execbox.Executor() as ex:       # or execbox.Client("http://host:8000", api_key)
        agent = CodeAgent(tools=[...], model=model, executor=ExecboxExecutor(ex))
        agent.run("...")
        agent.cleanup()                  # closes the execbox session

Each agent's steps run as cells of ONE execbox session (IPython semantics), so variables,
imports and files carry from step to step, as with smolagents' E2B executor. The protocol is
smolagents' own (`RemotePythonExecutor`): the tools' source is sent as a cell, the agent's
variables through its safe serializer, and `final_answer` raises `FinalAnswerException`,
whose value comes back as the cell's error and ends the run. An exception in a step comes
back to the model as an `AgentError` with execbox's error type, message and traceback.
smolagents' `executor_type` is a closed list, so the executor is passed as `executor=`.

Nothing is installed at run time: `additional_imports` and tools' requirements must be in the
session's execbox environment (`execbox env build`), or the executor says which are missing.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterable
from typing import Any

import PIL.Image
from smolagents.local_python_executor import CodeOutput
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.remote_executors import RemotePythonExecutor
from smolagents.utils import AgentError

from ..contract import Limits, Output, RunResult, Status
from ..errors import ExecboxError, SessionClosed

__all__ = ["ExecboxExecutor"]

FINAL_ANSWER = "FinalAnswerException"
CUT_TAIL = " …(truncated)"  # how execbox marks an error message cut at its cap
FINAL_MIME = "text/x-execbox-final-answer"
# Shows the final answer's whole value when its error message was cut: IPython keeps the
# cell's exception as sys.last_value.
FETCH_FINAL = (
    "import sys as _xs\n"
    "from IPython.display import display as _xd\n"
    f"_xd({{{FINAL_MIME!r}: str(_xs.last_value.value)}}, raw=True)\n"
)
# A name is there as a module (smolagents' imports) or as a distribution (tools' requirements,
# pip names such as "pillow").
MISSING_CELL = (
    "import importlib.metadata as _xm, importlib.util as _xu\n"
    "def _xhas(n):\n"
    "    try:\n"
    "        return _xu.find_spec(n) is not None or bool(_xm.version(n))\n"
    "    except (ImportError, ValueError):\n"
    "        return False\n"
    "[_m for _m in {names!r} if not _xhas(_m)]\n"
)


class ExecboxExecutor(RemotePythonExecutor):
    """A smolagents `PythonExecutor` whose code runs in one execbox session.

    `backend` is an `execbox.Executor` or an `execbox.Client`; the other arguments are the
    session's (`Executor.session`): `limits` hold for the whole session (memory, pids, disk)
    and per step (`timeout_s`, `cpu_s`)."""

    def __init__(
        self,
        backend: Any,
        additional_imports: Iterable[str] = (),
        logger: AgentLogger | None = None,
        *,
        allow_pickle: bool = False,
        profile: str = "data",
        environment: str | None = None,
        limits: Limits | dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        network: str | list[str] = "none",
    ) -> None:
        super().__init__(
            list(additional_imports), logger or AgentLogger(LogLevel.OFF), allow_pickle
        )
        self.session = backend.session(
            profile=profile,
            environment=environment,
            limits=limits,
            env=env or {},
            network=network,
        )
        self.installed_packages = self.install_packages(self.additional_imports)

    def _run(self, code: str) -> RunResult:
        try:
            result: RunResult = self.session.run(code)
        except SessionClosed as exc:
            raise AgentError(f"The execbox session has ended: {exc}", self.logger) from exc
        return result

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        """Run one step's code as a cell; its stdout is the step's logs."""
        result = self._run(code)
        logs = result.stdout
        error = result.error
        if error is not None and error.type == FINAL_ANSWER and result.status is Status.error:
            value = error.message
            if value.endswith(CUT_TAIL):
                value = self._whole_final_answer()
            answer = self._deserialize_final_answer(value, self.allow_pickle)
            return CodeOutput(output=answer, logs=logs, is_final_answer=True)
        if error is not None or result.status is not Status.ok:
            kind = error.type if error is not None else result.status.value
            message = error.message if error is not None else ""
            trace = (error.traceback or "") if error is not None else ""
            raise AgentError(
                f"{logs}\nExecuting code yielded an error:\n{kind}\n{message}\n{trace}",
                self.logger,
            )
        return CodeOutput(output=main_output(result.outputs), logs=logs, is_final_answer=False)

    def _whole_final_answer(self) -> str:
        result = self._run(FETCH_FINAL)
        for output in result.outputs:
            if output.mime_type == FINAL_MIME:
                return output.data
        raise AgentError("The final answer's value could not be read back", self.logger)

    def install_packages(self, additional_imports: list[str]) -> list[str]:
        """Install nothing (execbox never downloads at run time): check that each module is
        in the session's environment, and say which are not."""
        names = sorted({n.split(".")[0] for n in additional_imports if n.split(".")[0] != "*"})
        if not names:
            return list(additional_imports)
        result = self._run(MISSING_CELL.format(names=names))
        texts = [o.data for o in result.outputs if o.mime_type == "text/plain"]
        missing = texts[-1] if texts else repr(names)
        if result.status is not Status.ok or missing != "[]":
            raise AgentError(
                f"These modules are not in the execbox environment: {missing}; execbox "
                "installs nothing at run time: build an environment that has them "
                "(execbox env build NAME -r requirements.txt) and pass environment=NAME",
                self.logger,
            )
        return list(additional_imports)

    def cleanup(self) -> None:
        """End the execbox session (its processes and workspace go with it)."""
        try:
            self.session.close()
        except ExecboxError:  # already ended
            pass

    def __enter__(self) -> ExecboxExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def main_output(outputs: list[Output]) -> Any:
    """The step's value as smolagents' remote executors give it: the last text, else the last
    image as a PIL image, else None."""
    texts = [o.data for o in outputs if o.mime_type == "text/plain"]
    if texts:
        return texts[-1]
    images = [o.data for o in outputs if o.mime_type == "image/png"]
    if images:
        return PIL.Image.open(io.BytesIO(base64.b64decode(images[-1])))
    return None
