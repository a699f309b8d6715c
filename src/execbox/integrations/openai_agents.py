"""execbox as a sandbox of the OpenAI Agents SDK (`pip install 'execbox[openai-agents]'`).

    from agents import Runner
    from agents.run import RunConfig
    from agents.sandbox import SandboxAgent, SandboxRunConfig
    from execbox.integrations.openai_agents import ExecboxSandboxClient

    with execbox.Executor() as ex:       # or execbox.Client("http://host:8000", api_key)
        config = RunConfig(sandbox=SandboxRunConfig(client=ExecboxSandboxClient(ex)))
        result = await Runner.run(agent, "...", run_config=config)

One SDK sandbox session is one execbox session: its `/workspace` holds the manifest's files
and lasts as long as the SDK session. Commands (`exec`) run as processes in that session's
jail (bash and the usual tools are there), each inside the session's limits, policy-checked,
redacted and recorded as a cell. File reads and writes go through execbox's files API (links
never followed). Snapshots are a tar of the workspace made and unpacked inside the jail.

What the SDK can ask for and execbox cannot give fails with a clear error at creation or at
the call, never silently: a workspace root other than /workspace, users and groups (`run_as`,
`sudo -u`), remote mounts, host path grants, exposed ports and PTY (interactive) commands.
"""

from __future__ import annotations

import asyncio
import io
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Literal, Protocol, TypeVar

from agents.sandbox.errors import (
    ConfigurationError,
    ErrorCode,
    ExecTimeoutError,
    ExecTransportError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
    WorkspaceStartError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.session.sandbox_session import SandboxSession
from agents.sandbox.session.sandbox_session_state import SandboxSessionState
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, User
from pydantic import Field

from ..contract import Limits, RunResult, Status
from ..errors import ExecboxError, SessionClosed, UsageError

__all__ = [
    "ExecboxSandboxClient",
    "ExecboxSandboxClientOptions",
    "ExecboxSandboxSession",
    "ExecboxSandboxSessionState",
]

WORKSPACE = "/workspace"
BACKEND_ID = "execbox"
# What a command gets beyond its own timeout before the cell itself is interrupted.
CELL_MARGIN_S = 1.0
SNAPSHOT_NAME = ".execbox-snapshot.tar"
RESTORE_NAME = ".execbox-restore.tar"

T = TypeVar("T")


class _Files(Protocol):
    def write(self, path: str, data: bytes) -> Any: ...
    def read(self, path: str) -> bytes: ...
    def remove(self, path: str) -> None: ...


class _Box(Protocol):
    """What an execbox session offers here: `execbox.Session` and `execbox.client`'s
    `RemoteSession` both fit."""

    id: str
    files: _Files

    @property
    def closed(self) -> bool: ...
    def run(self, code: str, *, timeout_s: float | None = None) -> RunResult: ...
    def close(self) -> None: ...


class _Backend(Protocol):
    """`execbox.Executor` (in this process) or `execbox.Client` (a remote `execbox serve`)."""

    def session(self, **kwargs: Any) -> Any: ...
    def get_session(self, session_id: str) -> Any: ...


class ExecboxSandboxClientOptions(BaseSandboxClientOptions):
    """How each execbox session is opened: the same fields as `Executor.session`."""

    type: Literal["execbox"] = "execbox"
    profile: str = "data"
    """The policy profile every command is checked against; it must let code start processes."""
    environment: str | None = None
    """The execbox environment the session runs in (None: the default)."""
    limits: dict[str, Any] = Field(default_factory=dict)
    """`execbox.Limits` fields: memory, pids and disk for the session, time per command."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables every command sees (the manifest's environment is added to them)."""
    network: str | list[str] = "none"
    """The session's network: "none" or an allowlist of hosts, as for `Executor.session`."""
    default_exec_timeout_s: float = 30.0
    """A command's timeout when the SDK gives none (the SDK's None means no limit)."""


class ExecboxSandboxSessionState(SandboxSessionState):
    type: Literal["execbox"] = "execbox"
    execbox_session_id: str | None = None
    options: ExecboxSandboxClientOptions = Field(default_factory=ExecboxSandboxClientOptions)


def _unsupported(what: str, how: str = "") -> ConfigurationError:
    message = f"execbox sandbox: {what} is not supported" + (f" ({how})" if how else "")
    return ConfigurationError(
        message=message, error_code=ErrorCode.SANDBOX_CONFIG_INVALID, op="start", context={}
    )


def check_manifest(manifest: Manifest) -> None:
    """Refuse what an execbox session cannot hold, before any session is opened."""
    if manifest.root != WORKSPACE:
        raise _unsupported(f"workspace root {manifest.root!r}", f"execbox's is {WORKSPACE}")
    if manifest.users or manifest.groups:
        raise _unsupported("manifest users and groups", "every command runs as one uid")
    if manifest.extra_path_grants:
        raise _unsupported("extra path grants", "only the workspace is the session's")
    if list(manifest.mount_targets()):
        raise _unsupported("mounts", "the jail cannot mount; put the files in the manifest")


def exec_cell(argv: Sequence[str], timeout_s: float) -> str:
    """The cell that runs one command in the session's jail: its stdout and stderr are the
    cell's own (so execbox caps, redacts and records them), its exit status the cell's value.
    The command gets a process group of its own, killed whole on a timeout or interrupt."""
    return (
        "import os as _xo, signal as _xs, subprocess as _xp\n"
        f"_xq = _xp.Popen({list(argv)!r}, stdin=_xp.DEVNULL, start_new_session=True)\n"
        "try:\n"
        f"    _xr = _xq.wait({timeout_s!r})\n"
        "except BaseException:\n"
        "    _xo.killpg(_xq.pid, _xs.SIGKILL)\n"
        "    _xq.wait()\n"
        "    raise\n"
        "_xr\n"
    )


def relative(path: Path | str) -> str:
    """A workspace path as the files API takes it (relative to /workspace)."""
    p = PurePosixPath(str(path))
    if p.is_absolute():
        p = p.relative_to(WORKSPACE)
    return p.as_posix()


class ExecboxSandboxSession(BaseSandboxSession):
    """One execbox session as an SDK sandbox session."""

    state: ExecboxSandboxSessionState

    def __init__(
        self, state: ExecboxSandboxSessionState, backend: _Backend, box: _Box | None = None
    ) -> None:
        self.state = state
        self._backend = backend
        self._box = box
        # An execbox session does one thing at a time (a server answers 409 to a second call):
        # the SDK's concurrent manifest writes take turns.
        self._turn = asyncio.Lock()

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        async with self._turn:  # execbox's session API blocks: keep it off the event loop
            return await asyncio.to_thread(fn, *args, **kwargs)

    def _require_box(self) -> _Box:
        if self._box is None:
            raise ExecTransportError(command=(), message="the execbox session is not started")
        return self._box

    async def _ensure_backend_started(self) -> None:
        if self._box is not None:
            return
        opts = self.state.options
        env = {**opts.env, **await self.state.manifest.environment.resolve()}
        try:
            self._box = await self._call(
                self._backend.session,
                profile=opts.profile,
                environment=opts.environment,
                limits=Limits(**opts.limits),
                env=env,
                network=opts.network,
            )
        except ExecboxError as exc:
            raise WorkspaceStartError(
                path=Path(WORKSPACE), context={"reason": str(exc)}, cause=exc
            ) from exc
        assert self._box is not None
        self.state.execbox_session_id = self._box.id

    async def _shutdown_backend(self) -> None:
        box, self._box = self._box, None
        if box is not None:
            try:
                await self._call(box.close)
            except ExecboxError:  # already ended (expired, or ended by its code): nothing to free
                pass

    async def running(self) -> bool:
        box = self._box
        return box is not None and not await self._call(lambda: box.closed)

    async def _exec_internal(
        self, *command: str | Path, timeout: float | None = None
    ) -> ExecResult:
        argv = [str(c) for c in command]
        if len(argv) >= 4 and argv[0] == "sudo" and argv[1] == "-u" and argv[3] == "--":
            raise _unsupported(f"running a command as user {argv[2]!r}", "one uid runs them all")
        limit = timeout if timeout is not None else self.state.options.default_exec_timeout_s
        limit = max(limit, 0.1)
        box = self._require_box()
        try:
            result = await self._call(
                box.run, exec_cell(argv, limit), timeout_s=limit + CELL_MARGIN_S
            )
        except (SessionClosed, UsageError) as exc:
            raise ExecTransportError(command=argv, message=str(exc), cause=exc) from exc
        return exec_result(argv, limit, result)

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        self._refuse_user(user)
        target = self.normalize_path(path)
        box = self._require_box()
        try:
            data = await self._call(box.files.read, relative(target))
        except UsageError as exc:
            if missing(exc):
                raise WorkspaceReadNotFoundError(path=path, cause=exc) from exc
            raise WorkspaceArchiveReadError(
                path=path, context={"reason": str(exc)}, cause=exc
            ) from exc
        except SessionClosed as exc:
            raise WorkspaceArchiveReadError(
                path=path, context={"reason": str(exc)}, cause=exc
            ) from exc
        return io.BytesIO(data)

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        self._refuse_user(user)
        target = self.normalize_path(path, for_write=True)
        payload = data.read()
        blob = payload.encode() if isinstance(payload, str) else bytes(payload)
        box = self._require_box()
        try:
            await self._call(box.files.write, relative(target), blob)
        except (UsageError, SessionClosed) as exc:
            raise WorkspaceArchiveWriteError(
                path=path, context={"reason": str(exc)}, cause=exc
            ) from exc

    def _refuse_user(self, user: str | User | None) -> None:
        if user:
            name = user.name if isinstance(user, User) else user
            raise _unsupported(f"file access as user {name!r}", "one uid runs them all")

    async def persist_workspace(self) -> io.IOBase:
        """The workspace as a tar, made inside the jail and read through the files API."""
        # The workspace's entries, not ".": the workspace directory itself is not the
        # session's to chmod when the archive is unpacked.
        script = (
            f"find . -mindepth 1 -maxdepth 1 ! -name {SNAPSHOT_NAME} -printf '%P\\0' "
            f"| tar --null -T - -cf {SNAPSHOT_NAME}"
        )
        result = await self.exec("sh", "-c", script, shell=False)
        if not result.ok():
            raise WorkspaceArchiveReadError(
                path=Path(WORKSPACE),
                context={"reason": "tar failed", "stderr": result.stderr.decode(errors="replace")},
            )
        box = self._require_box()
        try:
            blob = await self._call(box.files.read, SNAPSHOT_NAME)
        finally:
            await self._call(box.files.remove, SNAPSHOT_NAME)
        return io.BytesIO(blob)

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        """Unpack a tar from `persist_workspace` into the workspace, inside the jail."""
        payload = data.read()
        box = self._require_box()
        await self._call(box.files.write, RESTORE_NAME, bytes(payload))
        result = await self.exec(
            "sh", "-c", f'tar -C {WORKSPACE} -xf "$1"; s=$?; rm -f "$1"; exit $s', "sh",
            RESTORE_NAME, shell=False,
        )  # fmt: skip
        if not result.ok():
            raise WorkspaceArchiveWriteError(
                path=Path(WORKSPACE),
                context={"reason": "tar failed", "stderr": result.stderr.decode(errors="replace")},
            )


def missing(exc: UsageError) -> bool:
    """Whether the files API said there is no such file (as opposed to not a regular file)."""
    text = str(exc).lower()
    return "no file " in text or "no such file" in text


def exec_result(argv: list[str], timeout_s: float, result: RunResult) -> ExecResult:
    """An exec cell's result as the SDK's: a timeout is `ExecTimeoutError`; a limit or a
    refusal is `ExecTransportError` with execbox's message (never a silent success)."""
    stdout = result.stdout.encode()
    stderr = result.stderr.encode()
    error = result.error
    if result.status in (Status.timeout, Status.cpu_limit) or (
        error is not None and error.type in ("TimeoutExpired", "KeyboardInterrupt")
    ):
        raise ExecTimeoutError(
            command=argv, timeout_s=timeout_s, context={"status": result.status.value}
        )
    if result.status is not Status.ok:
        message = error.message if error is not None else result.status.value
        raise ExecTransportError(
            command=argv,
            message=f"execbox {result.status.value}: {message}",
            context={"status": result.status.value, "run_id": result.run_id},
        )
    values = [o.data for o in result.outputs if o.mime_type == "text/plain"]
    try:
        exit_code = int(values[-1])
    except (IndexError, ValueError) as exc:
        raise ExecTransportError(
            command=argv, message="execbox: the command's exit status did not come back"
        ) from exc
    if exit_code < 0:  # killed by a signal: the shell's convention
        exit_code = 128 - exit_code
    return ExecResult(stdout=stdout, stderr=stderr, exit_code=exit_code)


class ExecboxSandboxClient(BaseSandboxClient[ExecboxSandboxClientOptions]):
    """The SDK's sandbox client over an `execbox.Executor` or an `execbox.Client`.

    `options` are the defaults of every session it creates; `RunConfig`'s
    `SandboxRunConfig(options=ExecboxSandboxClientOptions(...))` replaces them for a run."""

    backend_id = BACKEND_ID
    supports_default_options = True

    def __init__(self, backend: Any, options: ExecboxSandboxClientOptions | None = None) -> None:
        self._backend: _Backend = backend
        self._options = options or ExecboxSandboxClientOptions()

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: ExecboxSandboxClientOptions | None = None,
    ) -> SandboxSession:
        manifest = manifest if manifest is not None else Manifest()
        check_manifest(manifest)
        self._validate_manifest_for_create(manifest)
        session_id = uuid.uuid4()
        state = ExecboxSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            options=options or self._options,
        )
        return self._wrap_session(ExecboxSandboxSession(state, self._backend))

    async def delete(self, session: SandboxSession) -> SandboxSession:
        inner = session._inner
        if isinstance(inner, ExecboxSandboxSession):
            await inner._shutdown_backend()
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        if not isinstance(state, ExecboxSandboxSessionState):
            raise TypeError("ExecboxSandboxClient.resume expects an ExecboxSandboxSessionState")
        check_manifest(state.manifest)
        box = await asyncio.to_thread(self._reattach, state.execbox_session_id)
        inner = ExecboxSandboxSession(state, self._backend, box)
        # A live session kept its workspace; a new one is filled from the snapshot by start().
        inner._set_start_state_preserved(box is not None)
        return self._wrap_session(inner)

    def _reattach(self, session_id: str | None) -> _Box | None:
        if session_id is None:
            return None
        try:
            box: _Box = self._backend.get_session(session_id)
        except ExecboxError:
            return None
        return None if box.closed else box

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, ExecboxSandboxSessionState)
