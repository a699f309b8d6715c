"""/v1/runs: one-shot runs, their records and artifacts."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Path, Response
from fastapi.responses import StreamingResponse
from pydantic import Field

from ..contract import RunRequest, RunResult
from ..records import RunRecord
from . import sse
from .deps import Caller, State
from .errors import ApiError, documented

router = APIRouter(prefix="/v1/runs", tags=["runs"])
RUN_ERRORS = documented(400, 401, 413, 422, 429, 500, 503)
RunId = Annotated[str, Path(max_length=64, description="The run's id.")]


class RunBody(RunRequest):
    """A run request, plus how the server should treat it."""

    cache: bool | None = Field(None, description="Use the result cache (null: server default).")
    secrets: list[str] = Field(default_factory=list,
                               description="Values redacted from this run's output and record.")

    def request(self) -> RunRequest:
        return RunRequest.model_construct(**{name: getattr(self, name)
                                             for name in RunRequest.model_fields})


def _runner(state: State, tenant: Caller, body: RunBody) -> sse.Call:
    executor = state.executor
    request = body.request()

    def call(on_stdout: sse.OutputCallback | None = None,
             on_stderr: sse.OutputCallback | None = None) -> RunResult:
        started = time.perf_counter()
        result = executor.run_request(request, cache=body.cache, secrets=body.secrets,
                                      on_stdout=on_stdout, on_stderr=on_stderr,
                                      cache_scope=tenant.name)
        state.finish("run", tenant, result, started)
        return result

    return call


@router.post("", response_model=RunResult, responses=RUN_ERRORS,
             summary="Run code in a fresh sandbox and return its result")
async def create_run(body: RunBody, state: State, tenant: Caller) -> Response:
    call = _runner(state, tenant, body)
    release = state.quotas.admit(tenant)
    try:
        result = await state.running(lambda: call(None, None))
    finally:
        release()
    return Response(result.model_dump_json(), media_type="application/json")


@router.post("/stream", responses={**RUN_ERRORS, 200: sse.RESPONSE},
    response_class=StreamingResponse,
    summary="Run code and stream its output as server-sent events, ending with the result")
async def stream_run(body: RunBody, state: State, tenant: Caller) -> StreamingResponse:
    call = _runner(state, tenant, body)
    release = state.quotas.admit(tenant)

    async def in_thread(fn: Callable[[], RunResult]) -> RunResult:
        try:
            return await state.running(fn)
        finally:
            release()

    return StreamingResponse(sse.stream(call, in_thread), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store"})


def _owned_record(state: State, tenant: Caller, run_id: str) -> RunRecord:
    if state.key_store().owner_of(run_id) != tenant.name:
        raise ApiError(404, "run_not_found", f"no run {run_id!r}")
    record = state.executor.store.get(run_id)
    if record is None:
        raise ApiError(404, "run_not_found", f"no run {run_id!r}")
    return record


@router.get("/{run_id}", response_model=RunRecord, responses=documented(401, 404, 422),
            summary="The stored record of a run")
async def get_run(run_id: RunId, state: State, tenant: Caller) -> Response:
    record = await state.blocking(lambda: _owned_record(state, tenant, run_id))
    return Response(record.model_dump_json(), media_type="application/json")


@router.get("/{run_id}/artifacts/{path:path}", responses={
    **documented(401, 404, 422),
    200: {"description": "The artifact's bytes", "content": {"*/*": {}}}},
    response_class=Response, summary="The bytes of a run's artifact")
async def get_artifact(run_id: RunId, path: str, state: State, tenant: Caller) -> Response:
    def load() -> tuple[bytes, str]:
        record = _owned_record(state, tenant, run_id)
        mime = next((a.mime_type for a in record.result.artifacts if a.path == path), None)
        data = state.executor.store.artifact_data(run_id, path) if mime else None
        if data is None or mime is None:
            raise ApiError(404, "artifact_not_found",
                           f"run {run_id} has no stored artifact {path!r}")
        return data, mime

    data, mime = await state.blocking(load)
    return Response(data, media_type=mime)
