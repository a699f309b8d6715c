"""MCP over streamable HTTP with the HTTP API's keys: every request carries
`Authorization: Bearer KEY` (a tenant's key from `execbox keys create`), checked against the
same key table as `execbox serve`. The tenant rides on the request's ASGI scope to the tools,
which apply its quotas and see only its own sessions and runs (see `server.caller`). An MCP
session (its `mcp-session-id`) belongs to the tenant that opened it; another key gets 404.
stdio needs none of this: the client that starts the server is its only user.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

import anyio
import anyio.to_thread
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..server.auth import KeyStore, Tenant
from ..server.deps import tenant_of
from ..server.errors import ApiError
from ..server.state import AUTH_THREADS, LOCAL_TENANT

TENANT_SCOPE_KEY = "execbox.tenant"
SESSION_HEADER = b"mcp-session-id"
MAX_SESSIONS_KEPT = 100_000  # MCP session -> tenant entries; the oldest are forgotten first


class BearerAuth:
    """ASGI middleware: authenticate each HTTP request, put its tenant in the scope, keep each
    MCP session to its tenant. With `keys` None (`--no-auth`) every caller is 'local'."""

    def __init__(self, app: ASGIApp, keys: KeyStore | None) -> None:
        self.app = app
        self.keys = keys
        self._owners: OrderedDict[bytes, str] = OrderedDict()
        self._lock = threading.Lock()
        # Key lookups on threads of their own: the tools run on anyio's default pool, which
        # one tenant's waiting calls can fill.
        self._auth_limiter = anyio.CapacityLimiter(AUTH_THREADS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", ()))
        try:
            tenant = await self._tenant(headers.get(b"authorization"))
            session = headers.get(SESSION_HEADER)
            if session is not None:
                with self._lock:
                    owner = self._owners.get(session)
                if owner is not None and owner != tenant.name:
                    raise ApiError(404, "session_not_found", "no such MCP session")
        except ApiError as exc:
            await _refuse(send, exc)
            return
        scope[TENANT_SCOPE_KEY] = tenant

        async def send_owned(message: Message) -> None:
            if message["type"] == "http.response.start":  # a new session's id comes back here
                for name, value in message.get("headers", ()):
                    if name.lower() == SESSION_HEADER:
                        self._own(value, tenant)
            await send(message)

        await self.app(scope, receive, send_owned)

    async def _tenant(self, authorization: bytes | None) -> Tenant:
        if self.keys is None:
            return LOCAL_TENANT
        key = None
        if authorization is not None:
            scheme, _, value = authorization.decode("latin-1").partition(" ")
            key = value.strip() if scheme.lower() == "bearer" and value.strip() else None
        return await anyio.to_thread.run_sync(tenant_of, self.keys, key, limiter=self._auth_limiter)

    def _own(self, session: bytes, tenant: Tenant) -> None:
        with self._lock:
            self._owners.setdefault(session, tenant.name)
            while len(self._owners) > MAX_SESSIONS_KEPT:
                self._owners.popitem(last=False)


async def _refuse(send: Send, err: ApiError) -> None:
    body = json.dumps({"error": {"code": err.code, "message": err.message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if err.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
