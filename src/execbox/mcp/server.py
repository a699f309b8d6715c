"""The MCP server: execbox's runs, sessions and session files as MCP tools.

Built on the official MCP Python SDK (`MCPServer`). Every tool answers with the compact text
observation of `execbox.tools` (status, error type and line, output, artifacts, limit hints),
images for charts (a session cell's image outputs, a run's PNG artifacts), and the result as
structured content. The server uses one Executor for its lifetime; `serve` owns it.

Over streamable HTTP every request carries a key of the HTTP API (see `mcp.http`): tools run as
its tenant, under its quotas (runs in flight, runs per minute, open sessions), and reach only
its own sessions and runs. Over stdio (and in memory) the caller is the tenant 'local'.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import signal
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, ContentBlock, ImageContent, TextContent, ToolAnnotations
from pydantic import Field

from ..contract import ENVIRONMENT_NAME, BoundSecret, Limits, RunResult
from ..errors import ExecboxError
from ..request import bind_secrets, make_request
from ..server import malloc
from ..server.auth import KeyStore, Tenant
from ..server.errors import ApiError
from ..server.quotas import Quotas
from ..server.spool import ResultBudget, result_bound
from ..server.state import LOCAL_TENANT, EndedSession, SessionRegistry, Shares
from ..tools import (
    CODE_DESCRIPTIONS,
    RunPython,
    describe_environment,
    describe_language,
    format_observation,
)
from .http import TENANT_SCOPE_KEY

if TYPE_CHECKING:
    from ..executor import Executor
    from ..server.hosts import AllowedHosts
    from ..sessions import Session

log = logging.getLogger(__name__)

IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
DEFAULT_RESULT_BYTES = 2048 << 20  # as `execbox serve --max-result-mib`'s default
MAX_IMAGES = 8  # per tool result; a model reads a few charts, not a hundred
MAX_IMAGE_BYTES = 4 * 1024 * 1024
MAX_REMEMBERED_RUNS = 10_000  # runs whose artifacts read_artifact serves
MAX_READ_CHARS = 100_000  # text a read_file hands back before it says the rest was cut

_T = TypeVar("_T")

Code = Annotated[str, Field(min_length=1, description=RunPython.model_fields["code"].description)]
SessionCode = Annotated[
    str,
    Field(
        min_length=1,
        description="Code in the session's language to run as its next cell. Variables, "
        "imports and files from earlier cells are still there; the value "
        "of a last expression is shown, like in a notebook.",
    ),
]
JsCode = Annotated[
    str,
    Field(
        min_length=1,
        description=CODE_DESCRIPTIONS["javascript"],
    ),
]
BashCode = Annotated[str, Field(min_length=1, description=CODE_DESCRIPTIONS["bash"])]
Stdin = Annotated[str, Field(description=RunPython.model_fields["stdin"].description)]
Files = Annotated[dict[str, str], Field(description=RunPython.model_fields["files"].description)]
BinaryFiles = Annotated[
    dict[str, str],
    Field(
        description="Binary input files: relative path -> base64 content (read-only in /workspace)."
    ),
]
RunLimits = Annotated[
    Limits | None,
    Field(description="Resource limits; fields left out take the profile's defaults."),
]
RunEnvironment = Annotated[
    str | None,
    Field(
        pattern=ENVIRONMENT_NAME,
        description="The environment (set of installed packages) to run in; default: the "
        "server's. The policy profile lists the ones allowed.",
    ),
]
SessionId = Annotated[str, Field(description="The id session_create returned.")]
WorkspacePath = Annotated[
    str, Field(description="Path relative to /workspace, e.g. 'out/result.csv'.")
]
Timeout = Annotated[
    float | None,
    Field(gt=0, description="Wall-time limit of this cell in seconds; default: the session's."),
]


def caller(ctx: Context) -> Tenant:
    """The tenant a tool call acts for: the one the HTTP request authenticated as, or 'local'
    when there is no HTTP request (stdio, in memory). An HTTP request that no authentication
    middleware saw is refused, never taken for 'local'."""
    request = ctx.request_context.request
    if request is None:
        return LOCAL_TENANT
    tenant = getattr(request, "scope", {}).get(TENANT_SCOPE_KEY)
    if not isinstance(tenant, Tenant):
        raise ToolError("this MCP endpoint is served without authentication (use execbox mcp)")
    return tenant


# Complex on purpose: one closure per tool, registered together: the tool table in one place.
def build_server(  # noqa: C901
    executor: Executor,
    *,
    profile: str = "data",
    environment: str | None = None,
    max_result_bytes: int = DEFAULT_RESULT_BYTES,
    tenant_result_bytes: int | None = None,
    shares: Callable[[], Shares] | None = None,
    session_starts_per_key: int | None = None,
    session_starts_per_s: float | None = None,
    network: Sequence[str] | None = None,
    bound_secrets: Sequence[BoundSecret | Mapping[str, Any]] = (),
) -> MCPServer[Any]:
    """An MCP server whose tools run on `executor` (which the caller owns and closes), under
    policy `profile`, in `environment` unless a call names another (None: the default).
    Sessions the server opened are closed when the server shuts down. Runs and cells hold
    their results in memory: at most `max_result_bytes` of them at once, and at most
    `tenant_result_bytes` for one tenant (None: all of it), as `execbox serve`'s result budget;
    past either a tool call is refused with a time to retry. With `shares` (how the active
    keys share the executor's sessions, asked at each session_create) each key is guaranteed
    its share of the sessions, as `execbox serve --max-sessions`; `session_starts_per_key` and
    `session_starts_per_s` cap each key's session starts as `execbox serve`'s options do.
    `network`: the hosts run_python's runs may reach (the operator's choice; None: none),
    within what `profile` allows; `bound_secrets`: the operator's secrets bound to some of
    those hosts, given to every run (never to the model: its runs see placeholders)."""
    sessions = SessionRegistry(session_starts_per_key, session_starts_per_s)
    default_environment = environment
    quotas = Quotas()
    results = ResultBudget(max_result_bytes, tenant_result_bytes)
    malloc.return_big_blocks()
    own_runs: OrderedDict[str, str] = OrderedDict()  # runs this server made -> their tenant
    lock = threading.Lock()

    @asynccontextmanager
    async def lifespan(_: MCPServer[Any]) -> AsyncIterator[None]:
        try:
            yield
        finally:
            closed = await anyio.to_thread.run_sync(sessions.close_all)
            if closed:
                log.info("closed %d session(s) at shutdown", closed)

    server: MCPServer[Any] = MCPServer(
        "execbox",
        title="execbox: run Python in a sandbox",
        version=_version(),
        instructions=(
            "Run Python in an isolated sandbox. run_python runs one program from a clean "
            "state; for work that builds up step by step, session_create a session and "
            "session_run cells in it (state and files persist until session_close). "
            + describe_environment(profile=profile, network=network, environment=environment)
        ),
        lifespan=lifespan,
        log_level="WARNING",
    )
    closed_world = ToolAnnotations(open_world_hint=False)

    def session_of(ctx: Context, session_id: str) -> Session | EndedSession:
        return _allowed(lambda: sessions.get(caller(ctx), session_id))

    def admitted(ctx: Context, fn: Callable[[], _T], limits: Limits | None) -> _T:
        """`fn()` as one of the caller's runs: within its quotas, counted while it runs, and
        the most a result under `limits` can hold reserved of the result budget."""
        tenant = caller(ctx)
        release = _allowed(lambda: quotas.admit(tenant))
        try:
            bound = result_bound(limits or Limits(), executor.profiles.get(profile))
            reservation = _allowed(lambda: results.reserve(bound, tenant.name))
        except BaseException:
            release()
            raise
        try:
            return _call(fn)
        finally:
            reservation.release()
            release()

    @server.tool(
        description=describe_environment(
            profile=profile,
            timeout_arg="limits.timeout_s",
            network=network,
            environment=environment,
        ),
        # with network, its runs reach hosts outside: an open world
        annotations=ToolAnnotations(open_world_hint=bool(network), read_only_hint=True),
    )
    def run_python(
        code: Code,
        stdin: Stdin = "",
        files: Files | None = None,
        files_base64: BinaryFiles | None = None,
        limits: RunLimits = None,
        environment: RunEnvironment = None,
        *,
        ctx: Context,
    ) -> CallToolResult:
        return run_code("python", code, stdin, files, files_base64, limits, environment, ctx)

    def run_code(
        language: str,
        code: str,
        stdin: str,
        files: dict[str, str] | None,
        files_base64: dict[str, str] | None,
        limits: Limits | None,
        environment: str | None,
        ctx: Context,
    ) -> CallToolResult:
        inputs = {name: text.encode() for name, text in (files or {}).items()}
        inputs.update({name: _b64(data, name) for name, data in (files_base64 or {}).items()})
        tenant = caller(ctx)
        # Each tenant has its own cache entries, as over the HTTP API.
        scope = None if tenant is LOCAL_TENANT else tenant.name
        result = admitted(
            ctx,
            lambda: executor.run_request(
                make_request(
                    code,
                    language=language,
                    stdin=stdin,
                    files=inputs,
                    limits=limits,
                    profile=profile,
                    network=list(network) if network else "none",
                    environment=environment or default_environment,
                ),
                cache_scope=scope,
                tenant=scope,
                bound_secrets=bound_secrets,
            ),
            limits,
        )
        if result.artifacts:
            with lock:
                own_runs[result.run_id] = tenant.name
                while len(own_runs) > MAX_REMEMBERED_RUNS:
                    own_runs.popitem(last=False)
        return _result(result, readable=bool(result.artifacts))

    # One tool per language, not a `language` argument of run_python: each description says
    # what its runtime has, and a model picks a tool by its name. Only the languages the
    # profile runs are offered.
    allowed = executor.profiles[profile].languages if profile in executor.profiles else []
    if "javascript" in allowed:

        @server.tool(
            description=describe_language(
                "javascript", profile=profile, network=network, environment=default_environment
            ),
            annotations=ToolAnnotations(open_world_hint=False, read_only_hint=True),
        )
        def run_javascript(
            code: JsCode,
            stdin: Stdin = "",
            files: Files | None = None,
            files_base64: BinaryFiles | None = None,
            limits: RunLimits = None,
            *,
            ctx: Context,
        ) -> CallToolResult:
            return run_code("javascript", code, stdin, files, files_base64, limits, None, ctx)

    if "bash" in allowed:

        @server.tool(
            description=describe_language(
                "bash", profile=profile, network=network, environment=default_environment
            ),
            annotations=ToolAnnotations(open_world_hint=False, read_only_hint=True),
        )
        def run_bash(
            code: BashCode,
            stdin: Stdin = "",
            files: Files | None = None,
            files_base64: BinaryFiles | None = None,
            limits: RunLimits = None,
            *,
            ctx: Context,
        ) -> CallToolResult:
            return run_code("bash", code, stdin, files, files_base64, limits, None, ctx)

    @server.tool(annotations=ToolAnnotations(open_world_hint=False, read_only_hint=True))
    def read_artifact(
        run_id: Annotated[str, Field(description="The run_id of a run_python result.")],
        path: WorkspacePath,
        *,
        ctx: Context,
    ) -> CallToolResult:
        """Read a file a run_python call wrote (listed under artifacts in its result): text as
        text, images as images, other binary files as base64. Files are returned as written:
        secret redaction covers output and errors, files are not redacted."""
        with lock:
            known = own_runs.get(run_id) == caller(ctx).name
        record = executor.store.get(run_id) if known else None
        if record is None:
            raise ToolError(f"no run {run_id!r} with artifacts from this server")
        art = next((a for a in record.result.artifacts if a.path == path), None)
        if art is None:
            listed = ", ".join(a.path for a in record.result.artifacts)
            raise ToolError(f"run {run_id} wrote no {path!r}; it wrote: {listed}")
        data = executor.store.artifact_data(run_id, path)
        if data is None:
            raise ToolError(f"{path} was not kept: it is over the run records' artifact cap")
        return _file_result(path, data, art.mime_type)

    @server.tool(annotations=closed_world)
    def session_create(
        files: Files | None = None,
        files_base64: BinaryFiles | None = None,
        limits: RunLimits = None,
        idle_timeout_s: Annotated[
            float,
            Field(gt=0, description="Seconds without a call before the session ends on its own."),
        ] = 600.0,
        environment: RunEnvironment = None,
        language: Annotated[
            Literal["python", "javascript"],
            Field(
                description="The language of every cell: python (IPython), or javascript "
                "(Node; top-level let/const persist, top-level await works)."
            ),
        ] = "python",
        *,
        ctx: Context,
    ) -> CallToolResult:
        """Start a stateful Python or JavaScript session (like a notebook kernel) in its
        own sandbox. Run cells with session_run; end it with session_close."""
        inputs = {name: text.encode() for name, text in (files or {}).items()}
        inputs.update({name: _b64(data, name) for name, data in (files_base64 or {}).items()})
        tenant = caller(ctx)
        _allowed(lambda: sessions.reserve(tenant, shares() if shares is not None else None))
        session = None
        try:
            session = _call(
                lambda: executor.session(
                    language=language,
                    profile=profile,
                    environment=environment or default_environment,
                    limits=limits,
                    files=inputs,
                    idle_timeout_s=idle_timeout_s,
                    tenant=None if tenant is LOCAL_TENANT else tenant.name,
                    network=list(network) if network else "none",
                )
            )
        finally:
            sessions.add(tenant, session)
        return CallToolResult(
            content=[TextContent(type="text", text=f"session_id: {session.id}")],
            structured_content={"session_id": session.id},
        )

    @server.tool(annotations=closed_world)
    def session_run(
        session_id: SessionId, code: SessionCode, timeout_s: Timeout = None, *, ctx: Context
    ) -> CallToolResult:
        """Run a cell in a session. Charts shown with plt.show() or display() come back as
        images, as do PNG files the cell writes."""
        session = session_of(ctx, session_id)
        result = admitted(
            ctx, lambda: session.run(code, timeout_s=timeout_s), getattr(session, "limits", None)
        )
        return _result(result)

    @server.tool(annotations=closed_world)
    def session_write_file(
        session_id: SessionId,
        path: WorkspacePath,
        content: Annotated[str, Field(description="The file's content.")],
        encoding: Annotated[
            Literal["utf-8", "base64"], Field(description="How `content` is encoded.")
        ] = "utf-8",
        *,
        ctx: Context,
    ) -> str:
        """Write a file into a session's /workspace (replacing one at that path)."""
        data = _b64(content, path) if encoding == "base64" else content.encode()
        session = session_of(ctx, session_id)
        art = _call(lambda: session.files.write(path, data))
        return f"wrote {art.path} ({art.size} bytes, {art.mime_type})"

    @server.tool(annotations=ToolAnnotations(open_world_hint=False, read_only_hint=True))
    def session_read_file(
        session_id: SessionId, path: WorkspacePath, *, ctx: Context
    ) -> CallToolResult:
        """Read a file from a session's /workspace: text as text, images as images, other
        binary files as base64. Files are returned as written: secret redaction covers output
        and errors, files are not redacted."""
        session = session_of(ctx, session_id)
        data = _call(lambda: session.files.read(path))
        mime = next(
            (a.mime_type for a in _call(session.files.list) if a.path == path),
            "application/octet-stream",
        )
        return _file_result(path, data, mime)

    @server.tool(annotations=ToolAnnotations(open_world_hint=False, read_only_hint=True))
    def session_list_files(session_id: SessionId, *, ctx: Context) -> CallToolResult:
        """List the files in a session's /workspace: path, size and type."""
        session = session_of(ctx, session_id)
        arts = _call(session.files.list)
        text = "\n".join(f"{a.path}\t{a.size}\t{a.mime_type}" for a in arts) or "(no files)"
        return CallToolResult(
            content=[TextContent(type="text", text=text)],
            structured_content={"files": [a.model_dump(mode="json") for a in arts]},
        )

    @server.tool(annotations=ToolAnnotations(open_world_hint=False, destructive_hint=True))
    def session_close(session_id: SessionId, *, ctx: Context) -> str:
        """End a session: its interpreter, variables and files are gone."""
        session = session_of(ctx, session_id)
        _call(session.close)
        return f"session {session_id} closed"

    return server


def _call(fn: Callable[[], _T]) -> _T:
    """Caller mistakes (an unknown or ended session, bad limits, overload) become tool errors
    the model can read; what the code did is never an exception (it is on the result)."""
    try:
        return fn()
    except ExecboxError as exc:
        raise ToolError(f"{type(exc).__name__}: {exc}") from exc


def _allowed(fn: Callable[[], _T]) -> _T:
    """The API's refusals (a quota, another tenant's session) as tool errors the model reads."""
    try:
        return fn()
    except ApiError as exc:
        wait = f" (retry after {exc.retry_after} s)" if exc.retry_after is not None else ""
        raise ToolError(f"{exc.code}: {exc.message}{wait}") from exc


def _b64(data: str, name: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ToolError(f"{name}: not valid base64 ({exc})") from exc


def _result(result: RunResult, *, readable: bool = False) -> CallToolResult:
    images, notes = _images(result)
    text = format_observation(result)
    if readable:
        notes.append(f"run_id: {result.run_id} (read_artifact reads the files it wrote)")
    if notes:
        text += "\n" + "\n".join(notes)
    content: list[ContentBlock] = [TextContent(type="text", text=text), *images]
    return CallToolResult(
        content=content, structured_content=result.model_dump(mode="json", exclude={"outputs"})
    )


def _images(result: RunResult) -> tuple[list[ImageContent], list[str]]:
    """Images to show the model: a cell's image outputs, then image artifacts, within caps."""
    found: list[tuple[str, str, str]] = []  # (label, mime type, base64 data)
    for index, out in enumerate(result.outputs):
        if out.mime_type in IMAGE_TYPES:
            found.append((f"output {index + 1}", out.mime_type, out.data))
    for art in result.artifacts:
        if art.mime_type in IMAGE_TYPES and art.data is not None:
            found.append((art.path, art.mime_type, base64.b64encode(art.data).decode()))
    images: list[ImageContent] = []
    shown: list[str] = []
    skipped: list[str] = []
    for label, mime, data in found:
        if len(images) < MAX_IMAGES and len(data) * 3 // 4 <= MAX_IMAGE_BYTES:
            images.append(ImageContent(type="image", data=data, mime_type=mime))
            shown.append(label)
        else:
            skipped.append(label)
    notes = [f"images attached: {', '.join(shown)}"] if shown else []
    if skipped:
        notes.append(
            f"images not attached (more than {MAX_IMAGES}, or over "
            f"{MAX_IMAGE_BYTES // (1024 * 1024)} MiB): {', '.join(skipped)}"
        )
    return images, notes


def _file_result(path: str, data: bytes, mime: str) -> CallToolResult:
    if mime in IMAGE_TYPES:
        return CallToolResult(
            content=[
                TextContent(type="text", text=f"{path} ({len(data)} bytes, {mime})"),
                ImageContent(type="image", data=base64.b64encode(data).decode(), mime_type=mime),
            ]
        )
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return CallToolResult(
            content=[
                TextContent(
                    type="text",
                    text=f"{path} ({len(data)} bytes, {mime}, binary; base64):\n"
                    + base64.b64encode(data).decode(),
                )
            ]
        )
    if len(text) > MAX_READ_CHARS:
        text = (
            text[:MAX_READ_CHARS] + f"\n[... {len(text) - MAX_READ_CHARS:,} more characters "
            "not shown; read a part of the file with session_run instead ...]"
        )
    return CallToolResult(content=[TextContent(type="text", text=text)])


def _version() -> str:
    from .. import __version__

    return __version__


def serve(
    transport: Literal["stdio", "streamable-http"] = "stdio",
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    profile: str = "data",
    environment: str | None = None,
    auth: bool = True,
    records: str | None = None,
    max_result_bytes: int = DEFAULT_RESULT_BYTES,
    max_sessions: int = 16,
    session_starts_per_key: int = 1,
    session_starts_per_s: float = 1.0,
    network: Sequence[str] | None = None,
    bound_secrets: Sequence[Mapping[str, Any]] = (),
    allowed_hosts: Sequence[str] = (),
) -> None:
    """Start an Executor, serve MCP on `transport` until the client leaves (stdio) or a
    SIGINT/SIGTERM arrives, then close every session and the Executor. Over HTTP, with `auth`,
    every request needs a tenant's key of the records database's key table (`records`: its
    URL; default as `execbox serve`'s), and the `max_sessions` sessions are shared among the
    keys as `execbox serve` shares them. `network`: the hosts runs may reach (None: none).
    `allowed_hosts`: over HTTP, the host names served besides addresses and localhost
    (`execbox serve --allowed-host`; empty: the default for `host`).
    """
    from ..executor import Executor
    from ..server.hosts import AllowedHosts, default_patterns

    # Checked before the sandbox starts: a bad name is the operator's error, said at once.
    allowed = AllowedHosts(allowed_hosts or default_patterns(host))

    if network or bound_secrets:  # the operator's error, said now, not at every tool call
        checked = make_request("", profile=profile, network=list(network) if network else "none")
        bind_secrets(bound_secrets, checked)
    with _stop_on_signals() as stop:
        with Executor(records=records, max_sessions=max_sessions) as executor:
            if stop.requested:  # a signal came while the sandbox was starting
                return
            # Over HTTP with keys, as `execbox serve`: one tenant holds at most half of the
            # result budget, is guaranteed its share of the sessions and starts them at a rate.
            keys = KeyStore(executor.store.engine) if transport != "stdio" and auth else None
            server = build_server(
                executor,
                profile=profile,
                environment=environment,
                max_result_bytes=max_result_bytes,
                tenant_result_bytes=max_result_bytes // 2 if keys else None,
                shares=(lambda: Shares(executor.max_sessions, keys.session_quotas()))
                if keys
                else None,
                session_starts_per_key=session_starts_per_key if keys else None,
                session_starts_per_s=session_starts_per_s if keys else None,
                network=network,
                bound_secrets=bound_secrets,
            )
            if transport == "stdio":
                # The SDK reads stdin in a worker thread that no cancellation can interrupt,
                # so a signal cannot unwind the server: close the sandbox, then leave at once.
                stop.action = lambda: _close_and_exit(executor)
                anyio.run(server.run_stdio_async)
            else:
                # uvicorn handles SIGINT/SIGTERM itself while it serves; it stops, the
                # lifespan closes the sessions, then the Executor closes here.
                stop.action = _interrupt
                anyio.run(lambda: _serve_http(server, host, port, keys, allowed))
            stop.action = None


async def _serve_http(
    server: MCPServer[Any], host: str, port: int, keys: KeyStore | None, allowed: AllowedHosts
) -> None:
    import uvicorn
    from mcp.server.transport_security import TransportSecuritySettings

    from ..server.hosts import HostCheck
    from .http import BearerAuth

    # Ours checks the Host, first, for every bind; the SDK's (loopback binds only) would
    # refuse the names --allowed-host adds.
    mcp_app = server.streamable_http_app(
        host=host,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    app = HostCheck(BearerAuth(mcp_app, keys), allowed)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning")
    await uvicorn.Server(config).serve()


def _interrupt() -> None:
    raise KeyboardInterrupt


def _close_and_exit(executor: Executor) -> None:
    log.info("stopping on a signal: closing the sandbox")
    try:
        executor.close()
    finally:
        logging.shutdown()
        os._exit(0)


class _Stop:
    requested = False
    action: Callable[[], None] | None = None  # what a signal does; None: only note it


@contextmanager
def _stop_on_signals() -> Iterator[_Stop]:
    """SIGTERM and SIGINT stop the server with the Executor closed on the way out (SIGTERM's
    default would kill the process and leave the fork server behind). A signal during
    start-up is noted and acted on once the Executor is whole."""
    stop = _Stop()

    def handler(signum: int, frame: Any) -> None:
        stop.requested = True
        if stop.action is not None:
            stop.action()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    except KeyboardInterrupt:
        log.info("stopped by a signal")
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


__all__ = ["build_server", "serve"]
