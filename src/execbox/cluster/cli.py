"""`execbox cluster status`: the nodes of a Ray cluster as execbox sees them."""

from __future__ import annotations

import json

import click

from . import ENV


@click.group("cluster")
def cluster_group() -> None:
    """execbox on a Ray cluster (pip install 'execbox[cluster]'; see docs/cluster.md)."""


@cluster_group.command("status")
@click.option(
    "--cluster",
    "address",
    required=True,
    envvar=ENV,
    help="The Ray cluster: ray://HEAD:10001, HOST:PORT or auto (env EXECBOX_CLUSTER).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per node.")
def status(address: str, as_json: bool) -> None:
    """Each node: its slots, runs in flight, sessions, load (runs in flight per slot) and the
    callers holding a lease on its host."""
    try:
        from .backend import cluster_status
    except ImportError as exc:
        raise click.ClickException(
            f"a cluster needs Ray ({exc}): pip install 'execbox[cluster]'"
        ) from exc
    rows = cluster_status(address)
    if as_json:
        for row in rows:
            click.echo(json.dumps(row, sort_keys=True))
        return
    click.echo(
        f"{'node':<16} {'address':<16} {'slots':>5} {'running':>7} {'sessions':>8} "
        f"{'load':>5} callers"
    )
    for row in rows:
        node = str(row["node"])[:16]
        if row.get("problem"):
            click.echo(f"{node:<16} {row.get('address', ''):<16} {row['problem']}")
            continue
        click.echo(
            f"{node:<16} {row.get('address', ''):<16} {row['slots']:>5} {row['running']:>7} "
            f"{row['sessions']:>8} {row['load']:>5.2f} {row.get('callers', '?')}"
        )
