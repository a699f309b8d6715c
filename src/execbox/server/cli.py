"""`execbox serve` and `execbox keys`: the HTTP API and its API keys."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import click

from ..errors import ExecboxError

if TYPE_CHECKING:
    from .auth import KeyStore


def _key_store(db: str | None) -> KeyStore:
    from ..records import RunStore
    from .auth import KeyStore

    return KeyStore(RunStore(db).engine)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=int, help="Port to listen on.")
@click.option(
    "--socket",
    "socket_path",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also listen on this Unix socket (mode 0600; its owner needs no key): "
    "`execbox run` sends its runs there [default: serve.sock in the execbox home].",
)
@click.option("--no-socket", is_flag=True, help="Listen on the TCP port only.")
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    envvar="EXECBOX_ALLOWED_HOSTS",
    help="A host name clients reach this server by (its Host header): api.example.com, "
    "*.example.com for its subdomains, * for any. Addresses and localhost are always "
    "answered; other names get 421 (the defence against DNS rebinding). Repeatable; env "
    "EXECBOX_ALLOWED_HOSTS (comma- or space-separated). Default: none on a loopback "
    "address, else this machine's host name.",
)
@click.option(
    "--no-auth",
    is_flag=True,
    help="Accept every TCP caller as the tenant 'anonymous' (only on a trusted loopback).",
)
@click.option(
    "--max-request-mib",
    default=32,
    show_default=True,
    type=click.IntRange(1),
    help="Largest request body; bigger ones get a 413.",
)
@click.option(
    "--max-concurrency",
    type=click.IntRange(1),
    default=None,
    help="Runs at once (default: 4 per CPU).",
)
@click.option(
    "--pool-size",
    type=click.IntRange(1),
    default=None,
    help="Run slots kept staged (default: 2 per CPU).",
)
@click.option(
    "--rotate-after-runs",
    type=click.IntRange(0),
    default=None,
    help="Replace the sandbox host (a new memory layout) after this many runs; "
    "0: never (default: 30000).",
)
@click.option(
    "--rotate-after-s",
    type=click.FloatRange(0),
    default=None,
    help="Replace it this many seconds after its start, if sooner; 0: never (default: 300).",
)
@click.option(
    "--zygotes-per-tenant",
    is_flag=True,
    help="Give each tenant its own zygotes and slots (~225 MiB each while active): "
    "no memory layout or slot is shared across tenants.",
)
@click.option(
    "--graceful-timeout",
    default=30,
    show_default=True,
    type=click.IntRange(0),
    help="Seconds in-flight requests get to finish after SIGTERM.",
)
@click.option(
    "--db",
    default=None,
    help="Records database URL (default: EXECBOX_DB_URL or the SQLite file in the data directory).",
)
@click.option(
    "--cluster",
    default=None,
    envvar="EXECBOX_CLUSTER",
    help="Run code on the nodes of this Ray cluster (ray://HEAD:10001, HOST:PORT or auto; "
    "env EXECBOX_CLUSTER); needs --db with a PostgreSQL URL. See docs/cluster.md.",
)
@click.option(
    "--max-result-mib",
    default=2048,
    show_default=True,
    type=click.IntRange(1),
    help="Result bytes in flight, server-wide (runs' output and artifact caps, and "
    "spooled artifacts not yet downloaded); past it requests get a 503.",
)
@click.option(
    "--spool-dir",
    default=None,
    type=click.Path(file_okay=False, exists=True),
    help="Where artifacts wait for their download (default: the temp directory).",
)
@click.option(
    "--artifact-ttl",
    default=600,
    show_default=True,
    type=click.IntRange(1),
    help="Seconds a run's spooled artifacts wait for their download.",
)
@click.option(
    "--tenant-result-mib",
    type=click.IntRange(1),
    default=None,
    help="The most of the result budget one key may hold at once (default: half "
    "of --max-result-mib); past it, 429.",
)
@click.option(
    "--max-sessions",
    type=click.IntRange(0),
    default=None,
    help="Sessions open at once, server-wide (default: 16). Each key is guaranteed "
    "its session quota, or its proportional share when the quotas add up to "
    "more.",
)
@click.option(
    "--max-session-idle",
    default=3600,
    show_default=True,
    type=click.IntRange(1),
    help="Longest idle_timeout_s a session may ask for (seconds).",
)
@click.option(
    "--max-session-lifetime",
    default=86400,
    show_default=True,
    type=click.IntRange(1),
    help="Longest max_lifetime_s a session may ask for (seconds).",
)
@click.option(
    "--session-starts-per-key",
    default=1,
    show_default=True,
    type=click.IntRange(1),
    help="Sessions one key may have starting at once; past it, 429 with "
    "Retry-After. A start is CPU-bound: this keeps one key's flood of starts "
    "from taking every core.",
)
@click.option(
    "--session-starts-per-s",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="Sessions one key may start a second, spaced evenly; past it, 429 with Retry-After.",
)
@click.option(
    "--stream-buffer-kib",
    default=1024,
    show_default=True,
    type=click.IntRange(1),
    help="Output a streamed run may have waiting for a slow reader; past it the "
    "stream sends an overflow event and no more output.",
)
@click.option(
    "--header-timeout",
    default=10,
    show_default=True,
    type=click.FloatRange(0.1),
    help="Seconds a request's line and headers may take to arrive (else 408).",
)
@click.option(
    "--body-timeout",
    default=60,
    show_default=True,
    type=click.FloatRange(0.1),
    help="Seconds a request's body may take to arrive after its headers.",
)
@click.option(
    "--max-connections-per-client",
    default=64,
    show_default=True,
    type=click.IntRange(0),
    help="Connections one client address may hold open (0: no cap; behind a "
    "reverse proxy, cap per client there instead).",
)
@click.option(
    "--max-request-bodies-mib",
    default=None,
    type=click.IntRange(1),
    help="Request-body MiB all requests in flight may hold (one key: half; past "
    "it, 503). Default: 8 times --max-request-mib.",
)
@click.option(
    "--listen-backlog",
    default=128,
    show_default=True,
    type=click.IntRange(1),
    help="Connections the kernel queues until the server accepts them; a client "
    "reconnecting in a loop is slowed there, not in the server.",
)
@click.option(
    "--docs",
    is_flag=True,
    help="Serve /docs, /redoc and /openapi.json (off: the schema is in the "
    "repository, and the docs page loads scripts from a CDN).",
)
@click.option(
    "--e2b",
    is_flag=True,
    help="Also serve the E2B-compatible API under /e2b: E2B's SDKs run against it with "
    "E2B_API_URL and E2B_SANDBOX_URL set to http://HOST:PORT/e2b (docs/e2b.md).",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
)
def serve(
    host: str,
    port: int,
    socket_path: Path | None,
    no_socket: bool,
    allowed_hosts: tuple[str, ...],
    no_auth: bool,
    max_request_mib: int,
    max_concurrency: int | None,
    pool_size: int | None,
    rotate_after_runs: int | None,
    rotate_after_s: float | None,
    zygotes_per_tenant: bool,
    graceful_timeout: int,
    db: str | None,
    cluster: str | None,
    max_result_mib: int,
    tenant_result_mib: int | None,
    spool_dir: str | None,
    artifact_ttl: int,
    max_sessions: int | None,
    max_session_idle: int,
    max_session_lifetime: int,
    session_starts_per_key: int,
    session_starts_per_s: float,
    stream_buffer_kib: int,
    header_timeout: float,
    body_timeout: float,
    max_connections_per_client: int,
    max_request_bodies_mib: int | None,
    listen_backlog: int,
    docs: bool,
    e2b: bool,
    log_level: str,
) -> None:
    """Serve the HTTP API.

    Callers send 'Authorization: Bearer KEY' with a key from `execbox keys create`; /metrics
    takes an admin key (`execbox keys create NAME --admin`).
    SIGTERM stops accepting, lets in-flight runs finish, closes sessions and the sandbox."""
    import logging

    from .app import create_app
    from .background import Server, config
    from .hosts import default_patterns, split_patterns
    from .local import SocketTaken, bind_local_socket, default_socket_path, remove_local_socket
    from .state import Settings

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    options: dict[str, object] = {
        "max_concurrency": max_concurrency,
        "pool_size": pool_size,
        "rotate_after_runs": rotate_after_runs,
        "rotate_after_s": rotate_after_s,
        "zygotes_per_tenant": zygotes_per_tenant or None,
        "max_sessions": max_sessions,
    }
    if db:
        options["records"] = db
    if cluster:
        options["cluster"] = cluster
    settings = Settings(
        auth=not no_auth,
        max_request_bytes=max_request_mib << 20,
        docs=docs,
        e2b=e2b,
        max_result_bytes=max_result_mib << 20,
        spool_dir=spool_dir,
        tenant_result_bytes=(tenant_result_mib << 20 if tenant_result_mib else None),
        artifact_ttl_s=float(artifact_ttl),
        max_session_idle_s=float(max_session_idle),
        max_session_lifetime_s=float(max_session_lifetime),
        session_starts_per_key=session_starts_per_key,
        session_starts_per_s=session_starts_per_s,
        stream_buffer_bytes=stream_buffer_kib << 10,
        header_timeout_s=header_timeout,
        body_timeout_s=body_timeout,
        max_connections_per_client=max_connections_per_client,
        listen_backlog=listen_backlog,
        request_bodies_bytes=(max_request_bodies_mib << 20 if max_request_bodies_mib else None),
        allowed_hosts=tuple(split_patterns(allowed_hosts)) or default_patterns(host),
        executor_options={k: v for k, v in options.items() if v is not None},
    )
    if no_auth and host not in ("127.0.0.1", "::1", "localhost"):
        click.echo(
            f"execbox: WARNING: --no-auth on {host}: anyone who can reach it runs code", err=True
        )
    try:
        app = create_app(settings=settings)
    except ExecboxError as exc:
        click.echo(f"execbox: {exc}", err=True)
        sys.exit(2)
    server_config = config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=graceful_timeout,
        lifespan="on",
    )
    sockets = [server_config.bind_socket()]  # exits 3 with uvicorn's message if taken
    log = logging.getLogger("execbox.server")
    path = socket_path or default_socket_path()
    try:
        if not no_socket:
            sockets.append(bind_local_socket(path))
    except SocketTaken as exc:
        if socket_path is not None:  # asked for: not having it is an error
            sockets[0].close()
            click.echo(f"execbox: {exc}", err=True)
            sys.exit(2)
        log.warning("%s; this server listens on its TCP port only", exc)
        no_socket = True
    except ExecboxError as exc:
        sockets[0].close()
        click.echo(f"execbox: {exc}", err=True)
        sys.exit(2)
    if not no_socket:
        inode = path.lstat().st_ino
        log.info("listening on unix:%s (no key needed)", path)
    server = Server(server_config)
    if not no_socket:
        server.after_shutdown.append(lambda: remove_local_socket(path, inode))
    try:
        server.run(sockets=sockets)
    finally:
        for sock in sockets:
            sock.close()
        if not no_socket:
            remove_local_socket(path, inode)
    if not server.started:
        sys.exit(2)


@click.group()
def keys() -> None:
    """API keys of the HTTP API (stored hashed beside the run records)."""


@keys.command("create")
@click.argument("name")
@click.option(
    "--concurrent",
    default=8,
    show_default=True,
    type=click.IntRange(0),
    help="Requests in flight at once (a streamed run counts until read).",
)
@click.option(
    "--sessions",
    default=4,
    show_default=True,
    type=click.IntRange(0),
    help="Sessions open at once.",
)
@click.option(
    "--rpm",
    default=600,
    show_default=True,
    type=click.IntRange(0),
    help="Requests per minute (every request with the key, refused ones too).",
)
@click.option(
    "--session-starts",
    default=None,
    type=click.IntRange(1),
    help="Sessions starting at once (default: the server's --session-starts-per-key).",
)
@click.option(
    "--admin",
    is_flag=True,
    help="An admin key: reads /metrics (every tenant's counts), runs no code.",
)
@click.option(
    "--key-file",
    type=click.File("r"),
    help="Store the key in this file (a container secret; - for standard input) instead of "
    "a random one; it is not printed.",
)
@click.option("--db", default=None, help="Records database URL.")
def create_key(
    name: str,
    concurrent: int,
    sessions: int,
    rpm: int,
    session_starts: int | None,
    admin: bool,
    key_file: TextIO | None,
    db: str | None,
) -> None:
    """Create a key named NAME (the tenant) and print it; it is shown only this once."""
    from .auth import ADMIN, TENANT

    try:
        key = _key_store(db).create(
            name,
            key=key_file.read().strip() if key_file is not None else None,
            max_concurrent=concurrent,
            max_sessions=sessions,
            rpm=rpm,
            role=ADMIN if admin else TENANT,
            session_starts=session_starts,
        )
    except ExecboxError as exc:
        click.echo(f"execbox: {exc}", err=True)
        sys.exit(2)
    if key_file is not None:  # the caller has it: printing it would put it in logs
        click.echo(f"execbox: stored the given key as {name!r}", err=True)
    else:
        click.echo(key)


@keys.command("revoke")
@click.argument("name")
@click.option("--db", default=None, help="Records database URL.")
def revoke_key(name: str, db: str | None) -> None:
    """Revoke the key named NAME: requests with it get 401 from now on."""
    try:
        _key_store(db).revoke(name)
    except ExecboxError as exc:
        click.echo(f"execbox: {exc}", err=True)
        sys.exit(2)
    click.echo(f"revoked {name}")


@keys.command("list")
@click.option("--db", default=None, help="Records database URL.")
def list_keys(db: str | None) -> None:
    """Keys with their limits and state (never the keys themselves)."""
    import datetime as dt

    infos = _key_store(db).list()
    if not infos:
        click.echo("no keys yet: create one with `execbox keys create NAME`", err=True)
    for info in infos:
        created = dt.datetime.fromtimestamp(info.created_at, dt.UTC).strftime("%Y-%m-%d %H:%M")
        state = "revoked" if info.revoked_at is not None else "active"
        if info.role == "admin":
            click.echo(f"{info.name}\t{state}\tcreated {created}\tadmin (metrics only)")
            continue
        click.echo(
            f"{info.name}\t{state}\tcreated {created}\tconcurrent {info.max_concurrent}"
            f"\tsessions {info.max_sessions}\trpm {info.rpm}"
            + (f"\tsession starts {info.session_starts}" if info.session_starts else "")
        )
