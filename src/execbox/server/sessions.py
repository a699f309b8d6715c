"/v1/sessions: stateful interpreters, their cells and files. A tenant reaches only its own."

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Path, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.background import BackgroundTask

from ..contract import (
    ENVIRONMENT_NAME,
    Artifact,
    InputFile,
    Limits,
    NetworkConnection,
    RunResult,
    Secrets,
)
from . import sse
from .deps import Caller, State
from .errors import ApiError, documented
from .spool import Reservation, result_bound

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])
DOWNLOAD_CHUNK = 1 << 20
SessionId = Annotated[str, Path(max_length=64, description="The session's id.")]
CELL_ERRORS = documented(400, 401, 404, 409, 413, 422, 429, 500, 503)
FILE_ERRORS = documented(400, 401, 404, 409, 413, 422, 429, 503)


class SessionBody(BaseModel):
    """A new session: a stateful interpreter with its own workspace."""

    model_config = ConfigDict(extra="forbid")

    language: Literal["python", "javascript"] = Field(
        "python",
        description="The language of every cell: python (IPython) or javascript (Node; "
        "top-level let/const persist across cells, top-level await works).",
    )
    profile: str = Field("data", description="Policy profile checked before each cell.")
    environment: str | None = Field(
        None,
        pattern=ENVIRONMENT_NAME,
        description="The environment every cell runs in (null: the server's default).",
    )
    limits: Limits | None = Field(None, description="Limits of each cell (null: defaults).")
    env: dict[str, str] = Field(default_factory=dict, description="Environment of the kernel.")
    files: list[InputFile] = Field(
        default_factory=list, description="Files placed in the workspace at the start."
    )
    idle_timeout_s: float = Field(
        600.0,
        gt=0,
        le=86400,
        description="End the session after this long without a call "
        "(at most the server's policy, by default 1 h).",
    )
    max_lifetime_s: float = Field(
        3600.0,
        gt=0,
        le=7 * 86400,
        description="End the session this long after it started (at "
        "most the server's policy, by default 24 h).",
    )
    secrets: Secrets = Field(default_factory=list)
    network: Literal["none"] | list[str] = Field(
        "none",
        description="The session's network for its whole life: 'none', or an allowlist as a "
        "run's `network` (each cell's result logs what it asked for).",
    )


class SessionInfo(BaseModel):
    session_id: str = Field(description="Id for the session's other endpoints.")
    closed: bool = Field(description="True once the session has ended.")
    end_reason: str | None = Field(None, description="Why the session ended, once it has.")
    network_log_after_cells: list[NetworkConnection] = Field(
        default_factory=list,
        description="Once ended: what the session's network served after its last cell (a "
        "process left running); each cell's own `network_log` holds what came before it.",
    )


class CellBody(BaseModel):
    """Code to run in the session's interpreter."""

    model_config = ConfigDict(extra="forbid")

    code: str = Field(description="The cell's code.")
    timeout_s: float | None = Field(
        None, gt=0, le=3600, description="Wall time of this cell (null: session's)."
    )
    secrets: Secrets = Field(default_factory=list)


def _info(session: Any) -> SessionInfo:
    return SessionInfo(
        session_id=session.id,
        closed=session.closed,
        end_reason=session.end_reason,
        network_log_after_cells=session.network_log_after_cells,
    )


def _within_policy(state: State, body: SessionBody) -> None:
    """The server caps how long sessions may idle and live: a session holds one of its
    `--max-sessions` places for as long as it is open."""
    for name, asked, most, option in (
        (
            "idle_timeout_s",
            body.idle_timeout_s,
            state.settings.max_session_idle_s,
            "--max-session-idle",
        ),
        (
            "max_lifetime_s",
            body.max_lifetime_s,
            state.settings.max_session_lifetime_s,
            "--max-session-lifetime",
        ),
    ):
        if asked > most:
            raise ApiError(
                422,
                "session_policy",
                f"{name} is {asked:g} s; this server allows at most {most:g} s "
                f"(execbox serve {option})",
            )


@router.post(
    "",
    response_model=SessionInfo,
    status_code=201,
    responses=documented(400, 401, 413, 422, 429, 503),
    summary="Start a session",
)
async def create_session(body: SessionBody, state: State, tenant: Caller) -> SessionInfo:
    executor = state.executor
    _within_policy(state, body)
    release = state.quotas.hold(tenant)
    try:
        state.sessions.reserve(tenant, await state.blocking(state.shares))
        session = None
        try:
            session = await state.running(
                lambda: executor.session(
                    language=body.language,
                    profile=body.profile,
                    environment=body.environment,
                    limits=body.limits,
                    env=body.env or None,
                    files={f.name: f.data for f in body.files} or None,
                    idle_timeout_s=body.idle_timeout_s,
                    max_lifetime_s=body.max_lifetime_s,
                    secrets=body.secrets,
                    tenant=tenant.name,
                    network=body.network,
                )
            )
        finally:
            state.sessions.add(tenant, session)
    finally:
        release()
    return _info(session)


@router.get(
    "/{session_id}",
    response_model=SessionInfo,
    responses=documented(401, 404, 422),
    summary="A session's state",
)
async def get_session(session_id: SessionId, state: State, tenant: Caller) -> SessionInfo:
    return _info(state.sessions.get(tenant, session_id))


@router.delete(
    "/{session_id}",
    response_model=SessionInfo,
    responses=documented(401, 404, 422, 429),
    summary="Close a session",
)
async def close_session(session_id: SessionId, state: State, tenant: Caller) -> SessionInfo:
    session = state.sessions.get(tenant, session_id)
    release = state.quotas.hold(tenant)
    try:
        # A cell still running is cut short at once, so this waits for no one.
        await state.blocking(session.close)
    finally:
        release()
    return _info(session)


def _admit(state: State, tenant: Caller, nbytes: int) -> tuple[Reservation, Callable[[], None]]:
    """One of the key's requests in flight and `nbytes` of the result budget, or the refusal
    of either (raised, nothing held); with the function that gives both back, once."""
    release_quota = state.quotas.hold(tenant)
    try:
        reservation = state.results.reserve(nbytes, tenant.name)
    except BaseException:
        release_quota()
        raise

    def release() -> None:
        release_quota()
        reservation.release()

    return reservation, release


def _cell(
    state: State, tenant: Caller, session_id: str, body: CellBody
) -> tuple[sse.Call, Callable[[], None]]:
    """The cell's call, admitted (quota and result bytes: its outputs and artifacts are held
    in memory), and the function that gives both back (call it once the cell has ended)."""
    session = state.sessions.get(tenant, session_id)
    limits = getattr(session, "limits", None)  # an ended session has none: its call fails
    _, release = _admit(state, tenant, result_bound(limits) if limits else 0)

    def call(
        on_stdout: sse.OutputCallback | None = None, on_stderr: sse.OutputCallback | None = None
    ) -> RunResult:
        started = time.perf_counter()
        result: RunResult = session.run(
            body.code,
            timeout_s=body.timeout_s,
            secrets=body.secrets,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
        )
        state.finish("cell", tenant, result, started)
        return result

    return call, release


@router.post(
    "/{session_id}/cells",
    response_model=RunResult,
    responses=CELL_ERRORS,
    summary="Run a cell in the session",
)
async def run_cell(session_id: SessionId, body: CellBody, state: State, tenant: Caller) -> Response:
    call, release = _cell(state, tenant, session_id, body)
    try:
        result = await state.on_session(session_id, lambda: call(None, None), cell=True)
    finally:
        release()
    return Response(sse.result_json(result), media_type="application/json")


@router.post(
    "/{session_id}/cells/stream",
    responses={**CELL_ERRORS, 200: sse.RESPONSE},
    response_class=StreamingResponse,
    summary="Run a cell and stream its output as server-sent events, ending with the result",
)
async def stream_cell(
    session_id: SessionId, body: CellBody, state: State, tenant: Caller
) -> StreamingResponse:
    call, release = _cell(state, tenant, session_id, body)
    # The quota token and result bytes go back once the cell is over and its stream has
    # ended (sent, or the client gone), whichever comes last.
    ends = [False, False]

    def end(which: int) -> None:
        ends[which] = True
        if all(ends):
            release()

    async def in_thread(fn: Callable[[], RunResult]) -> RunResult:
        try:
            return await state.on_session(session_id, fn, cell=True)
        finally:
            end(0)

    async def response_ended() -> None:
        end(1)

    try:
        feed = sse.Feed(call, in_thread, state.settings.stream_buffer_bytes, state.streams)
    except BaseException:
        release()
        raise
    return sse.EventStream(feed, response_ended)


@router.get(
    "/{session_id}/files",
    response_model=list[Artifact],
    responses=FILE_ERRORS,
    summary="Files in the session's workspace",
)
async def list_files(session_id: SessionId, state: State, tenant: Caller) -> list[Artifact]:
    session = state.sessions.get(tenant, session_id)
    release = state.quotas.hold(tenant)
    try:
        files: list[Artifact] = await state.on_session(session_id, session.files.list, cell=False)
    finally:
        release()
    return files


@router.put(
    "/{session_id}/files/{path:path}",
    response_model=Artifact,
    responses=FILE_ERRORS,
    summary="Write a file into the session's workspace (the raw request body)",
)
async def write_file(
    session_id: SessionId,
    path: str,
    state: State,
    tenant: Caller,
    data: Annotated[bytes, Body(media_type="application/octet-stream")],
) -> Artifact:
    session = state.sessions.get(tenant, session_id)
    release = state.quotas.hold(tenant)
    try:
        artifact: Artifact = await state.on_session(
            session_id, lambda: session.files.write(path, data), cell=False
        )
    finally:
        release()
    return artifact


@router.get(
    "/{session_id}/files/{path:path}",
    response_class=Response,
    responses={
        **FILE_ERRORS,
        200: {"description": "The file's bytes", "content": {"application/octet-stream": {}}},
    },
    summary="Read a file from the session's workspace",
)
async def read_file(session_id: SessionId, path: str, state: State, tenant: Caller) -> Response:
    session = state.sessions.get(tenant, session_id)
    # The file is held in memory until the client has it: admitted like a cell (the key's
    # concurrency, and the most the workspace can hold of the server's result budget).
    reservation, release = _admit(state, tenant, getattr(session, "room_bytes", 0))
    try:
        data: bytes = await state.on_session(
            session_id, lambda: session.files.read(path), cell=False
        )
    except BaseException:
        release()
        raise
    reservation.resize(len(data))

    def chunks() -> Iterator[bytes]:
        # In pieces, each sent once the client's connection drains: a whole body is handed to
        # the server's write buffer at once, which would release the budget before it is sent.
        view = memoryview(data)
        for at in range(0, len(data), DOWNLOAD_CHUNK):
            yield bytes(view[at : at + DOWNLOAD_CHUNK])

    return StreamingResponse(
        chunks(),
        media_type="application/octet-stream",
        headers={"content-length": str(len(data))},
        background=BackgroundTask(release),
    )


@router.delete(
    "/{session_id}/files/{path:path}",
    status_code=204,
    response_class=Response,
    responses=FILE_ERRORS,
    summary="Remove a file from the session's workspace",
)
async def remove_file(session_id: SessionId, path: str, state: State, tenant: Caller) -> Response:
    session = state.sessions.get(tenant, session_id)
    release = state.quotas.hold(tenant)
    try:
        await state.on_session(session_id, lambda: session.files.remove(path), cell=False)
    finally:
        release()
    return Response(status_code=204)
