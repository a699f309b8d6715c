"""The console's pages, mounted on the API app by `mount`."""

from __future__ import annotations

import posixpath
import time
from importlib import resources
from typing import Annotated, Any
from urllib.parse import quote, urlencode

import anyio.to_thread
import jinja2
from fastapi import APIRouter, FastAPI, Form, Query, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from ...agent.trace import TraceStore
from ...errors import ExecboxError
from ...records import RunRecord
from ..deps import State, authenticate
from ..errors import ApiError
from . import queries, views
from .access import COOKIE, LoginNeeded, Viewer, ViewerDep, check_form, check_origin, logins

PAGE_SIZE = 50
PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
# An artifact is the run's bytes: nothing in it may run, even opened on its own.
ARTIFACT_CSP = "default-src 'none'; sandbox"
PAGE_HEADERS = {
    "Content-Security-Policy": PAGE_CSP,
    "X-Content-Type-Options": "nosniff",
    # Not no-referrer: under it Chromium sends `Origin: null` with forms, and the origin check
    # would refuse the console's own.
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}

router = APIRouter(prefix="/console", include_in_schema=False)
_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("execbox.server.console", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)
_templates.filters.update(
    visible=views.visible, when=views.when, size=views.size, b64=views.b64, clip=views.clip
)


def mount(app: FastAPI) -> None:
    """Serve the console at /console on `app`."""
    static = resources.files("execbox.server.console") / "static"
    app.mount("/console/static", StaticFiles(directory=str(static)), name="console-static")
    app.include_router(router)

    @app.exception_handler(LoginNeeded)
    async def to_login(request: Request, _exc: LoginNeeded) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse("/console/login?" + urlencode({"next": target}), 303)


def page(name: str, viewer: Viewer | None, status: int = 200, **context: Any) -> HTMLResponse:
    html = _templates.get_template(name).render(viewer=viewer, **context)
    return HTMLResponse(html, status, headers=PAGE_HEADERS)


def _safe_next(target: str | None) -> str:
    """Only a console path: a login link must not send the browser to another site."""
    if target and target.startswith("/console/") and not target.startswith("/console//"):
        return target
    return "/console/runs"


@router.get("")
async def home() -> Response:
    return RedirectResponse("/console/runs", 303)


@router.get("/login")
async def login_form(next: str | None = None) -> HTMLResponse:  # noqa: A002 - the query's name
    return page("login.html", None, next=_safe_next(next), problem=None)


@router.post("/login")
async def login(
    request: Request,
    state: State,
    key: Annotated[str, Form(max_length=600)],
    next: Annotated[str | None, Form()] = None,  # noqa: A002 - the form field's name
) -> Response:
    check_origin(request)
    key = key.strip()
    try:
        await anyio.to_thread.run_sync(
            authenticate, state.key_store(), key, limiter=state.auth_limiter
        )
    except ApiError as err:
        return page("login.html", None, 401, next=_safe_next(next), problem=err.message)
    token = await anyio.to_thread.run_sync(
        lambda: logins(state).open(key), limiter=state.auth_limiter
    )
    response = RedirectResponse(_safe_next(next), 303)
    response.set_cookie(
        COOKIE,
        token,
        path="/console",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
async def logout(
    request: Request, state: State, viewer: ViewerDep, csrf: Annotated[str, Form()] = ""
) -> Response:
    check_form(request, viewer, csrf)
    token = request.cookies.get(COOKIE)
    if viewer.login is not None and token:
        await state.blocking(lambda: logins(state).close(token))
    response = RedirectResponse("/console/login", 303)
    response.delete_cookie(COOKIE, path="/console", httponly=True, samesite="strict")
    return response


# ---- runs -----------------------------------------------------------------------------------


@router.get("/runs")
async def runs_page(
    state: State,
    viewer: ViewerDep,
    status: Annotated[str, Query(max_length=32)] = "",
    profile: Annotated[str, Query(max_length=64)] = "",
    language: Annotated[str, Query(max_length=32)] = "",
    environment: Annotated[str, Query(max_length=32)] = "",
    period: Annotated[str, Query(max_length=8)] = "",
    q: Annotated[str, Query(max_length=200)] = "",
    page_no: Annotated[int, Query(alias="page", ge=1, le=100_000)] = 1,
    part: Annotated[str, Query(max_length=8)] = "",
) -> HTMLResponse:
    since = time.time() - views.PERIODS[period] if period in views.PERIODS else None
    filters = {
        "status": status,
        "profile": profile,
        "language": language,
        "environment": environment,
        "period": period,
        "q": q,
    }

    def load() -> list[queries.RunRow]:
        store = state.executor.store
        store.settle()
        return queries.run_rows(
            store.engine,
            viewer.runs(state),
            limit=PAGE_SIZE + 1,
            offset=(page_no - 1) * PAGE_SIZE,
            status=status or None,
            profile=profile or None,
            language=language or None,
            environment=environment or None,
            since=since,
            code_contains=q or None,
        )

    found = await state.blocking(load)
    shown = [f for f in filters.items() if f[1]]
    context: dict[str, Any] = {
        "records": found[:PAGE_SIZE],
        "filters": filters,
        "page_no": page_no,
        "more": len(found) > PAGE_SIZE,
        "query": lambda **changes: urlencode(
            [(k, v) for k, v in {**dict(shown), **changes}.items() if v]
        ),
        "periods": list(views.PERIODS),
    }
    return page("rows.html" if part == "rows" else "runs.html", viewer, **context)


def _visible_record(state: State, viewer: Viewer, run_id: str) -> RunRecord:
    record = state.executor.store.get(run_id) if viewer.may_see(state, run_id) else None
    if record is None:
        raise ApiError(404, "run_not_found", f"no run {run_id!r}")
    return record


@router.get("/runs/{run_id}")
async def run_page(run_id: str, state: State, viewer: ViewerDep) -> HTMLResponse:
    record = await state.blocking(lambda: _visible_record(state, viewer, run_id))
    derived = await state.blocking(
        lambda: state.executor.store.list(source_run_id=run_id, within=viewer.runs(state))
    )
    stored = await state.blocking(
        lambda: {
            a.path: state.executor.store.artifact_data(run_id, a.path) is not None
            for a in record.result.artifacts
        }
    )
    return page(
        "run.html",
        viewer,
        r=record,
        result=record.result,
        lines=views.code_lines(record),
        derived=derived,
        stored=stored,
        inline=views.INLINE_IMAGES,
        quote=quote,
    )


@router.get("/runs/{run_id}/artifacts/{path:path}")
async def artifact(
    run_id: str, path: str, state: State, viewer: ViewerDep, download: int = 0
) -> Response:
    def load() -> tuple[bytes, str]:
        record = _visible_record(state, viewer, run_id)
        mime = next((a.mime_type for a in record.result.artifacts if a.path == path), None)
        data = state.executor.store.artifact_data(run_id, path) if mime else None
        if data is None or mime is None:
            raise ApiError(404, "artifact_not_found", f"run {run_id} keeps no artifact {path!r}")
        return data, mime

    data, mime = await state.blocking(load)
    name = quote(posixpath.basename(path) or "artifact", safe="")
    headers = {
        "Content-Security-Policy": ARTIFACT_CSP,
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "private, no-store",
    }
    if mime in views.INLINE_IMAGES and not download:
        headers["Content-Disposition"] = f"inline; filename*=UTF-8''{name}"
        return Response(data, media_type=mime, headers=headers)
    # Anything else, HTML and SVG included, only as a download: never opened as a page.
    headers["Content-Disposition"] = f"attachment; filename*=UTF-8''{name}"
    return Response(data, media_type="application/octet-stream", headers=headers)


@router.post("/runs/{run_id}/approve")
async def approve(
    run_id: str,
    request: Request,
    state: State,
    viewer: ViewerDep,
    csrf: Annotated[str, Form()] = "",
) -> Response:
    check_form(request, viewer, csrf)
    await state.blocking(lambda: _visible_record(state, viewer, run_id))
    if not viewer.admin:  # the hold is no gate if the key that sent the run can release it
        raise ApiError(
            403,
            "approval_needs_admin",
            "a held run is released by an admin key, or by `execbox runs approve` on the "
            "server's host; a tenant's key can only reject it",
        )
    keys = state.key_store()
    owner = await state.blocking(lambda: keys.owner_of(run_id))

    def release() -> str:
        result = state.executor.approve(run_id, approved_by=f"{viewer.name} (console)")
        if owner is not None:  # the released run is its owner's, whoever approved it
            keys.claim_run(result.run_id, owner)
        return result.run_id

    try:
        new_id = await state.running(release)
    except ExecboxError as exc:
        raise ApiError(409, "not_approvable", str(exc)) from exc
    return RedirectResponse(f"/console/runs/{quote(new_id)}", 303)


@router.post("/runs/{run_id}/reject")
async def reject(
    run_id: str,
    request: Request,
    state: State,
    viewer: ViewerDep,
    csrf: Annotated[str, Form()] = "",
) -> Response:
    check_form(request, viewer, csrf)

    def turn_down() -> bool:
        _visible_record(state, viewer, run_id)
        return state.executor.store.mark_rejected(run_id, f"{viewer.name} (console)")

    if not await state.blocking(turn_down):
        raise ApiError(409, "not_rejectable", f"run {run_id} is not held, or already decided")
    return RedirectResponse(f"/console/runs/{quote(run_id)}", 303)


# ---- sessions, agent answers, overview ------------------------------------------------------


@router.get("/sessions")
async def sessions_page(state: State, viewer: ViewerDep) -> HTMLResponse:
    rows = await state.blocking(
        lambda: queries.sessions(state.executor.store.engine, viewer.runs(state))
    )
    return page("sessions.html", viewer, sessions=rows, open_ids=state.sessions.open_ids())


@router.get("/sessions/{session_id}")
async def session_page(
    session_id: str,
    state: State,
    viewer: ViewerDep,
    page_no: Annotated[int, Query(alias="page", ge=1, le=100_000)] = 1,
) -> HTMLResponse:
    first = (page_no - 1) * views.SESSION_PAGE_CELLS
    cells = await state.blocking(
        lambda: state.executor.store.list(
            session_id=session_id,
            within=viewer.runs(state),
            oldest_first=True,
            limit=views.SESSION_PAGE_CELLS + 1,
            offset=first,
        )
    )
    if not cells:
        raise ApiError(404, "session_not_found", f"no session {session_id!r}")
    return page(
        "session.html",
        viewer,
        session_id=session_id,
        cells=cells[: views.SESSION_PAGE_CELLS],
        first=first,
        page_no=page_no,
        more=len(cells) > views.SESSION_PAGE_CELLS,
        clip_at=views.CELL_TEXT_CHARS,
    )


def _asks(state: State) -> TraceStore:
    return TraceStore(state.executor.store.engine)


@router.get("/asks")
async def asks_page(state: State, viewer: ViewerDep) -> HTMLResponse:
    # Asks are the local user's (`execbox ask` records no tenant): an admin's to read.
    asks = await state.blocking(lambda: _asks(state).list(limit=100)) if viewer.admin else []
    return page("asks.html", viewer, asks=asks)


@router.get("/asks/{ask_id}")
async def ask_page(ask_id: str, state: State, viewer: ViewerDep) -> HTMLResponse:
    trace = await state.blocking(lambda: _asks(state).get(ask_id)) if viewer.admin else None
    if trace is None:
        raise ApiError(404, "ask_not_found", f"no agent answer {ask_id!r}")
    return page("ask.html", viewer, ask=trace)


@router.get("/overview")
async def overview_page(state: State, viewer: ViewerDep) -> HTMLResponse:
    now = time.time()
    store = state.executor.store

    def load() -> list[queries.RunRow]:
        store.settle()
        return queries.run_rows(
            store.engine,
            viewer.runs(state),
            since=now - views.OVERVIEW_WINDOW_S,
            limit=views.OVERVIEW_MAX_RUNS,
        )

    records = await state.blocking(load)
    return page("overview.html", viewer, o=views.overview(records, now))
