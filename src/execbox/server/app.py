"""The HTTP API: a FastAPI app over one Executor.

    POST /v1/runs, /v1/runs/stream          run code (JSON result, or server-sent events)
    GET  /v1/runs/{id}, .../artifacts/{p}   the record and artifact bytes (own runs only)
    /v1/sessions/...                        sessions: create, cells, files, close
    GET  /healthz /readyz                   liveness, readiness (no key)
    GET  /console/...                       the web console (a key, or its login cookie)
    GET  /metrics                           Prometheus metrics (an admin key)

Every request but /healthz and /readyz must name an allowed host (`hosts.HostCheck`, outermost).
    GET  /docs /redoc /openapi.json         the API's documents (only with Settings.docs)

The executor is synchronous: every sandbox call runs on a worker thread, never on the loop.
On shutdown (SIGTERM, lifespan end) uvicorn stops accepting and lets in-flight requests finish;
then every session is closed and the executor (its fork server and slots) stopped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio.to_thread
from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse

from .. import __version__
from . import console, errors, runs, sessions
from .deps import Admin, State
from .hosts import AllowedHosts, HostCheck
from .limits import Admission, BodySizeLimit, SecretsCap
from .state import ServerState, Settings

if TYPE_CHECKING:
    from ..executor import Executor

log = logging.getLogger(__name__)


def create_app(executor: Executor | None = None, settings: Settings | None = None) -> FastAPI:
    """The API app. With `executor` the app uses it and leaves it open at shutdown; without,
    it starts its own at startup (from `settings.executor_options`) and closes it at the end."""
    settings = settings or Settings()
    state = ServerState(settings, executor)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await anyio.to_thread.run_sync(state.start)
        state.arm()
        # What start-up made lives as long as the server: out of the collector's sight, a full
        # collection (which every burst of connections sets off) no longer walks all of it.
        # Garbage is collected first, or its cycles (sockets among them) would never be.
        gc.collect()
        gc.freeze()
        log.info(
            "execbox server ready (auth %s, spool %s); settings: %s",
            "on" if settings.auth else "OFF",
            state.spool.root,
            _effective(settings),
        )
        sweeper = asyncio.create_task(_sweep(state))
        try:
            yield
        finally:
            log.info("execbox server shutting down")
            sweeper.cancel()
            await anyio.to_thread.run_sync(state.stop)
            gc.unfreeze()  # an app embedded in a longer-lived process leaves its heap as found

    # Documents are off unless asked for: the schema is in the repository for client authors,
    # and Swagger UI's page loads its scripts from a CDN.
    on = settings.docs
    app = FastAPI(
        title="execbox",
        version=__version__,
        lifespan=lifespan,
        docs_url="/docs" if on else None,
        redoc_url="/redoc" if on else None,
        openapi_url="/openapi.json" if on else None,
        description="Run the code AI agents write: isolated, limited, recorded. "
        'Every error is {"error": {"code", "message"}}.',
    )
    app.state.execbox = state
    errors.install(app, lambda code: state.metrics.rejected.labels(code=code).inc())
    app.add_middleware(SecretsCap)  # innermost: the body's size is already capped
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes, budget=state.bodies)
    app.add_middleware(Admission, state=state)  # the key before any of the body
    # Outermost: a request a rebinding page sent meets no key check, quota or body.
    app.add_middleware(
        HostCheck,
        allowed=AllowedHosts(settings.allowed_hosts),
        refused=lambda code: state.metrics.rejected.labels(code=code).inc(),
    )
    app.include_router(runs.router)
    app.include_router(sessions.router)
    console.mount(app)
    if settings.e2b:  # its own app: its errors are E2B's shape
        from . import e2b

        app.mount(e2b.PREFIX, e2b.create_app(state))

    @app.get("/healthz", tags=["ops"], summary="The process is serving")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["ops"],
        summary="The executor is up and the server not draining",
        responses=errors.documented(503),
    )
    async def readyz(state: State) -> JSONResponse:
        state.executor  # noqa: B018 - raises 503 not_ready while starting or draining
        return JSONResponse({"status": "ready"})

    @app.get(
        "/metrics",
        tags=["ops"],
        summary="Prometheus metrics (an admin key)",
        response_class=Response,
        dependencies=[Admin],
        responses={
            **errors.documented(401, 403),
            200: {"content": {"text/plain": {}}, "description": "metrics"},
        },
    )
    async def metrics(state: State) -> Response:
        return Response(
            state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    return app


async def _sweep(state: ServerState) -> None:
    """Remove expired spooled artifacts now and then, requests or not."""
    every = max(0.5, min(30.0, state.settings.artifact_ttl_s / 4))
    while True:
        await asyncio.sleep(every)
        await anyio.to_thread.run_sync(state.spool.sweep)


def _effective(settings: Settings) -> str:
    """The settings in force, for the start-up log; the executor's options by name only (they
    may hold secrets)."""
    shown = {
        f.name: getattr(settings, f.name)
        for f in dataclasses.fields(settings)
        if f.name != "executor_options"
    }
    shown["executor_options"] = sorted(settings.executor_options)
    return ", ".join(f"{name}={value!r}" for name, value in shown.items())
