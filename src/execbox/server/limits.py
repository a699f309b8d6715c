"""What a request must pass before the application reads its body, as plain ASGI middleware.

`Admission` (outermost but for `hosts.HostCheck`) checks the caller's key and counts the
request against the key's rate before any of the body is read: an unknown key is answered 401
and its connection closed with the body still unread, and every authenticated request counts,
whatever it ends in (404, 422).
`BodySizeLimit` then refuses a body past the cap with a JSON 413 before the application sees
any of it (declared Content-Length or counted while reading), and keeps the bodies of all
requests in flight within a server-wide budget, each key within half of it (past either, 503).
`SecretsCap` refuses a run, session or cell registering more secrets than a request may before
its JSON is parsed: the model's own check comes only after the whole body is decoded.

The E2B face (/e2b/, when served) is admitted the same way, its credentials read from its own
headers: its control plane's `X-API-KEY`, or a sandbox's id and access token on the sandbox's
own calls; its refusals are in E2B's error shape. So a stranger's body is never booked, and
never under a tenant's key.

Admission also bounds a key's requests of any kind in flight (refused ones included), and a key
whose requests keep being refused waits its turn before the next is read (`quotas.Backoff`):
a client that ignores Retry-After slows itself, not the other tenants.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import re
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..contract import MAX_SECRETS
from .deps import tenant_of
from .errors import ApiError
from .local import LOCAL_PEER_KEY
from .quotas import BodyBudget
from .state import ANONYMOUS_TENANT, LOCAL_TENANT

if TYPE_CHECKING:
    from .auth import Tenant
    from .state import ServerState

TENANT_KEY = "execbox.tenant"  # the scope's authenticated tenant, for the routes' dependency
TRUST_KEY = "execbox.trust"  # the connection's "an authenticated request came" callback (guard)
# What a refusal of the key's own request answers with: a key that keeps getting these is given
# back-pressure. Not 503: a full server is every tenant's load, not this key's doing.
REFUSALS = frozenset({400, 409, 413, 422, 429})
E2B_PREFIX = "/e2b/"
# The E2B control plane's paths (an API key); every other E2B route is a sandbox's own call.
_E2B_CONTROL = ("/e2b/sandboxes", "/e2b/v2/sandboxes", "/e2b/templates")


class Admission:
    """Authenticate and count every /v1/ and /e2b/ request before its body is read."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    # One body on purpose: /v1's hot path pays no extra call for the E2B face.
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # noqa: C901
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        e2b = False
        if not scope["path"].startswith("/v1/"):
            e2b = self.state.e2b is not None and scope["path"].startswith(E2B_PREFIX)
            if not e2b:
                await self.app(scope, receive, send)
                return
        state = self.state
        try:
            if e2b:
                tenant = await self._e2b_tenant(scope)
            elif scope.get(LOCAL_PEER_KEY):
                tenant = LOCAL_TENANT
            elif not state.settings.auth:
                tenant = ANONYMOUS_TENANT
            else:
                tenant = await anyio.to_thread.run_sync(
                    tenant_of, state.key_store(), _bearer(scope), limiter=state.auth_limiter
                )
                trust: Callable[[], None] | None = scope.get(TRUST_KEY)
                if trust is not None:
                    trust()
        except ApiError as err:
            state.metrics.rejected.labels(code=err.code).inc()
            await send_error(send, err, e2b=e2b)
            return
        backoff, key = state.backoff, tenant.name
        turn = backoff.turn(key)
        if turn is None:
            await self._refuse(
                send,
                e2b,
                key,
                ApiError(
                    429,
                    "backing_off",
                    f"key {key!r} keeps sending requests that are refused; "
                    "its requests are now spaced out and this one's turn is too far away: honour "
                    "Retry-After",
                    retry_after=math.ceil(backoff.max_wait_s),
                ),
            )
            return
        if turn:
            await asyncio.sleep(turn)  # its turn: on the loop, holding no thread
        try:
            leave = state.quotas.enter(tenant)
        except ApiError as err:
            backoff.refused(key)
            await self._refuse(send, e2b, key, err)
            return
        status = 0

        async def watched(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            try:
                state.quotas.count(tenant)
            except ApiError as err:
                backoff.refused(key)
                await self._refuse(send, e2b, key, err)
                return
            scope[TENANT_KEY] = tenant
            await self.app(scope, receive, watched)
        finally:
            leave()
            if status in REFUSALS:
                backoff.refused(key)
            elif 200 <= status < 400:
                backoff.served(key)

    async def _e2b_tenant(self, scope: Scope) -> Tenant:
        """The tenant an E2B request comes from: its control plane's `X-API-KEY`, or on a
        sandbox's own call the sandbox's, once its access token matches (and, with keys on, the
        key that made or last connected it is still valid)."""
        state = self.state
        trusted = state.settings.auth
        if scope["path"].startswith(_E2B_CONTROL):
            if not trusted:
                return ANONYMOUS_TENANT
            tenant = await anyio.to_thread.run_sync(
                tenant_of,
                state.key_store(),
                _header(scope, b"x-api-key"),
                limiter=state.auth_limiter,
            )
        else:
            assert state.e2b is not None  # checked by the caller
            sandbox_id = _header(scope, b"e2b-sandbox-id") or ""
            sandbox = state.e2b.get(sandbox_id)
            if sandbox is None:
                # E2B's proxy words for a sandbox that is gone: the SDKs map them to "not running".
                raise ApiError(
                    502, "sandbox_not_found", f"The sandbox {sandbox_id[:64]!r} was not found"
                )
            given = _header(scope, b"x-access-token") or _header(scope, b"e2b-traffic-access-token")
            if not hmac.compare_digest((given or "").encode(), sandbox.token.encode()):
                raise ApiError(
                    401, "unauthorized", "missing or wrong access token for this sandbox"
                )
            tenant = sandbox.tenant
            if trusted:
                # A revoked key's tokens go with it, as its execbox requests stop at the next one.
                tenant = await anyio.to_thread.run_sync(
                    tenant_of, state.key_store(), sandbox.key, limiter=state.auth_limiter
                )
            trusted = True  # the token is the sandbox's secret, keys or not
        trust: Callable[[], None] | None = scope.get(TRUST_KEY) if trusted else None
        if trust is not None:
            trust()
        return tenant

    async def _refuse(self, send: Send, e2b: bool, key: str, err: ApiError) -> None:
        """Answer Admission's own refusal of a known key, after its back-off's spacing: a
        client that retries at once still waits."""
        self.state.metrics.rejected.labels(code=err.code).inc()
        spacing = self.state.backoff.spacing(key)
        if spacing:
            await asyncio.sleep(spacing)
        await send_error(send, err, e2b=e2b)


def _header(scope: Scope, name: bytes) -> str | None:
    for given, value in scope.get("headers", ()):
        if given == name:
            return value.decode("latin-1") or None
    return None


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, key = value.decode("latin-1").partition(" ")
            if scheme.lower() != "bearer":
                return None
            return key.strip() or None
    return None


# A key "secrets" whose list holds more than MAX_SECRETS strings, found in the raw JSON: a
# string literal cannot hold an unescaped quote, so `"secrets":` outside one is a key.
_STRING = rb'"[^"\\]*(?:\\.[^"\\]*)*"'
_OVER_SECRETS_CAP = re.compile(
    rb'"secrets"\s*:\s*\[\s*(?:' + _STRING + rb"\s*,\s*){" + str(MAX_SECRETS).encode() + rb'}"'
)
_SECRET_BODIES = re.compile(r"/v1/(?:runs|sessions/[^/]+/cells)(?:/stream)?|/v1/sessions")


class SecretsCap:
    """Refuse a JSON body that registers more than MAX_SECRETS secrets before it is parsed:
    decoding 50,000 secrets to find there are too many costs the server tens of ms a request.
    A body that spells the key otherwise (escapes) still meets the model's check."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or not _SECRET_BODIES.fullmatch(scope["path"])
        ):
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        while True:  # the size is capped by BodySizeLimit, outside
            message = await receive()
            if message["type"] != "http.request":
                return  # the client is gone: nobody to answer
            messages.append(message)
            if not message.get("more_body", False):
                break
        body = b"".join(m.get("body", b"") for m in messages)
        over = b'"secrets"' in body and _OVER_SECRETS_CAP.search(body) is not None
        del body  # the joined copy goes now: the application reads the messages as sent
        if over:
            await send_error(
                send,
                ApiError(
                    422,
                    "invalid_request",
                    f"secrets: more than {MAX_SECRETS} given; at most "
                    f"{MAX_SECRETS} per request (execbox.contract.MAX_SECRETS)",
                ),
            )
            return
        replay = iter(messages)
        del messages

        async def replayed() -> Message:
            return next(replay, None) or await receive()

        await self.app(scope, replayed, send)


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
            await self._refuse(scope, send)
            return
        tenant = scope.get(TENANT_KEY)
        key = tenant.name if tenant is not None else ""
        taken = 0
        try:
            if declared is not None:
                # The body is held (raw, then parsed) until the response ends: book it all now.
                if not self._take(key, declared):
                    await send_error(send, self._busy(), e2b=_is_e2b(scope))
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
                    await self._refuse(scope, send)
                    return
                if not self._take(key, size):
                    await send_error(send, self._busy(), e2b=_is_e2b(scope))
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
        return ApiError(
            503,
            "request_bodies_busy",
            f"the server is already receiving {self.budget.used()} bytes of "
            "request bodies (its budget is "
            f"{self.budget.total}, each key's half of it); retry shortly",
            retry_after=1,
        )

    async def _refuse(self, scope: Scope, send: Send) -> None:
        await send_error(
            send,
            ApiError(
                413,
                "request_too_large",
                f"request body is larger than {self.max_bytes} bytes (the server's "
                "max_request_bytes); send smaller inputs or upload files one by one",
            ),
            e2b=_is_e2b(scope),
        )


def _is_e2b(scope: Scope) -> bool:
    return bool(scope["path"].startswith(E2B_PREFIX))


async def send_error(send: Send, err: ApiError, *, e2b: bool = False) -> None:
    """Answer `err` as JSON and close the connection: any unread body is never read. On the
    E2B face in E2B's shape, `{"code": status, "message"}`, which its SDKs read."""
    shape = (
        {"code": err.status, "message": err.message}
        if e2b
        else {"error": {"code": err.code, "message": err.message}}
    )
    body = json.dumps(shape).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    if err.retry_after is not None:
        headers.append((b"retry-after", str(err.retry_after).encode()))
    if err.status == 401 and not e2b:
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
