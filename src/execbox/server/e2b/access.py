"""Who may call the E2B face: the control plane takes an execbox API key as `X-API-KEY`; a
sandbox's own calls carry its id (`E2b-Sandbox-Id`) and the access token it was created with.

Errors are E2B's shape, `{"code": HTTP status, "message": ...}`, which the SDKs read."""

from __future__ import annotations

import asyncio
import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ...errors import ExecboxError
from ..auth import Tenant
from ..deps import tenant_of
from ..errors import ApiError, translate
from ..limits import TENANT_KEY
from ..state import ANONYMOUS_TENANT

if TYPE_CHECKING:
    from ..state import ServerState

# E2B's fixed ports, as the SDKs name them in `E2b-Sandbox-Port`.
ENVD_PORT, JUPYTER_PORT = 49983, 49999
DEFAULT_CONTEXT = "default"


class E2BError(Exception):
    """An error answered in E2B's shape."""

    def __init__(self, status: int, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


def unsupported(feature: str, instead: str) -> E2BError:
    """A 501 that names what execbox does not do: never a silent success."""
    return E2BError(501, f"execbox does not support {feature}: {instead}")


@dataclass
class Context:
    """A code context: one execbox session of its own."""

    id: str
    language: str
    session_id: str
    cwd: str = "/workspace"


@dataclass
class Sandbox:
    """An E2B sandbox: an execbox Python session (its id is the sandbox's) and its contexts."""

    id: str
    tenant: Tenant
    template: str
    metadata: dict[str, str]
    token: str
    profile: str
    environment: str | None
    env: dict[str, str]
    limits: dict[str, float] | None
    started_at: float
    end_at: float
    key: str | None = None  # the key last given for it: checked again on every sandbox call
    cpu_mark: tuple[float, int] | None = None  # (time, CPU ns) at the last metrics sample
    last_metric: dict[str, Any] | None = None
    contexts: dict[str, Context] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    starting: asyncio.Lock = field(default_factory=asyncio.Lock)


def new_token() -> str:
    return secrets.token_urlsafe(32)


class Sandboxes:
    """The live E2B sandboxes, by id; each belongs to the tenant that made it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[str, Sandbox] = {}

    def add(self, sandbox: Sandbox) -> None:
        with self._lock:
            self._by_id[sandbox.id] = sandbox

    def drop(self, sandbox_id: str) -> Sandbox | None:
        with self._lock:
            return self._by_id.pop(sandbox_id, None)

    def get(self, sandbox_id: str) -> Sandbox | None:
        with self._lock:
            return self._by_id.get(sandbox_id)

    def of(self, tenant: Tenant) -> list[Sandbox]:
        with self._lock:
            return [s for s in self._by_id.values() if s.tenant.name == tenant.name]


def owned(sandboxes: Sandboxes, tenant: Tenant, sandbox_id: str) -> Sandbox:
    """The tenant's sandbox, or E2B's 404 (another tenant's is as good as none)."""
    sandbox = sandboxes.get(sandbox_id)
    if sandbox is None or sandbox.tenant.name != tenant.name:
        raise E2BError(404, f"sandbox {sandbox_id!r} not found")
    return sandbox


async def api_tenant(state: ServerState, request: Request) -> Tenant:
    """The control plane's caller: `X-API-KEY` is an execbox tenant key (`execbox keys
    create`), counted against the key's rate as the execbox API counts it."""
    admitted: Tenant | None = request.scope.get(TENANT_KEY)
    if admitted is not None:  # `limits.Admission` authenticated and counted it already
        return admitted
    if not state.settings.auth:
        tenant = ANONYMOUS_TENANT
    else:
        key = request.headers.get("x-api-key") or None
        tenant = await anyio.to_thread.run_sync(
            tenant_of, state.key_store(), key, limiter=state.auth_limiter
        )
    state.quotas.count(tenant)
    return tenant


async def sandbox_call(state: ServerState, sandboxes: Sandboxes, request: Request) -> Sandbox:
    """The sandbox a sandbox-side call names, once its access token matches and the key that
    made or connected it is still valid; counted against its tenant's rate. A call without the
    token is refused: a sandbox id is not a secret."""
    sandbox_id = request.headers.get("e2b-sandbox-id", "")
    sandbox = sandboxes.get(sandbox_id)
    if sandbox is None:
        # E2B's proxy words for a sandbox that is gone: the SDKs map them to "not running".
        raise E2BError(502, f"The sandbox {sandbox_id[:64]!r} was not found")
    given = request.headers.get("x-access-token") or request.headers.get(
        "e2b-traffic-access-token", ""
    )
    if not hmac.compare_digest(given.encode(), sandbox.token.encode()):
        raise E2BError(401, "missing or wrong access token for this sandbox")
    try:
        closed = state.sessions.get(sandbox.tenant, sandbox.id).closed
    except ApiError:  # ended long ago: the registry no longer remembers it
        closed = True
    if closed:
        # Its token must not start contexts (new sessions) once it has ended.
        sandboxes.drop(sandbox.id)
        raise E2BError(502, f"The sandbox {sandbox_id[:64]!r} was not found")
    if request.scope.get(TENANT_KEY) is not None:
        return sandbox  # `limits.Admission` checked its key and counted it already
    tenant = sandbox.tenant
    if state.settings.auth:
        # A revoked key's tokens go with it, as its execbox requests stop at the next one.
        tenant = await anyio.to_thread.run_sync(
            tenant_of, state.key_store(), sandbox.key, limiter=state.auth_limiter
        )
    state.quotas.count(tenant)
    return sandbox


def iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1000):03d}Z"


def install(app: FastAPI) -> None:
    """Every error of the face in E2B's shape."""

    def answer(status: int, message: str, retry_after: int | None = None) -> JSONResponse:
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        return JSONResponse(
            {"code": status, "message": message}, status_code=status, headers=headers
        )

    @app.exception_handler(E2BError)
    async def on_e2b(_request: Request, exc: E2BError) -> JSONResponse:
        return answer(exc.status, exc.message, exc.retry_after)

    @app.exception_handler(ApiError)
    async def on_api(_request: Request, exc: ApiError) -> JSONResponse:
        return answer(exc.status, exc.message, exc.retry_after)

    @app.exception_handler(ExecboxError)
    async def on_execbox(_request: Request, exc: ExecboxError) -> JSONResponse:
        err = translate(exc)
        return answer(err.status, err.message, err.retry_after)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return answer(400, f"invalid request: {where}: {first.get('msg', 'invalid')}")

    @app.exception_handler(HTTPException)
    async def on_http(_request: Request, exc: HTTPException) -> JSONResponse:
        return answer(exc.status_code, str(exc.detail))
