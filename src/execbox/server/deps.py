"""Request dependencies: the server state and the authenticated caller (a tenant, or an admin
reading metrics).

The key lookup runs on the server's own small pool of authentication threads, never on the
pool that files, records and sessions use: however many requests a tenant has waiting there,
every other tenant is still authenticated at once."""

from __future__ import annotations

from typing import Annotated

import anyio.to_thread
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .auth import ADMIN, KeyRevoked, KeyStore, Tenant
from .errors import ApiError
from .state import ServerState

bearer = HTTPBearer(auto_error=False, description="An API key from `execbox keys create`.")


async def get_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.execbox
    return state


def authenticate(keys: KeyStore, key: str | None) -> Tenant:
    """The key's owner (any role), or a 401 ApiError that says what is wrong. Blocking: call
    it off the event loop."""
    if key is None:
        raise ApiError(
            401,
            "missing_api_key",
            "send an API key as 'Authorization: Bearer KEY' (execbox keys create)",
        )
    try:
        tenant = keys.authenticate(key)
    except KeyRevoked as exc:
        raise ApiError(401, "revoked_api_key", f"the key {exc} has been revoked") from exc
    if tenant is None:
        raise ApiError(401, "invalid_api_key", "unknown API key")
    return tenant


def tenant_of(keys: KeyStore, key: str | None) -> Tenant:
    """The tenant that runs code with `key`; an admin key is a 403 (it only reads metrics)."""
    tenant = authenticate(keys, key)
    if tenant.role == ADMIN:
        raise ApiError(
            403,
            "admin_key",
            f"the key {tenant.name!r} is an admin key: it reads "
            "/metrics; runs and sessions need a tenant's key",
        )
    return tenant


async def get_tenant(
    request: Request, _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> Tenant:
    """The caller's tenant, which `limits.Admission` authenticated (and counted) before the
    request's body was read."""
    tenant: Tenant | None = request.scope.get("execbox.tenant")
    if tenant is None:  # only a route outside /v1/ could get here
        raise ApiError(500, "internal_error", "the request was not admitted")
    return tenant


async def get_admin(
    state: Annotated[ServerState, Depends(get_state)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    """Only an admin key passes (`execbox keys create NAME --admin`): the server's metrics
    count every tenant's runs."""
    if not state.settings.auth:
        return
    keys, key = state.key_store(), credentials.credentials if credentials else None
    caller = await anyio.to_thread.run_sync(authenticate, keys, key, limiter=state.auth_limiter)
    if caller.role != ADMIN:
        raise ApiError(
            403,
            "admin_key_required",
            "the server's metrics need an admin key (execbox keys create NAME "
            "--admin); a tenant's key reads only its own runs",
        )


State = Annotated[ServerState, Depends(get_state)]
Caller = Annotated[Tenant, Depends(get_tenant)]
Admin = Depends(get_admin)
