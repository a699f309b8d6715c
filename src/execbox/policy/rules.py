"""The rules a finding breaks: import and call rules, writable places, profiles that read code."""

from __future__ import annotations

import fnmatch
import functools
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

from .profiles import Decision, Profile

# Where the sandbox lets code write (per-run tmpfs mounts) and the device files that only
# swallow or forward output; anything else outside these is a read-only file system in the jail.
WORKSPACE = "/workspace"
WRITABLE_DIRS = (WORKSPACE, "/tmp", "/dev/shm")
WRITE_SINKS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})


@dataclass(frozen=True)
class Finding:
    line: int
    col: int
    decision: Decision
    rule: str
    message: str


def is_outside(path: str) -> bool:
    """Whether writing at `path` (relative to the working directory /workspace) leaves the
    writable places of the sandbox."""
    full = posixpath.normpath(posixpath.join(WORKSPACE, path))
    full = "/" + full.lstrip("/")  # normpath keeps a leading '//' (POSIX); it is still '/'
    if full in WRITE_SINKS:
        return False
    return not any(full == d or full.startswith(d + "/") for d in WRITABLE_DIRS)


def matching(patterns: list[str], names: Iterable[str]) -> tuple[str, str] | None:
    """(name, pattern) for the first name, or the longest dotted prefix of one, that a pattern
    matches: a rule about `sys.modules` covers `sys.modules.get` too."""
    if not patterns:
        return None
    regex = one_regex(tuple(patterns))
    for name in sorted(names):
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            candidate = ".".join(parts[:end])
            if regex.match(candidate):
                return candidate, next(p for p in patterns if fnmatchcase(candidate, p))
    return None


@functools.lru_cache(maxsize=64)
def one_regex(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """One regular expression for a list of shell-style patterns: a name is matched once, not
    once per pattern."""
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))


def reads_code(profile: Profile) -> bool:
    """Whether any rule of `profile` is about the code itself (its imports, calls or writes)."""
    return bool(
        profile.imports_allow is not None
        or profile.imports_deny
        or profile.imports_approval
        or profile.calls_deny
        or profile.calls_approval
        or profile.attributes_deny
        or profile.module_values == "deny"
        or profile.writes_outside_workspace == "deny"
    )


def import_rule(profile: Profile, module: str) -> tuple[Decision, str] | None:
    """The rule an import of top-level `module` breaks under `profile`, if any."""
    if module == "__future__":
        return None  # a compiler directive, not a module the code uses
    if module in profile.imports_deny:
        return "deny", "import.deny"
    if profile.imports_allow is not None and module not in profile.imports_allow:
        return "deny", "import.not_allowed"
    if module in profile.imports_approval:
        return "needs_approval", "import.approval"
    return None


def call_rule(profile: Profile, names: set[str]) -> tuple[Decision, str, str, str] | None:
    """(decision, rule, name, pattern) for the first call rule `names` match, deny first."""
    hit = matching(profile.calls_deny, names)
    if hit is not None:
        return "deny", "call.deny", *hit
    hit = matching(profile.calls_approval, names)
    if hit is not None:
        return "needs_approval", "call.approval", *hit
    return None
