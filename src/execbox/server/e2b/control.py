"""E2B's control plane: sandboxes created, connected, listed, timed out and killed.

A sandbox is an execbox Python session (its id is the sandbox's id), started as
`POST /v1/sessions` starts one: the key's session quota, its share of the server's sessions and
the server's idle and lifetime caps all hold. The template names an execbox environment (E2B's
own template names take the default one); metadata `execbox.profile` picks the policy profile."""

from __future__ import annotations

import os
import time
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from ...contract import MIB
from ...errors import UsageError
from ...sessions import SessionUsage
from ..errors import ApiError
from ..state import ServerState
from .access import (
    E2BError,
    Sandbox,
    Sandboxes,
    api_tenant,
    iso,
    new_token,
    owned,
    unsupported,
)

# The envd version the face answers as: the SDKs pick their protocol features by it (octet
# stream uploads since 0.5.7; per-file metadata, which execbox does not keep, since 0.6.2).
ENVD_VERSION = "0.5.7"
# E2B's own template names: the default environment.
E2B_TEMPLATES = frozenset({"base", "code-interpreter-v1", "code-interpreter", "desktop"})
DEFAULT_TIMEOUT_S = 300
PROFILE_KEY, ENVIRONMENT_KEY = "execbox.profile", "execbox.environment"
CELL_TIMEOUT_KEY = "execbox.timeout_s"  # each cell's and command's wall time


class NewSandbox(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    templateID: str = Field(min_length=1, max_length=200)
    timeout: int = Field(DEFAULT_TIMEOUT_S, ge=1)
    autoPause: bool = False
    autoResume: Any = None
    secure: bool | None = None
    allow_internet_access: bool | None = None
    network: Any = None
    metadata: dict[str, str] | None = None
    envVars: dict[str, str] | None = None
    mcp: Any = None
    iam: Any = None
    volumeMounts: Any = None


class Timeout(BaseModel):
    timeout: int = Field(ge=0)


class Connect(BaseModel):
    model_config = ConfigDict(extra="allow")

    timeout: int | None = Field(None, ge=1)


def _refuse_missing(body: NewSandbox) -> None:
    """What an E2B sandbox may ask for that an execbox session cannot be."""
    if body.autoPause or body.autoResume:
        raise unsupported(
            "pausing sandboxes (autoPause, autoResume)", "a session ends at its timeout"
        )
    if body.allow_internet_access or body.network:
        raise unsupported(
            "internet access from a sandbox made through the E2B API",
            "its sessions have no network; use execbox's own API with a network allowlist",
        )
    if body.mcp:
        raise unsupported("MCP servers inside sandboxes", "run MCP servers outside execbox")
    if body.volumeMounts:
        raise unsupported("volume mounts", "upload files with sandbox.files.write")
    if body.iam:
        raise unsupported("IAM workload tokens", "pass what code needs as envs")


async def _environment(state: ServerState, template: str, metadata: dict[str, str]) -> str | None:
    name = metadata.get(ENVIRONMENT_KEY) or (None if template in E2B_TEMPLATES else template)
    if name is None:
        return None
    executor = state.executor
    try:
        await state.blocking(lambda: executor.environment(name))
    except UsageError as exc:
        raise E2BError(
            404,
            f"template {name!r} not found: execbox runs its built environments (execbox env "
            "list), and E2B's template names on the default one; templates built from "
            f"Dockerfiles are not supported ({exc})",
        ) from exc
    return name


def _cell_limits(metadata: dict[str, str]) -> dict[str, float] | None:
    """The session's limits from metadata: `execbox.timeout_s`, each cell's wall time (the
    profile's default otherwise; its maximum holds)."""
    given = metadata.get(CELL_TIMEOUT_KEY)
    if given is None:
        return None
    try:
        value = float(given)
    except ValueError:
        raise E2BError(400, f"metadata {CELL_TIMEOUT_KEY} is seconds, not {given!r}") from None
    if not 0 < value <= 3600:
        raise E2BError(400, f"metadata {CELL_TIMEOUT_KEY} is in (0, 3600], not {given}")
    return {"timeout_s": value}


def _lifetime(state: ServerState, timeout_s: int) -> float:
    most = state.settings.max_session_lifetime_s
    if timeout_s > most:
        raise E2BError(
            400,
            f"timeout is {timeout_s} s; this server allows sandboxes at most {most:g} s "
            "(execbox serve --max-session-lifetime)",
        )
    return float(timeout_s)


def _set_timeout(state: ServerState, sandbox: Sandbox, timeout_s: int) -> None:
    """The sandbox ends `timeout_s` from now (its sessions' lifetime and idle time)."""
    _lifetime(state, timeout_s)
    now = time.monotonic()
    for session in _sessions(state, sandbox):
        session.max_lifetime_s = now - session.created_at + timeout_s
        session.idle_timeout_s = min(
            session.max_lifetime_s, float(state.settings.max_session_idle_s)
        )
    sandbox.end_at = time.time() + timeout_s


def _sessions(state: ServerState, sandbox: Sandbox) -> list[Any]:
    ids = [sandbox.id, *(c.session_id for c in sandbox.contexts.values())]
    found = []
    for sid in dict.fromkeys(ids):
        try:
            session = state.sessions.get(sandbox.tenant, sid)
        except ApiError:  # ended long ago: the registry no longer remembers it
            continue
        if not session.closed:
            found.append(session)
    return found


def alive(state: ServerState, sandboxes: Sandboxes, sandbox: Sandbox) -> bool:
    """Whether the sandbox's main session is still open; a sandbox whose session ended
    (timeout, killed) is forgotten."""
    try:
        closed = state.sessions.get(sandbox.tenant, sandbox.id).closed
    except ApiError:  # ended long ago: the registry no longer remembers it
        closed = True
    if closed:
        sandboxes.drop(sandbox.id)
        return False
    return True


def _metric(sandbox: Sandbox, usage: SessionUsage, session: Any) -> dict[str, Any]:
    """E2B's SandboxMetric from the session's usage: CPU as a share of the server's CPUs since
    the previous sample (the first: since the sandbox started), memory against the session's
    limit, disk as the workspace's."""
    now = time.time()
    cpus = len(os.sched_getaffinity(0))
    since, cpu_before = sandbox.cpu_mark or (sandbox.started_at, 0)
    sandbox.cpu_mark = (now, usage.cpu_ns)
    elapsed_ns = max(now - since, 1e-3) * 1e9
    percent = min(100.0, max(0.0, (usage.cpu_ns - cpu_before) / elapsed_ns / cpus * 100))
    return {
        "timestamp": iso(now),
        "timestampUnix": int(now),
        "cpuCount": cpus,
        "cpuUsedPct": round(percent, 2),
        "memUsed": usage.memory_bytes,
        "memTotal": session.limits.memory_mib * MIB,
        "memCache": usage.memory_cache_bytes,
        "diskUsed": usage.disk_bytes,
        "diskTotal": usage.disk_total_bytes,
    }


def _created(sandbox: Sandbox) -> dict[str, Any]:
    return {
        "templateID": sandbox.template,
        "sandboxID": sandbox.id,
        "clientID": "execbox",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": sandbox.token,
        "trafficAccessToken": sandbox.token,
        "domain": None,
    }


def _listed(sandbox: Sandbox, state: ServerState) -> dict[str, Any]:
    limits = state.sessions.get(sandbox.tenant, sandbox.id)
    memory = getattr(getattr(limits, "limits", None), "memory_mib", 0)
    disk = getattr(getattr(limits, "limits", None), "disk_mib", 0)
    return {
        "templateID": sandbox.template,
        "sandboxID": sandbox.id,
        "clientID": "execbox",
        "startedAt": iso(sandbox.started_at),
        "endAt": iso(sandbox.end_at),
        "cpuCount": 1,
        "memoryMB": memory,
        "diskSizeMB": disk,
        "state": "running",
        "envdVersion": ENVD_VERSION,
        "metadata": sandbox.metadata,
    }


def router(state: ServerState, sandboxes: Sandboxes) -> APIRouter:  # noqa: C901 - one closure per route
    api = APIRouter()

    async def start(body: NewSandbox, request: Request) -> dict[str, Any]:
        tenant = await api_tenant(state, request)
        _refuse_missing(body)
        metadata = dict(body.metadata or {})
        executor = state.executor
        environment = await _environment(state, body.templateID, metadata)
        lifetime = _lifetime(state, body.timeout)
        profile = metadata.get(PROFILE_KEY, "data")
        env = dict(body.envVars or {})
        limits = _cell_limits(metadata)
        release = state.quotas.hold(tenant)
        try:
            state.sessions.reserve(tenant, await state.blocking(state.shares))
            session = None
            try:
                session = await state.running(
                    lambda: executor.session(
                        language="python",
                        profile=profile,
                        environment=environment,
                        env=env or None,
                        limits=limits,
                        idle_timeout_s=min(lifetime, state.settings.max_session_idle_s),
                        max_lifetime_s=lifetime,
                        tenant=tenant.name,
                    )
                )
            finally:
                state.sessions.add(tenant, session)
        finally:
            release()
        now = time.time()
        sandbox = Sandbox(
            id=session.id,
            tenant=tenant,
            template=body.templateID,
            metadata=metadata,
            token=new_token(),
            profile=profile,
            environment=environment,
            env=env,
            limits=limits,
            started_at=now,
            end_at=now + lifetime,
            key=request.headers.get("x-api-key") or None,
        )
        for gone in sandboxes.of(tenant):  # ended by their timeout since last seen
            alive(state, sandboxes, gone)
        sandboxes.add(sandbox)
        return _created(sandbox)

    @api.post("/v2/sandboxes", status_code=201)
    async def create_v2(body: NewSandbox, request: Request) -> dict[str, Any]:
        return await start(body, request)

    @api.post("/sandboxes", status_code=201)
    async def create(body: NewSandbox, request: Request) -> dict[str, Any]:
        return await start(body, request)

    async def connect(sandbox_id: str, body: Connect, request: Request) -> JSONResponse:
        tenant = await api_tenant(state, request)
        sandbox = owned(sandboxes, tenant, sandbox_id)
        if not alive(state, sandboxes, sandbox):
            raise E2BError(404, f"sandbox {sandbox_id!r} not found (it has ended)")
        sandbox.key = request.headers.get("x-api-key") or None  # the tenant's current key
        if body.timeout is not None and time.time() + body.timeout > sandbox.end_at:
            _set_timeout(state, sandbox, body.timeout)  # connecting never shortens it
        return JSONResponse(_created(sandbox))

    @api.post("/v2/sandboxes/{sandbox_id}/connect")
    async def connect_v2(sandbox_id: str, body: Connect, request: Request) -> Response:
        return await connect(sandbox_id, body, request)

    @api.post("/sandboxes/{sandbox_id}/connect")
    async def connect_v1(sandbox_id: str, body: Connect, request: Request) -> Response:
        return await connect(sandbox_id, body, request)

    @api.get("/sandboxes/{sandbox_id}")
    async def info(sandbox_id: str, request: Request) -> dict[str, Any]:
        tenant = await api_tenant(state, request)
        sandbox = owned(sandboxes, tenant, sandbox_id)
        if not alive(state, sandboxes, sandbox):
            raise E2BError(404, f"sandbox {sandbox_id!r} not found (it has ended)")
        return {**_listed(sandbox, state), "envdAccessToken": sandbox.token}

    @api.get("/v2/sandboxes")
    async def list_v2(request: Request) -> list[dict[str, Any]]:
        tenant = await api_tenant(state, request)
        wanted = request.query_params.get("state", "running,paused").split(",")
        found = [s for s in sandboxes.of(tenant) if alive(state, sandboxes, s)]
        if "running" not in wanted:
            found = []
        meta = request.query_params.get("metadata")
        if meta:
            from urllib.parse import parse_qsl

            pairs = dict(parse_qsl(meta))
            found = [s for s in found if all(s.metadata.get(k) == v for k, v in pairs.items())]
        found.sort(key=lambda s: s.started_at)
        return [_listed(s, state) for s in found]

    @api.get("/sandboxes")
    async def list_v1(request: Request) -> list[dict[str, Any]]:
        return await list_v2(request)

    @api.delete("/sandboxes/{sandbox_id}", status_code=204)
    async def kill(sandbox_id: str, request: Request) -> Response:
        tenant = await api_tenant(state, request)
        sandbox = owned(sandboxes, tenant, sandbox_id)
        sandboxes.drop(sandbox.id)
        release = state.quotas.hold(tenant)
        try:
            for session in _sessions(state, sandbox):
                await state.blocking(session.close)
        finally:
            release()
        return Response(status_code=204)

    @api.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
    async def timeout(sandbox_id: str, body: Timeout, request: Request) -> Response:
        tenant = await api_tenant(state, request)
        sandbox = owned(sandboxes, tenant, sandbox_id)
        if not alive(state, sandboxes, sandbox):
            raise E2BError(404, f"sandbox {sandbox_id!r} not found (it has ended)")
        _set_timeout(state, sandbox, max(body.timeout, 1))
        return Response(status_code=204)

    for path, feature, instead in (
        ("/sandboxes/{sandbox_id}/pause", "pausing sandboxes", "a session ends at its timeout"),
        ("/sandboxes/{sandbox_id}/resume", "resuming sandboxes", "start a new sandbox"),
        ("/sandboxes/{sandbox_id}/snapshots", "snapshots", "write the files you need out"),
        ("/sandboxes/{sandbox_id}/fork", "forking sandboxes", "start a new sandbox"),
        ("/sandboxes/{sandbox_id}/refreshes", "refreshing sandboxes", "use set_timeout"),
    ):
        _refusal(api, state, sandboxes, path, feature, instead)

    @api.put("/sandboxes/{sandbox_id}/network")
    async def network(sandbox_id: str, request: Request) -> None:
        owned(sandboxes, await api_tenant(state, request), sandbox_id)
        raise unsupported("changing a sandbox's network", "its sessions have no network")

    @api.get("/sandboxes/{sandbox_id}/metrics")
    async def metrics(sandbox_id: str, request: Request) -> list[dict[str, Any]]:
        sandbox = owned(sandboxes, await api_tenant(state, request), sandbox_id)
        if not alive(state, sandboxes, sandbox):
            raise E2BError(404, f"sandbox {sandbox_id!r} not found (it has ended)")
        session = state.sessions.get(sandbox.tenant, sandbox.id)
        release = state.quotas.hold(sandbox.tenant)
        try:
            usage = await state.on_session(sandbox.id, session.usage, cell=False)
        except ApiError as exc:
            if exc.status != 409:
                raise
            # A cell runs: the last sample stands (E2B's are taken every few seconds too).
            return [sandbox.last_metric] if sandbox.last_metric else []
        finally:
            release()
        sandbox.last_metric = _metric(sandbox, usage, session)
        return [sandbox.last_metric]

    @api.api_route("/templates{rest:path}", methods=["GET", "POST", "PATCH", "DELETE"])
    async def templates(rest: str, request: Request) -> None:
        await api_tenant(state, request)
        raise unsupported(
            "templates built from Dockerfiles",
            "build an execbox environment (execbox env build) and name it as the template",
        )

    return api


def _refusal(
    api: APIRouter,
    state: ServerState,
    sandboxes: Sandboxes,
    path: str,
    feature: str,
    instead: str,
) -> None:
    async def refuse(sandbox_id: str, request: Request) -> None:
        owned(sandboxes, await api_tenant(state, request), sandbox_id)
        raise unsupported(feature, instead)

    api.add_api_route(path, refuse, methods=["POST"])
