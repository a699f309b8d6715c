"""/v1/runs: one-shot runs, their records and artifacts."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Response
from fastapi import Path as PathParam
from fastapi.responses import StreamingResponse
from pydantic import Field
from starlette.background import BackgroundTask

from ..contract import BoundSecrets, RunRequest, RunResult, Secrets
from ..records import RunRecord
from . import spool, sse
from .deps import Caller, State
from .errors import ApiError, documented

router = APIRouter(prefix="/v1/runs", tags=["runs"])
RUN_ERRORS = documented(400, 401, 413, 422, 429, 500, 503)
RunId = Annotated[str, PathParam(max_length=64, description="The run's id.")]
CHUNK = 1 << 20  # bytes of a spooled artifact read and sent at a time


class RunBody(RunRequest):
    """A run request, plus how the server should treat it."""

    cache: bool | None = Field(None, description="Use the result cache (null: server default).")
    secrets: Secrets = Field(default_factory=list)
    bound_secrets: BoundSecrets = Field(default_factory=list)

    def request(self) -> RunRequest:
        return RunRequest.model_construct(
            **{name: getattr(self, name) for name in RunRequest.model_fields}
        )


class _Run:
    """One admitted run: its quota token, its reservation of result bytes and its spool
    directory, each given back on every path once the run is over and its response has ended
    (sent, or the client gone), whichever comes last: a stream nobody reads still counts
    against its tenant."""

    def __init__(self, state: State, tenant: Caller, body: RunBody) -> None:
        self.state, self.tenant, self.request = state, tenant, body.request()
        self.cache, self.secrets = body.cache, body.secrets
        self.bound_secrets = body.bound_secrets
        bound = spool.result_bound(
            self.request.limits, state.executor.profiles.get(self.request.profile)
        )
        self.release_quota = state.quotas.hold(tenant)
        try:
            self.reservation = state.results.reserve(bound, tenant.name)
            self.directory: Path | None = state.spool.new_dir()
        except BaseException:
            self.release_quota()
            if hasattr(self, "reservation"):
                self.reservation.release()
            raise
        self.result: RunResult | None = None
        self.started = self.over = self.responded = False

    def __call__(
        self,
        on_stdout: sse.OutputCallback | None = None,
        on_stderr: sse.OutputCallback | None = None,
    ) -> RunResult:
        started = time.perf_counter()
        result = self.state.executor.run_request(
            self.request,
            cache=self.cache,
            secrets=self.secrets,
            bound_secrets=self.bound_secrets,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            cache_scope=self.tenant.name,
            spool_dir=str(self.directory),
            tenant=self.tenant.name,
        )
        self.state.finish("run", self.tenant, result, started)
        self.result = result
        return result

    async def run(self, fn: Callable[[], RunResult]) -> RunResult:
        """`fn` (this run) on a worker thread; once it is over, settle if the response has
        already ended (a client gone mid-stream)."""
        self.started = True
        try:
            return await self.state.running(fn)
        finally:
            self.over = True
            if self.responded:
                self.release_quota()
                await self.state.blocking(self.settle)

    async def response_ended(self) -> None:
        """The response is sent, or the client has gone; settle now unless the run is still
        going (then it settles when it ends)."""
        self.responded = True
        if not self.started or self.over:
            self.release_quota()
            await self.state.blocking(self.settle)

    def settle(self) -> None:
        """Keep only the artifacts still to download, and their bytes in the budget."""
        directory, self.directory = self.directory, None
        if directory is None:  # settled already
            return
        if self.result is None:  # the run failed, or was left behind at shutdown
            self.state.spool.discard(directory)
            self.reservation.release()
        else:
            self.state.spool.adopt(self.result, directory, self.tenant.name, self.reservation)


@router.post(
    "",
    response_model=RunResult,
    responses=RUN_ERRORS,
    summary="Run code in a fresh sandbox and return its result",
)
async def create_run(body: RunBody, state: State, tenant: Caller) -> Response:
    run = _Run(state, tenant, body)
    try:
        result = await run.run(run)
        content = sse.result_json(result)
    finally:
        await run.response_ended()
    return Response(content, media_type="application/json")


@router.post(
    "/stream",
    responses={**RUN_ERRORS, 200: sse.RESPONSE},
    response_class=StreamingResponse,
    summary="Run code and stream its output as server-sent events, ending with the result",
)
async def stream_run(body: RunBody, state: State, tenant: Caller) -> StreamingResponse:
    run = _Run(state, tenant, body)
    feed = sse.Feed(run, run.run, state.settings.stream_buffer_bytes, state.streams)
    return sse.EventStream(feed, run.response_ended)


def _owned_record(state: State, tenant: Caller, run_id: str) -> RunRecord:
    if state.key_store().owner_of(run_id) != tenant.name:
        raise ApiError(404, "run_not_found", f"no run {run_id!r}")
    record = state.executor.store.get(run_id)
    if record is None:
        raise ApiError(404, "run_not_found", f"no run {run_id!r}")
    return record


@router.get(
    "/{run_id}",
    response_model=RunRecord,
    responses=documented(401, 404, 422, 429),
    summary="The stored record of a run",
)
async def get_run(run_id: RunId, state: State, tenant: Caller) -> Response:
    release = state.quotas.hold(tenant)
    try:
        record = await state.blocking(lambda: _owned_record(state, tenant, run_id))
    finally:
        release()
    return Response(record.model_dump_json(), media_type="application/json")


@router.get(
    "/{run_id}/artifacts/{path:path}",
    responses={
        **documented(401, 404, 422, 429),
        200: {"description": "The artifact's bytes", "content": {"*/*": {}}},
    },
    response_class=Response,
    summary="The bytes of a run's artifact",
)
async def get_artifact(run_id: RunId, path: str, state: State, tenant: Caller) -> Response:
    """Streamed from the spool (artifacts over the records' cap, once, within the server's
    artifact TTL) or from the record store."""

    def load() -> tuple[int, int, str] | tuple[bytes, str]:
        record = _owned_record(state, tenant, run_id)
        mime = next((a.mime_type for a in record.result.artifacts if a.path == path), None)
        spooled = state.spool.open(run_id, tenant.name, path) if mime else None
        if spooled is not None:
            return spooled
        data = state.executor.store.artifact_data(run_id, path) if mime else None
        if data is None or mime is None:
            raise ApiError(
                404,
                "artifact_not_found",
                f"run {run_id} has no stored artifact {path!r} (artifacts over the "
                "records' cap are served once, within the server's artifact TTL)",
            )
        return data, mime

    release = state.quotas.hold(tenant)  # held until the last byte is sent
    try:
        found = await state.blocking(load)
    except BaseException:
        release()
        raise
    if len(found) == 2:
        release()
        return Response(found[0], media_type=found[1])
    fd, size, mime = found
    return StreamingResponse(
        _stream_file(state, fd, run_id, path),
        media_type=mime,
        headers={"Content-Length": str(size)},
        background=BackgroundTask(release),
    )


async def _stream_file(state: State, fd: int, run_id: str, path: str) -> AsyncIterator[bytes]:
    """The file's bytes in chunks; once all are sent, the spooled copy is removed."""
    try:
        while True:
            chunk = await state.blocking(lambda: os.read(fd, CHUNK))
            if not chunk:
                break
            yield chunk
    finally:
        os.close(fd)
    await state.blocking(lambda: state.spool.downloaded(run_id, path))
