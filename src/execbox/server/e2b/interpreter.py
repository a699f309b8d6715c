"""The code interpreter's face: `POST /execute` streams a cell as E2B's NDJSON (stdout, stderr,
results, error, then the execution count), and `/contexts` makes, lists and removes contexts.

The default Python context is the sandbox's own session; the default JavaScript context and
every context made with `create_code_context` are sessions of their own (their own workspace:
unlike E2B's, contexts do not share files). Every cell goes through execbox's pipeline: policy,
redaction (streamed output included), a run record owned by the sandbox's tenant."""

from __future__ import annotations

import ast
import asyncio
import codecs
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ...contract import Output, RunResult
from ...sandbox.inside.charts import MIME as CHART_MIME
from ..auth import Tenant
from ..spool import result_bound
from ..state import ServerState
from .access import (
    DEFAULT_CONTEXT,
    Context,
    E2BError,
    Sandbox,
    Sandboxes,
    sandbox_call,
    unsupported,
)

LANGUAGES = {"python": "python", "javascript": "javascript", "js": "javascript"}
DEFAULT_JS_CONTEXT = "default-javascript"
# E2B's Result fields by MIME type; others go under `extra`.
FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    CHART_MIME: "chart",
}
JSON_FIELDS = ("json", "chart")


class ExecuteBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    code: str
    context_id: str | None = Field(None, max_length=64)
    language: str | None = Field(None, max_length=32)
    env_vars: dict[str, str] | None = None


class ContextBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    language: str | None = Field(None, max_length=32)
    cwd: str | None = Field(None, max_length=4096)


def _language(name: str | None) -> str:
    language = LANGUAGES.get((name or "python").lower())
    if language is None:
        raise unsupported(
            f"the {name!r} language in the code interpreter",
            "execbox sessions run python and javascript (bash runs through sandbox.commands.run)",
        )
    return language


def _cwd(cwd: str | None) -> str:
    if cwd not in (None, "", "/workspace", "/home/user"):
        raise unsupported(
            f"a context working directory of {cwd!r}",
            "every context starts in its own /workspace (E2B's /home/user maps to it)",
        )
    return "/workspace"


def results_of(outputs: list[Output], code: str, language: str) -> list[dict[str, Any]]:
    """E2B results from a cell's flat outputs: IPython's bundles each start with text/plain
    (a figure is a lone image); the last bundle is the main result when the cell ends with
    an expression that shows its value."""
    bundles: list[dict[str, Any]] = []
    for out in outputs:
        field = FIELDS.get(out.mime_type)
        if not bundles or out.mime_type == "text/plain" or _has(bundles[-1], out.mime_type):
            bundles.append({"type": "result", "is_main_result": False})
        bundle = bundles[-1]
        if field in JSON_FIELDS:
            try:
                value, parsed = json.loads(out.data), True
            except ValueError:
                value, parsed = None, False
            # A chart is an object: anything else a cell displayed under its type is extra.
            if parsed and (field == "json" or isinstance(value, dict)):
                bundle[field] = value
            else:
                bundle.setdefault("extra", {})[out.mime_type] = out.data
        elif field is not None:
            bundle[field] = out.data
        else:
            bundle.setdefault("extra", {})[out.mime_type] = out.data
    if bundles and "text" in bundles[-1] and _shows_value(code, language):
        bundles[-1]["is_main_result"] = True
    elif bundles and language == "javascript" and "text" in bundles[-1]:
        bundles[-1]["is_main_result"] = True
    return bundles


def _has(bundle: dict[str, Any], mime: str) -> bool:
    field = FIELDS.get(mime)
    return (field in bundle) if field else mime in bundle.get("extra", {})


def _shows_value(code: str, language: str) -> bool:
    if language != "python":
        return False
    if code.rstrip().endswith(";"):
        return False
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return False
    if not body or not isinstance(body[-1], ast.Expr):
        return False
    value = body[-1].value
    return not (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id in ("display", "print")
    )


def _error(result: RunResult) -> dict[str, Any] | None:
    if result.status.value == "ok" or result.error is None:
        if result.status.value == "ok":
            return None
        return {"type": "error", "name": result.status.value, "value": "", "traceback": ""}
    err = result.error
    return {
        "type": "error",
        "name": err.type,
        "value": err.message,
        "traceback": err.traceback or f"{err.type}: {err.message}",
    }


def _line(item: dict[str, Any]) -> bytes:
    return json.dumps(item).encode() + b"\n"


async def session_for(
    state: ServerState,
    sandboxes: Sandboxes,
    sandbox: Sandbox,
    context_id: str | None,
    language: str,
) -> str:
    """The session that runs a cell of `context_id` (or of the language's default context)."""
    if context_id in (None, "", DEFAULT_CONTEXT) and language == "python":
        return sandbox.id
    if context_id not in (None, ""):
        context = sandbox.contexts.get(context_id)
        if context is None:
            raise E2BError(404, f"context {context_id!r} not found")
        return context.session_id
    async with sandbox.starting:  # two first JavaScript cells at once start one session
        context = sandbox.contexts.get(DEFAULT_JS_CONTEXT)
        if context is None:
            context = await new_context(state, sandbox, language, DEFAULT_JS_CONTEXT)
    return context.session_id


async def new_context(
    state: ServerState, sandbox: Sandbox, language: str, context_id: str | None = None
) -> Context:
    """A context as a new session of the sandbox's tenant, profile and environment."""
    tenant = sandbox.tenant
    executor = state.executor
    session = None
    remaining = max(1.0, sandbox.end_at - time.time())
    release = state.quotas.hold(tenant)
    try:
        state.sessions.reserve(tenant, await state.blocking(state.shares))
        try:
            session = await state.running(
                lambda: executor.session(
                    language=language,
                    profile=sandbox.profile,
                    environment=sandbox.environment,
                    env=sandbox.env or None,
                    limits=sandbox.limits,
                    idle_timeout_s=min(remaining, state.settings.max_session_idle_s),
                    max_lifetime_s=remaining,
                    tenant=tenant.name,
                )
            )
        finally:
            state.sessions.add(tenant, session)
    finally:
        release()
    context = Context(id=context_id or session.id, language=language, session_id=session.id)
    with sandbox.lock:
        sandbox.contexts[context.id] = context
    return context


def admit_cell(state: ServerState, tenant: Tenant, session: Any) -> Callable[[], None]:
    """One of the key's requests in flight and the most a cell's result may hold of the
    server's result budget, as execbox's own cells are admitted; the function that gives both
    back (idempotent)."""
    limits = getattr(session, "limits", None)  # an ended session has none: its call fails
    release_quota = state.quotas.hold(tenant)
    try:
        reservation = state.results.reserve(result_bound(limits) if limits else 0, tenant.name)
    except BaseException:
        release_quota()
        raise
    released = threading.Lock()

    def release() -> None:
        if released.acquire(blocking=False):
            release_quota()
            reservation.release()

    return release


def router(state: ServerState, sandboxes: Sandboxes) -> APIRouter:  # noqa: C901 - one closure per route
    api = APIRouter()

    @api.post("/execute")
    async def execute(body: ExecuteBody, request: Request) -> StreamingResponse:
        sandbox = await sandbox_call(state, sandboxes, request)
        if body.language and body.context_id:
            raise E2BError(400, "give a context or a language, not both")
        if body.env_vars:
            raise unsupported(
                "environment variables for one execution (envs of run_code)",
                "give envs when the sandbox is created",
            )
        language = _language(body.language)
        if body.context_id and body.context_id in sandbox.contexts:
            language = sandbox.contexts[body.context_id].language
        session_id = await session_for(state, sandboxes, sandbox, body.context_id, language)
        tenant = sandbox.tenant
        session = state.sessions.get(tenant, session_id)
        release = admit_cell(state, tenant, session)
        try:
            events = _Cell(state, tenant, session, session_id, body.code, language)
        except BaseException:
            release()
            raise

        async def lines() -> AsyncIterator[bytes]:
            try:
                async for line in events.lines():
                    yield line
            finally:
                release()

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @api.post("/contexts")
    async def create_context(body: ContextBody, request: Request) -> dict[str, str]:
        sandbox = await sandbox_call(state, sandboxes, request)
        language = _language(body.language)
        cwd = _cwd(body.cwd)
        context = await new_context(state, sandbox, language)
        context.cwd = cwd
        return {"id": context.id, "language": context.language, "cwd": context.cwd}

    @api.get("/contexts")
    async def list_contexts(request: Request) -> list[dict[str, str]]:
        sandbox = await sandbox_call(state, sandboxes, request)
        found = [{"id": DEFAULT_CONTEXT, "language": "python", "cwd": "/workspace"}]
        found += [
            {"id": c.id, "language": c.language, "cwd": c.cwd} for c in sandbox.contexts.values()
        ]
        return found

    @api.delete("/contexts/{context_id}")
    async def remove_context(context_id: str, request: Request) -> Response:
        sandbox = await sandbox_call(state, sandboxes, request)
        with sandbox.lock:
            context = sandbox.contexts.pop(context_id, None)
        if context is None:
            raise E2BError(404, f"context {context_id!r} not found")
        session = state.sessions.get(sandbox.tenant, context.session_id)
        await state.blocking(session.close)
        return Response(status_code=204)

    @api.post("/contexts/{context_id}/restart")
    async def restart_context(context_id: str, request: Request) -> None:
        await sandbox_call(state, sandboxes, request)
        raise unsupported("restarting a context", "remove it and create a new one")

    return api


class _Cell:
    """One cell on a worker thread and its NDJSON lines as they come. At most the server's
    stream buffer of output waits for a slow reader; what is past it is sent from the
    result at the end, so the logs are whole either way."""

    def __init__(
        self,
        state: ServerState,
        tenant: Any,
        session: Any,
        session_id: str,
        code: str,
        language: str,
        timeout_s: float | None = None,
        hooks: tuple[Callable[[], None], Callable[[], None]] | None = None,
    ) -> None:
        """`hooks`: called in the worker thread before the cell runs (raising skips it) and
        after it returns."""
        self.state, self.code, self.language = state, code, language
        self.session = session
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.sent = {"stdout": [], "stderr": []}  # type: dict[str, list[str]]
        self.cut = False
        self.held = 0
        self.lock = threading.Lock()
        loop = asyncio.get_running_loop()
        budget = state.settings.stream_buffer_bytes
        decoders = {n: codecs.getincrementaldecoder("utf-8")("replace") for n in self.sent}

        def put(item: tuple[str, Any]) -> None:
            try:
                loop.call_soon_threadsafe(self.queue.put_nowait, item)
            except RuntimeError:  # the loop is gone (shutting down)
                pass

        def send(name: str, text: str) -> None:
            if not text:
                return
            with self.lock:
                if self.cut or self.held + len(text) > budget:
                    self.cut = True
                    return
                self.held += len(text)
            put((name, text))

        def forward(name: str) -> Callable[[bytes], None]:
            return lambda chunk: send(name, decoders[name].decode(chunk))

        def call() -> RunResult:
            if hooks is not None:
                hooks[0]()
            started = time.perf_counter()
            try:
                result: RunResult = session.run(
                    code,
                    timeout_s=timeout_s,
                    on_stdout=forward("stdout"),
                    on_stderr=forward("stderr"),
                )
            finally:
                if hooks is not None:
                    hooks[1]()
            state.finish("cell", tenant, result, started)
            return result

        async def worker() -> None:
            try:
                result = await state.on_session(session_id, call, cell=True)
                self.queue.put_nowait(("result", result))
            except Exception as exc:  # noqa: BLE001 - ends the stream with an error line
                self.queue.put_nowait(("failed", exc))

        self.task = asyncio.create_task(worker())

    async def items(self) -> AsyncIterator[tuple[str, Any]]:
        """The cell's output as it comes, ("stdout" or "stderr", text); then ("failed", the
        exception), or the output the stream buffer did not hold and ("result", RunResult)."""
        while True:
            name, item = await self.queue.get()
            if name in ("stdout", "stderr"):
                with self.lock:
                    self.held -= len(item)
                self.sent[name].append(item)
                yield name, item
                continue
            if name == "result":
                for stream in ("stdout", "stderr"):
                    whole, streamed = getattr(item, stream), "".join(self.sent[stream])
                    rest = whole[len(streamed) :] if whole.startswith(streamed) else ""
                    if rest:
                        yield stream, rest
            yield name, item
            return

    async def lines(self) -> AsyncIterator[bytes]:
        async for name, item in self.items():
            if name in ("stdout", "stderr"):
                yield _line({"type": name, "text": item, "timestamp": time.time_ns() // 1000})
            elif name == "failed":
                yield _line(_failure(item))
            else:
                for bundle in results_of(item.outputs or [], self.code, self.language):
                    yield _line(bundle)
                error = _error(item)
                if error is not None:
                    yield _line(error)
                count = getattr(self.session, "cells", 0)
                yield _line({"type": "number_of_executions", "execution_count": count})


def _failure(exc: BaseException) -> dict[str, Any]:
    """A cell that could not run (the session ended, the server is full) as E2B's error."""
    from ...errors import ExecboxError
    from ..errors import ApiError, translate

    if isinstance(exc, ApiError):
        name, value = exc.code, exc.message
    elif isinstance(exc, ExecboxError):
        err = translate(exc)
        name, value = err.code, err.message
    else:
        name, value = "internal_error", "internal server error"
    return {"type": "error", "name": name, "value": value, "traceback": ""}
