"""`execbox env`: build, list, show, remove and choose the default of named environments
(see `environments`). Exit status 2 for bad input, as the rest of the command."""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import NoReturn

import click

from .errors import ExecboxError

EXIT_USAGE = 2


def _fail(message: str) -> NoReturn:
    click.echo(f"execbox: {message}", err=True)
    sys.exit(EXIT_USAGE)


@click.group("env")
def env_group() -> None:
    """Named, self-contained Python environments user code runs in."""


@env_group.command("build")
@click.argument("name")
@click.option(
    "--requirements",
    "-r",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Requirements to resolve and lock with hashes (pip's resolver).",
)
@click.option(
    "--lock",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A lock already pinned with hashes (default for 'data', 'ml' and 'js-data': the "
    "shipped one).",
)
@click.option("--index-url", help="The package index (default: PyPI, or the lock's own).")
@click.option(
    "--find-links",
    type=click.Path(file_okay=False, path_type=Path),
    help="A directory of wheels to take packages from.",
)
@click.option("--no-index", is_flag=True, help="Use no index: only --find-links (offline).")
@click.option(
    "--npm",
    "npm_spec",
    type=click.Path(file_okay=False, path_type=Path),
    help="A directory with package.json and package-lock.json (integrity-pinned): npm "
    "packages JavaScript runs can require (default for 'js-data': the shipped set).",
)
@click.option("--npm-registry", help="The npm registry or internal mirror (default: npm's).")
def env_build(
    name: str,
    requirements: Path | None,
    lock: Path | None,
    index_url: str | None,
    find_links: Path | None,
    no_index: bool,
    npm_spec: Path | None,
    npm_registry: str | None,
) -> None:
    """Build environment NAME and point the name at it (an identical tree is reused)."""
    from . import environments

    if no_index and find_links is None:
        _fail("--no-index needs --find-links DIR (a directory of wheels)")
    try:
        env = environments.build(
            name,
            requirements=requirements,
            lock=lock,
            index_url=index_url,
            find_links=find_links,
            no_index=no_index,
            npm_spec=npm_spec,
            npm_registry=npm_registry,
        )
        digest = env.image.digest
    except ExecboxError as exc:
        _fail(str(exc))
    click.echo(f"env {name} {digest} at {env.root}")


@env_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def env_list(as_json: bool) -> None:
    """The built environments; the default is marked with '*'."""
    from . import environments

    try:
        for name in environments.list_names():
            info = environments.show(name)
            if as_json:
                click.echo(json.dumps(info, sort_keys=True))
            else:
                mark = "*" if info["default"] else " "
                packages = info.get("packages") or []
                assert isinstance(packages, list)
                click.echo(
                    f"{mark} {name:<12} {str(info['image_digest'])[:19]}  "
                    f"python {info['python_version']}  {len(packages)} packages"
                )
    except ExecboxError as exc:
        _fail(str(exc))


@env_group.command("show")
@click.argument("name")
def env_show(name: str) -> None:
    """Environment NAME's manifest: digest, kind, packages, host libraries it needs."""
    from . import environments

    try:
        click.echo(json.dumps(environments.show(name), indent=2, sort_keys=True))
    except ExecboxError as exc:
        _fail(str(exc))


@env_group.command("rm")
@click.argument("name")
def env_rm(name: str) -> None:
    """Remove environment NAME (its tree too, unless another name uses it)."""
    from . import environments

    try:
        environments.remove(name)
    except ExecboxError as exc:
        _fail(str(exc))
    click.echo(f"removed {name}")


@env_group.command("default")
@click.argument("name", required=False)
def env_default(name: str | None) -> None:
    """Print the default environment, or make NAME the default runs use."""
    from . import environments

    try:
        if name is not None:
            environments.set_default(name)
        click.echo(environments.default_name())
    except ExecboxError as exc:
        _fail(str(exc))


SINCE = re.compile(r"(\d+(?:\.\d+)?)([smhd])\Z")
SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@env_group.command("requests")
@click.option("--since", help="Only runs this recent: a duration such as 90m, 24h or 7d.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per module.")
def env_requests(since: str | None, as_json: bool) -> None:
    """Modules code imported that its environment lacked, from the run records: how often,
    which environments lacked them, which have them now, and the newest run ids."""
    from . import environments
    from .records import RunStore

    start = None
    if since is not None:
        found = SINCE.match(since.strip())
        if found is None:
            _fail(f"bad --since {since!r}: a number and a unit, s, m, h or d (e.g. 24h, 7d)")
        start = time.time() - float(found.group(1)) * SECONDS[found.group(2)]
    try:
        store = RunStore()
        try:
            asked = environments.requests(store.missing_modules(start))
        finally:
            store.close()
    except ExecboxError as exc:
        _fail(str(exc))
    for entry in asked:
        if as_json:
            click.echo(json.dumps(asdict(entry), sort_keys=True))
            continue
        click.echo(
            f"{entry.module:<20} {entry.count:>5} runs  lacked in: {', '.join(entry.lacked_in)}"
            + (f"  now in: {', '.join(entry.available_in)}" if entry.available_in else "")
            + f"  runs: {' '.join(entry.run_ids)}"
        )
    if not asked and not as_json:
        click.echo("no run has imported a module its environment lacked")
