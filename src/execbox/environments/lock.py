"""Locks: every package pinned to one version with the hash of its wheel. A requirements file
is resolved into one by pip's own resolver (`pip install --dry-run --report`) against the index
or wheel directory given, PyPI by default; `build` installs from a lock only."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import UsageError


def _requirement_lines(text: str) -> list[str]:
    """The requirement lines of a requirements file, continuations joined, comments dropped."""
    lines, pending = [], ""
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line and not line.startswith("-"):
            lines.append(line)
    return lines


def check_lock(path: Path) -> None:
    """A lock pins every requirement to one version with at least one hash."""
    if not path.is_file():
        raise UsageError(f"lock file not found: {path}")
    lines = _requirement_lines(path.read_text())
    if not lines:
        raise UsageError(f"lock file {path} names no packages")
    for line in lines:
        if "==" not in line or "--hash=sha256:" not in line:
            raise UsageError(
                f"lock file {path} has a requirement without an exact version and a sha256 "
                f"hash: {line.split()[0]!r}; lock it with `execbox env build NAME "
                "--requirements FILE`"
            )


def resolve(python: Path, requirements: Path, index_args: list[str], log: bool) -> str:
    """Resolve `requirements` for `python` with pip's resolver; the lock's text, one
    `name==version --hash=sha256:...` per package, sorted by name."""
    with tempfile.TemporaryDirectory(prefix="execbox-lock-") as tmp:
        report = Path(tmp) / "report.json"
        pip(
            python,
            ["install", "--dry-run", "--ignore-installed", "--only-binary", ":all:"],
            ["--report", str(report), "-r", str(requirements), *index_args],
            log,
        )
        installs = json.loads(report.read_text())["install"]
    pins = []
    for item in installs:
        meta, info = item["metadata"], item["download_info"]
        hashes = info.get("archive_info", {}).get("hashes", {})
        digest = hashes.get("sha256")
        if digest is None:
            raise UsageError(
                f"{meta['name']} resolved to {info.get('url')}, which has no sha256 to lock "
                "(a directory or a VCS link): give wheels or an index"
            )
        name = re.sub(r"[-_.]+", "-", meta["name"]).lower()
        pins.append((name, f"{name}=={meta['version']} \\\n    --hash=sha256:{digest}\n"))
    header = f"# Locked by execbox from {requirements.name}; one wheel hash per package.\n"
    return header + "".join(pin for _, pin in sorted(pins))


def pip(python: Path, command: list[str], args: list[str], log: bool) -> None:
    """Run pip `command` for the interpreter `python` (pip itself runs on execbox's)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "--disable-pip-version-check",
            *command,
            "--quiet",
            *args,
        ],
        stdout=None if log else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if done.returncode != 0:
        raise UsageError(f"pip {command[0]} failed:\n{done.stderr.strip()}")
