"""npm packages in an environment: a package-lock.json with an integrity hash for every
package, installed at build time with `npm ci --ignore-scripts` (no package's install scripts
run) into the tree's `lib/node_modules`, which the jail shows read-only. The lock and the
packages are under `lib/`, so the tree digest, the image digest and every cache key change
with them. Nothing is downloaded at run time.

In the jail a root link `/node_modules` points at them (`sandbox.inside.packages`): Node
resolves `require('x')` and `import 'x'` from /workspace/main.js through it by itself."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from ..errors import UsageError

DIR = "lib"  # where package.json, package-lock.json and node_modules go in the tree
FILES = ("package.json", "package-lock.json")
# npm's Subresource Integrity strings that npm ci checks every tarball against; sha1 is too weak.
INTEGRITY = re.compile(r"sha512-[A-Za-z0-9+/]{86}==\Z")
NPM_FIX = "install Node.js's npm (Debian/Ubuntu: apt-get install npm)"


def check_lock(directory: Path) -> dict[str, object]:
    """The lock of the npm spec in `directory` (package.json and package-lock.json), checked:
    lockfile version 2 or 3, and every package pinned to a registry tarball by a sha512
    integrity (no git, file or link dependencies, whose contents no hash pins)."""
    if not directory.is_dir():
        raise UsageError(f"--npm directory not found: {directory}")
    for name in FILES:
        if not (directory / name).is_file():
            raise UsageError(
                f"--npm {directory}: no {name} (make it with `npm install "
                "--package-lock-only --ignore-scripts`)"
            )
    try:
        lock = json.loads((directory / "package-lock.json").read_text())
    except ValueError as exc:
        raise UsageError(f"{directory}/package-lock.json is not JSON: {exc}") from exc
    packages = lock.get("packages") if isinstance(lock, dict) else None
    if not isinstance(packages, dict) or lock.get("lockfileVersion") not in (2, 3):
        raise UsageError(
            f"{directory}/package-lock.json: lockfileVersion 2 or 3 with a 'packages' map "
            "is needed (npm 7 or newer writes it)"
        )
    for path, entry in packages.items():
        if path == "":
            continue
        where = f"{directory}/package-lock.json: {path}"
        if not path.startswith("node_modules/") or not isinstance(entry, dict):
            raise UsageError(f"{where}: only registry packages under node_modules/ are allowed")
        if entry.get("link") or str(entry.get("resolved", "https:")).split(":")[0] != "https":
            raise UsageError(f"{where}: a link, file or git dependency; no hash pins its contents")
        if not INTEGRITY.match(str(entry.get("integrity", ""))):
            raise UsageError(f"{where}: no sha512 integrity hash pins it")
    checked: dict[str, object] = lock
    return checked


def lock_sha(directory: Path) -> str:
    h = hashlib.sha256()
    for name in FILES:
        h.update(name.encode() + b"\0" + (directory / name).read_bytes() + b"\0")
    return h.hexdigest()


def install(
    tree: Path,
    directory: Path,
    registry: str | None = None,
    cache: Path | None = None,
    offline: bool = False,
) -> dict[str, str]:
    """Install the npm spec in `directory` into `tree/lib/node_modules` with `npm ci
    --ignore-scripts` (every tarball checked against its integrity hash by npm); the
    packages the spec names and their versions. `registry`: an internal mirror; `cache` and
    `offline`: build from npm's cache alone."""
    lock = check_lock(directory)
    npm = shutil.which("npm")
    if npm is None:
        raise UsageError(f"an environment with npm packages needs npm at build time: {NPM_FIX}")
    dest = tree / DIR
    for name in FILES:
        shutil.copyfile(directory / name, dest / name)
    args = [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--no-bin-links"]
    args += ["--omit=dev", "--omit=optional", "--install-links=false"]
    if registry:
        args += ["--registry", registry]
    if cache is not None:
        args += ["--cache", str(cache)]
    if offline:
        args.append("--offline")
    env = {k: v for k, v in os.environ.items() if not k.lower().startswith("npm_config_")}
    done = subprocess.run(args, cwd=dest, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(dest / "node_modules", ignore_errors=True)
        raise UsageError(f"npm ci refused the lock in {directory}:\n{_npm_error(done.stderr)}")
    # npm's own copy of the lock, with nothing the lock does not say: left out of the tree.
    (dest / "node_modules" / ".package-lock.json").unlink(missing_ok=True)
    packages = lock["packages"]
    assert isinstance(packages, dict)
    return {
        name: str(packages.get(f"node_modules/{name}", {}).get("version", spec))
        for name, spec in sorted(packages[""].get("dependencies", {}).items())
    }


def _npm_error(stderr: str) -> str:
    """npm's errors, and its warnings about a tarball that failed its integrity check."""
    lines = [
        line
        for line in stderr.splitlines()
        if line.startswith(("npm error", "npm warn tarball"))
        and "complete log" not in line
        and "_logs" not in line
    ]
    return "\n".join(lines[:12]) or stderr.strip()[-1500:]


def packages_of(root: Path) -> dict[str, str]:
    """The npm packages a tree's manifest records (name -> version); none for most trees."""
    from . import manifest

    found = manifest.read(root).get("npm_packages")
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}
