"""What a request must pass before the application reads its body, as plain ASGI middleware.

`Admission` (outermost) checks the caller's key and counts the request against the key's rate
before any of the body is read: an unknown key is answered 401 and its connection closed with
the body still unread, and every authenticated request counts, whatever it ends in (404, 422).
`BodySizeLimit` then refuses a body past the cap with a JSON 413 before the application sees
any of it (declared Content-Length or counted while reading), and keeps the bodies of all
requests in flight within a server-wide budget, each key within half of it (past either, 503).
"""

from __future__ import annotations

import json
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .deps import tenant_of
from .errors import ApiError
from .quotas import BodyBudget
from .state import LOCAL_TENANT

if TYPE_CHECKING:
    from .state import ServerState

TENANT_KEY = "execbox.tenant"  # the scope's authenticated tenant, for the routes' dependency
TRUST_KEY = "execbox.trust"  # the connection's "an authenticated request came" callback (guard)


class Admission:
    """Authenticate and count every /v1/ request before its body is read."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        state = self.state
        try:
            if state.settings.auth:
                tenant = await anyio.to_thread.run_sync(
                    tenant_of, state.key_store(), _bearer(scope), limiter=state.auth_limiter)
                trust: Callable[[], None] | None = scope.get(TRUST_KEY)
                if trust is not None:
                    trust()
            else:
                tenant = LOCAL_TENANT
            state.quotas.count(tenant)
        except ApiError as err:
            state.metrics.rejected.labels(code=err.code).inc()
            await send_error(send, err)
            return
        scope[TENANT_KEY] = tenant
        await self.app(scope, receive, send)


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, key = value.decode("latin-1").partition(" ")
            if scheme.lower() != "bearer":
                return None
            return key.strip() or None
    return None


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, budget: BodyBudget) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.budget = budget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(send)
            return
        tenant = scope.get(TENANT_KEY)
        key = tenant.name if tenant is not None else ""
        taken = 0
        try:
            if declared is not None:
                # The body is held (raw, then parsed) until the response ends: book it all now.
                if not self._take(key, declared):
                    await send_error(send, self._busy())
                    return
                taken = declared
                await self.app(scope, receive, send)  # the server stops at Content-Length
                return
            # No length declared (chunked): read the body here, within the cap, then replay it.
            messages: list[Message] = []
            while True:
                message = await receive()
                messages.append(message)
                if message["type"] != "http.request":
                    break
                size = len(message.get("body", b""))
                if taken + size > self.max_bytes:
                    await self._refuse(send)
                    return
                if not self._take(key, size):
                    await send_error(send, self._busy())
                    return
                taken += size
                if not message.get("more_body", False):
                    break
            replay = iter(messages)

            async def replayed() -> Message:
                try:
                    return next(replay)
                except StopIteration:
                    return await receive()

            await self.app(scope, replayed, send)
        finally:
            if taken:
                self.budget.give(key, taken)

    def _take(self, key: str, nbytes: int) -> bool:
        return not nbytes or self.budget.take(key, nbytes)

    def _busy(self) -> ApiError:
        return ApiError(503, "request_bodies_busy",
                        f"the server is already receiving {self.budget.used()} bytes of "
                        "request bodies (its budget is "
                        f"{self.budget.total}, each key's half of it); retry shortly",
                        retry_after=1)

    async def _refuse(self, send: Send) -> None:
        await send_error(send, ApiError(
            413, "request_too_large",
            f"request body is larger than {self.max_bytes} bytes (the server's "
            "max_request_bytes); send smaller inputs or upload files one by one"))


async def send_error(send: Send, err: ApiError) -> None:
    """Answer `err` as JSON and close the connection: any unread body is never read."""
    body = json.dumps({"error": {"code": err.code, "message": err.message}}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    if err.retry_after is not None:
        headers.append((b"retry-after", str(err.retry_after).encode()))
    if err.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _content_length(scope: MutableMapping[str, Any]) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
