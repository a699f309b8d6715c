"""`execbox mcp`: execbox as an MCP server, over stdio or streamable HTTP.

The server (`execbox.mcp.server`) is built on the official MCP Python SDK. This module holds only
the command, so the `execbox` CLI starts without importing the SDK (about 1.5 s of imports).
"""

from __future__ import annotations

import sys

import click

__all__ = ["mcp_command"]


@click.command("mcp")
@click.option(
    "--transport",
    type=click.Choice(["stdio", "http"]),
    default="stdio",
    show_default=True,
    help="stdio for a client that starts the server; http for streamable HTTP.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (http).")
@click.option(
    "--port",
    type=int,
    default=8765,
    show_default=True,
    help="Port to listen on (http); the endpoint is /mcp.",
)
@click.option(
    "--profile", default="data", show_default=True, help="Policy profile of every run and session."
)
@click.option(
    "--environment",
    metavar="NAME",
    help="The environment runs and sessions use unless a call names another (default: the "
    "default one).",
)
@click.option(
    "--allow-net",
    "allow_net",
    multiple=True,
    metavar="HOST[:PORT]",
    help="A host run_python's runs and sessions may reach through the network proxy, within "
    "what the profile allows; the tool's description names them to the model. Repeatable; "
    "none: no network.",
)
@click.option(
    "--secret-for",
    "secret_for",
    multiple=True,
    metavar="NAME=HOST[:PORT][,HOST...]",
    help="Bind the secret in this shell's variable NAME to hosts of --allow-net: every run "
    "sees a placeholder in NAME, which the proxy swaps for the value in the Authorization "
    "header of HTTPS requests to those hosts only. The model never sees the value.",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    envvar="EXECBOX_ALLOWED_HOSTS",
    help="http: a host name clients reach the server by, as `execbox serve --allowed-host` "
    "(addresses and localhost always; other names get 421). Repeatable; env "
    "EXECBOX_ALLOWED_HOSTS.",
)
@click.option(
    "--no-auth",
    is_flag=True,
    help="http: accept every caller as the tenant 'local' (only on a trusted "
    "loopback). Otherwise each request needs 'Authorization: Bearer KEY'.",
)
@click.option(
    "--db",
    default=None,
    help="Records database URL, where the keys are (default: "
    "EXECBOX_DB_URL or the SQLite file in the data "
    "directory).",
)
@click.option(
    "--max-result-mib",
    default=2048,
    show_default=True,
    type=click.IntRange(1),
    help="Result bytes (output and artifacts) held at once; past it a tool call is "
    "refused with a time to retry.",
)
@click.option(
    "--max-sessions",
    default=16,
    show_default=True,
    type=click.IntRange(0),
    help="Sessions open at once; over http with keys each key is guaranteed its "
    "quota, or its proportional share when the quotas add up to more.",
)
@click.option(
    "--session-starts-per-key",
    default=1,
    show_default=True,
    type=click.IntRange(1),
    help="Over http with keys: sessions one key may have starting at once (as execbox serve).",
)
@click.option(
    "--session-starts-per-s",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="Over http with keys: sessions one key may start a second after a burst "
    "(as execbox serve).",
)
def mcp_command(
    transport: str,
    host: str,
    port: int,
    profile: str,
    environment: str | None,
    allow_net: tuple[str, ...],
    secret_for: tuple[str, ...],
    allowed_hosts: tuple[str, ...],
    no_auth: bool,
    db: str | None,
    max_result_mib: int,
    max_sessions: int,
    session_starts_per_key: int,
    session_starts_per_s: float,
) -> None:
    """Serve execbox's tools over MCP: run_python, sessions, session files.

    The server starts one Executor (the sandbox's fork server) and closes it, with every
    session it opened, when the client disconnects (stdio) or on SIGINT/SIGTERM. Over http,
    callers send a key from `execbox keys create` (the HTTP API's keys, quotas and tenancy).
    """
    from ..cli import bound_from_environment
    from ..errors import ExecboxError
    from ..server.hosts import split_patterns
    from .server import serve

    if transport == "http" and no_auth and host not in ("127.0.0.1", "::1", "localhost"):
        click.echo(
            f"execbox: WARNING: --no-auth on {host}: anyone who can reach it runs code", err=True
        )
    try:
        serve(
            "stdio" if transport == "stdio" else "streamable-http",
            host=host,
            port=port,
            profile=profile,
            environment=environment,
            network=list(allow_net) or None,
            bound_secrets=bound_from_environment(secret_for),
            auth=not no_auth,
            records=db,
            max_result_bytes=max_result_mib << 20,
            max_sessions=max_sessions,
            session_starts_per_key=session_starts_per_key,
            session_starts_per_s=session_starts_per_s,
            allowed_hosts=split_patterns(allowed_hosts),
        )
    except ExecboxError as exc:
        click.echo(f"execbox: {exc}", err=True)
        sys.exit(2)
