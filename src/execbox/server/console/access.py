"""Who is looking at the console: the key from the Authorization header, or the login its
cookie names (`logins`: the cookie holds a random token, never the key), and the token that
ties a state-changing form to that login."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Annotated

import anyio.to_thread
import sqlalchemy as sa
from fastapi import Depends, Request

from ..auth import ADMIN, Tenant
from ..deps import authenticate, get_state
from ..errors import ApiError
from ..local import LOCAL_PEER_KEY
from ..state import ANONYMOUS_TENANT, LOCAL_TENANT, ServerState
from .logins import Login, Logins, logins_for

COOKIE = "execbox_console"
# The form tokens of keyless viewers (the local socket, --no-auth) are keyed per process: a
# form from before a restart is refused, never forged. A login's token is its own.
_CSRF_KEY = secrets.token_bytes(32)
MAX_COOKIE = 100  # a login token is 43 characters: anything far longer is no login's


class LoginNeeded(Exception):
    """No key came with a page request: the browser is sent to the login form."""


@dataclass(frozen=True)
class Viewer:
    """The caller of a console page: a tenant (its own runs) or an admin (every run)."""

    name: str
    admin: bool
    by_bearer: bool
    """The key came in the Authorization header, which no other site can make a browser send."""
    tenant: Tenant | None = None
    """The key's tenant, whose in-flight limit a run released here counts against."""
    login: Login | None = None
    """The login the cookie named (None: the header's key, or no key needed)."""

    def runs(self, state: ServerState) -> sa.Select[tuple[str]] | None:
        """The ids this viewer may see, as a query; None: every run."""
        return None if self.admin else state.key_store().runs_of(self.name)

    def may_see(self, state: ServerState, run_id: str) -> bool:
        return self.admin or state.key_store().owner_of(run_id) == self.name

    @property
    def csrf(self) -> str:
        """The token a form of this viewer carries: its login's own, else bound to its name."""
        if self.login is not None:
            return self.login.csrf
        return hmac.new(_CSRF_KEY, self.name.encode(), hashlib.sha256).hexdigest()


def bearer_key(request: Request) -> str | None:
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    return key.strip() or None if scheme.lower() == "bearer" else None


def logins(state: ServerState) -> Logins:
    """The server's console logins. Blocking: call it off the event loop."""
    return logins_for(state.key_store(), state.settings.console_idle_s)


async def get_viewer(request: Request, state: Annotated[ServerState, Depends(get_state)]) -> Viewer:
    """The viewer, from the Authorization header first, then the login cookie."""
    if request.scope.get(LOCAL_PEER_KEY):
        return Viewer(LOCAL_TENANT.name, False, False, LOCAL_TENANT)
    if not state.settings.auth:
        return Viewer(ANONYMOUS_TENANT.name, False, False, ANONYMOUS_TENANT)
    key = bearer_key(request)
    login: Login | None = None
    if key is not None:
        tenant = await anyio.to_thread.run_sync(
            authenticate, state.key_store(), key, limiter=state.auth_limiter
        )
    else:
        token = request.cookies.get(COOKIE, "")
        if token and len(token) <= MAX_COOKIE:
            login = await anyio.to_thread.run_sync(
                lambda: logins(state).find(token), limiter=state.auth_limiter
            )
        if login is None:  # no cookie, or one whose login ended: log in again
            raise LoginNeeded
        tenant = login.tenant
    state.quotas.count(tenant)  # a page counts against the key's rate as an API call does
    return Viewer(tenant.name, tenant.role == ADMIN, login is None, tenant, login)


def check_form(request: Request, viewer: Viewer, token: str | None) -> None:
    """Refuse a state-changing request sent from another site: its Origin, when sent, must be
    this server's, and a form not authenticated by its header must carry the viewer's token."""
    check_origin(request)
    if not viewer.by_bearer and not hmac.compare_digest(token or "", viewer.csrf):
        raise ApiError(403, "bad_csrf_token", "the form's token is missing or stale: reload")


def check_origin(request: Request) -> None:
    """Refuse a form whose Origin, when the browser sends one, is not this server's."""
    origin = request.headers.get("origin")
    own = f"{request.url.scheme}://{request.headers.get('host', request.url.netloc)}"
    if origin is not None and origin != own:
        raise ApiError(403, "cross_site", "a console form from another site is refused")


ViewerDep = Annotated[Viewer, Depends(get_viewer)]
