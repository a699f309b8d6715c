"""What every framework plug shares: one execbox tool, as the model sees it (name, description,
JSON schema) and as it runs (a fresh sandbox per call, or the cells of one session it owns).

The settings that bound a run (limits, profile, environment, network) are the application's,
fixed when the tool is made; the model chooses only the code, its stdin and input files, and a
wall time within the profile's maximum. Framework-free: each plug adapts this to its framework.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, Self

from ..contract import Limits
from ..errors import ExecboxError, SessionClosed, UsageError
from ..tools import (
    MAX_OUTPUT_CHARS,
    TOOL_NAMES,
    Runner,
    SessionLike,
    ToolCallOutcome,
    check_language,
    describe_environment,
    describe_language,
    parameters_schema,
    perform_tool_call,
)

__all__ = ["Backend", "CodeTool", "ClosableSession", "SessionOwner"]


class ClosableSession(SessionLike, Protocol):
    """A `Session` or a `RemoteSession`, as far as a tool uses one."""

    id: str

    def close(self) -> None: ...


class Backend(Runner, Protocol):
    """An `execbox.Executor` or an `execbox.Client`: fresh runs and sessions."""

    def session(
        self,
        *,
        profile: str = ...,
        environment: str | None = ...,
        limits: Limits | Mapping[str, Any] | None = ...,
        env: Mapping[str, str] | None = ...,
        files: Mapping[str, bytes] | None = ...,
        idle_timeout_s: float = ...,
        network: str | Sequence[str] = ...,
    ) -> Any: ...


class CodeTool:
    """One execbox tool for a model: `call` runs its arguments and returns the observation
    with the `RunResult` (`execbox.tools.perform_tool_call`).

    `stateful=False`: each call is a fresh sandbox. `stateful=True`: the calls are cells of one
    Python session that this tool opens at its first call and ends with `close()`; when code
    ends the session (out of memory, a forbidden call), the next call starts a new one and its
    observation says that the earlier state is gone. Thread-safe: calls run one at a time
    in a session, side by side otherwise.
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
        stateful: bool = False,
        name: str | None = None,
        max_output_chars: int = MAX_OUTPUT_CHARS,
        env: Mapping[str, str] | None = None,
        files: Mapping[str, bytes] | None = None,
        idle_timeout_s: float = 600.0,
    ) -> None:
        self.executor = executor
        self.limits = limits
        self.profile = profile
        self.network = list(network) if network else None
        self.environment = environment
        self.language = check_language(language)
        self.stateful = stateful
        self.name = name or TOOL_NAMES[language]
        self.max_output_chars = max_output_chars
        # Only a session takes these: a fresh run's inputs are the model's `files` alone.
        self._session_options: dict[str, Any] = {
            "env": dict(env or {}),
            "files": dict(files or {}),
            "idle_timeout_s": idle_timeout_s,
        }
        if not stateful and (env or files):
            raise UsageError("env and files are for a stateful tool's session")
        self.parameters = parameters_schema(
            limits, profile=profile, stateful=stateful, language=language
        )
        self.description = (
            describe_environment(
                limits,
                profile=profile,
                stateful=stateful,
                network=self.network,
                environment=environment,
            )
            if language == "python"
            else describe_language(
                language,
                profile=profile,
                limits=limits,
                timeout_arg="timeout_s",
                network=self.network,
                environment=environment,
            )
        )
        self._lock = threading.Lock()
        self._session: ClosableSession | None = None
        self._closed = False

    @property
    def session(self) -> ClosableSession | None:
        """The session the calls run in (None before the first call and after `close`)."""
        return self._session

    def call(self, arguments: Any) -> ToolCallOutcome:
        """Run the model's arguments (a dict, a JSON string, or a vendor's tool call)."""
        if not self.stateful:
            return self._perform(arguments, None)
        with self._lock:
            if self._closed:
                raise SessionClosed(f"the {self.name} tool is closed")
            if self._session is None:
                self._session = self._open()
            try:
                return self._perform(arguments, self._session)
            except SessionClosed as exc:  # the code ended it: go on in a new one, and say so
                _end(self._session)
                self._session = self._open()
                outcome = self._perform(arguments, self._session)
                note = (
                    f"note: {exc}; this code ran in a new session, so variables and files "
                    "from earlier calls are gone.\n"
                )
                return ToolCallOutcome(note + outcome.observation, outcome.result)

    def close(self) -> None:
        """End the session (if one was opened); later calls raise SessionClosed."""
        with self._lock:
            self._closed = True
            session, self._session = self._session, None
        if session is not None:
            _end(session)

    def _open(self) -> ClosableSession:
        session: ClosableSession = self.executor.session(
            profile=self.profile,
            environment=self.environment,
            limits=self.limits,
            network=self.network or "none",
            **self._session_options,
        )
        return session

    def _perform(self, arguments: Any, session: SessionLike | None) -> ToolCallOutcome:
        return perform_tool_call(
            self.executor,
            arguments,
            limits=self.limits,
            profile=self.profile,
            name=self.name,
            session=session,
            max_output_chars=self.max_output_chars,
            network=self.network,
            environment=self.environment,
            language=self.language,
        )


def _end(session: ClosableSession) -> None:
    try:
        session.close()
    except ExecboxError:  # already over (a server may have forgotten it): nothing to end
        pass


class SessionOwner:
    """The session calls of a plug whose tool keeps one session (`_session_tool`): the
    session, `close`, and the `with` block."""

    def _session_tool(self) -> CodeTool:
        raise NotImplementedError

    @property
    def session(self) -> ClosableSession | None:
        """The session the calls run in (None before the first call and after `close`)."""
        return self._session_tool().session

    def close(self) -> None:
        """End the session; later calls raise `execbox.SessionClosed`."""
        self._session_tool().close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
