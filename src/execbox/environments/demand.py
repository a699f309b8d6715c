"""Curation from demand: the module a run's ModuleNotFoundError names, the hint that tells its
author which environments have it (or whom to ask), and what code asked for that its
environment lacked (`execbox env requests`), for an operator to curate from."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .modules import index

MISSING = re.compile(r"No module named '([^']+)'")
# What Node says of a require (CommonJS) or an import (ES module) of a package it cannot find.
MISSING_JS = re.compile(r"Cannot find (?:module|package) '([^'./][^']*)'")


def missing_module(error_type: str | None, message: str | None) -> str | None:
    """The top-level module a run's ModuleNotFoundError names, or None."""
    if error_type != "ModuleNotFoundError" or not message:
        return None
    found = MISSING.search(message)
    return found.group(1).split(".")[0] if found else None


def missing_package(error_type: str | None, message: str | None) -> str | None:
    """The npm package a JavaScript run's error says it cannot find, or None."""
    if error_type != "Error" or not message:
        return None
    found = MISSING_JS.match(message)
    if not found or found.group(1).startswith("node:"):
        return None
    parts = found.group(1).split("/")
    return "/".join(parts[:2]) if parts[0].startswith("@") else parts[0]


def missing_package_hint(
    package: str, allowed: list[str] | None = None, base: Path | None = None
) -> str | None:
    """What to tell the author of JavaScript that required `package`: the environments among
    `allowed` (None: all) whose runs can require it; None when none can."""
    others = [n for n in index(base).having_package(package) if allowed is None or n in allowed]
    if not others:
        return None
    which = (
        f"environment {others[0]!r} has it"
        if len(others) == 1
        else "environments " + ", ".join(repr(n) for n in others) + " have it"
    )
    return f"npm package {package} is not in this run's environment; {which} (run with --environment {others[0]})"


def missing_hint(
    module: str, image_digest: str, allowed: list[str] | None = None, base: Path | None = None
) -> str | None:
    """What to tell the author of code that imported `module`, missing from the environment
    with `image_digest`: the environments among `allowed` (None: all) that have it, or whom to
    ask. None when that environment has the top-level module (a submodule was missing)."""
    return missing_hint_in(module, index(base).names_of(image_digest), allowed, base)


def missing_hint_in(
    module: str, here: list[str], allowed: list[str] | None = None, base: Path | None = None
) -> str | None:
    """`missing_hint` for the environment known by the names `here` (none: it has no name)."""
    known = index(base)
    if any(module in known.modules(name) for name in here):
        return None
    where = f"environment {here[0]!r}" if here else "this run's environment"
    anywhere = known.having(module)
    others = [n for n in anywhere if allowed is None or n in allowed]
    if not others:
        # Environments the profile does not allow are not named: it could not use them.
        nowhere = (
            "no environment its profile allows has it" if anywhere else "no environment has it"
        )
        return (
            f"{module} is not in {where}, and {nowhere}; ask an operator to add it "
            "(`execbox env requests` lists what runs asked for)"
        )
    which = (
        f"environment {others[0]!r} has it"
        if len(others) == 1
        else "environments " + ", ".join(repr(n) for n in others) + " have it"
    )
    return f"{module} is not in {where}; {which} (run with --environment {others[0]})"


@dataclass
class Request:
    """A module code asked for and its environment lacked (`execbox env requests`)."""

    module: str
    count: int = 0
    lacked_in: list[str] = field(default_factory=list)  # names, or digests no name has now
    available_in: list[str] = field(default_factory=list)  # the environments that have it now
    run_ids: list[str] = field(default_factory=list)  # the newest first
    last_at: float = 0.0


def requests(
    rows: list[tuple[str, str, float, str]], base: Path | None = None, run_ids: int = 5
) -> list[Request]:
    """What code asked for and its environment lacked, from the records' `missing_modules`
    rows (newest first), most asked for first. A module the lacking environment does have
    (the run missed a submodule of it) is not a request."""
    known = index(base)
    found: dict[str, Request] = {}
    for module, run_id, created_at, digest in rows:
        lacking = known.names_of(digest)
        if any(module in known.modules(name) for name in lacking):
            continue
        entry = found.setdefault(module, Request(module, last_at=created_at))
        entry.count += 1
        for name in lacking or [digest[:19]]:
            if name not in entry.lacked_in:
                entry.lacked_in.append(name)
        if len(entry.run_ids) < run_ids:
            entry.run_ids.append(run_id)
    for entry in found.values():
        entry.available_in = known.having(entry.module)
    return sorted(found.values(), key=lambda e: (-e.count, e.module))
