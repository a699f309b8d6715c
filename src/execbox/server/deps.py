"""Request dependencies: the server state and the authenticated tenant."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .auth import KeyRevoked, Tenant
from .errors import ApiError
from .state import LOCAL_TENANT, ServerState

bearer = HTTPBearer(auto_error=False, description="An API key from `execbox keys create`.")


def get_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.execbox
    return state


def get_tenant(state: Annotated[ServerState, Depends(get_state)],
               credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
               ) -> Tenant:
    """The caller's tenant from `Authorization: Bearer KEY` (a sync dependency: FastAPI runs
    it on a worker thread, so the key lookup never blocks the event loop)."""
    if not state.settings.auth:
        return LOCAL_TENANT
    if credentials is None:
        raise ApiError(401, "missing_api_key",
                       "send an API key as 'Authorization: Bearer KEY' (execbox keys create)")
    try:
        tenant = state.key_store().authenticate(credentials.credentials)
    except KeyRevoked as exc:
        raise ApiError(401, "revoked_api_key", f"the key {exc} has been revoked") from exc
    if tenant is None:
        raise ApiError(401, "invalid_api_key", "unknown API key")
    return tenant


State = Annotated[ServerState, Depends(get_state)]
Caller = Annotated[Tenant, Depends(get_tenant)]
