"""The E2B-compatible face: the official `e2b` and `e2b-code-interpreter` SDKs run against
`execbox serve --e2b` when `E2B_API_URL` and `E2B_SANDBOX_URL` point at `http://HOST:PORT/e2b`.

It is a sub-app mounted at /e2b, over the same server state as /v1: the same keys, tenancy,
quotas, sessions and records. Its parts: the control plane (`control`), the code interpreter
(`interpreter`), envd's file API (`envd`) and its Connect-RPC services (`rpc`, `process`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI

if TYPE_CHECKING:
    from ..state import ServerState

PREFIX = "/e2b"


def create_app(state: ServerState) -> FastAPI:
    """The face as an app of its own (its errors are E2B's shape, not execbox's)."""
    from . import access, control, envd, interpreter, process, rpc

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    access.install(app)
    sandboxes = access.Sandboxes()
    app.state.sandboxes = sandboxes
    state.e2b = sandboxes  # for `limits.Admission`: it checks a sandbox's token before the body
    app.include_router(control.router(state, sandboxes))
    app.include_router(interpreter.router(state, sandboxes))
    app.include_router(envd.router(state, sandboxes))
    app.include_router(rpc.router(state, sandboxes))
    app.include_router(process.router(state, sandboxes))
    return app
