"""Policy check: the stage before the sandbox that accepts, denies or holds a request.

A request names a profile (`RunRequest.profile`, default "data"). Profiles are data: the
`[profiles.NAME]` tables of a TOML file (the shipped `profiles.toml`, or the file named by the
EXECBOX_PROFILES environment variable). `check()` returns a `Verdict`:

- `allow`: run it, under `Verdict.limits` (the profile's default limits overridden by the
  fields the request set explicitly);
- `deny`: do not run it; the result is `policy_denied` with the rule id, a message saying what
  to do instead, and the line of the code when the rule is about the code;
- `needs_approval`: hold it; the executor returns it as such and its approval API releases it.

What is checked, in this order: code size, input caps (files, bytes, CSV rows), limits against
the profile's maximums, then the code's syntax tree (imports, calls, writes to constant paths).
Code that does not parse is allowed through (rule "code.syntax"): the sandbox reports the
SyntaxError with its line and column like any other error. Source bytes that do not decode
(`RunRequest.source_error`) are let through the same way (rule "code.encoding"); their
SyntaxError is known before any sandbox, so the executor reports it without starting one.

This is an early, explainable rejection layer, NOT the security boundary. The analysis resolves
names without evaluating anything: import aliases (`import os as o`, `from os import system as
s`, `from os import *`, `__import__("x")`, `importlib.import_module("x")`), names assigned a
module or a name (`p = pathlib`, `a, b = os, 1`, walrus), modules reached as attributes of
others (`pathlib.os`, `random._os`, `posix` for `os`) and constant lookups (`getattr(m, "os")`,
`sys.modules["os"]`, `m.__dict__["os"]`, `vars(m)["os"]`, `globals()["os"]`, `.get("os")`). A
rule naming `x.y` covers `x.y.z` too. What exists only at run time is not seen: a computed
`getattr` name, `exec`/`eval` of a built string, a computed import, a module passed through a
container or a call, objects returned by library calls, code that only runs in libraries, and
modules the code writes into the workspace. A profile can refuse the ways to those instead
(`attributes_deny` with computed attribute names, `module_values`, call rules on `exec` and
`sys.modules`), as `minimal` does. Write checks are best effort on constant paths only. The
sandbox (namespaces, read-only root, seccomp, cgroups) holds regardless of what this stage
lets through.
"""

from ..routing import scan_imports
from .checker import Verdict, check
from .names import CellContext
from .profiles import ENV_VAR, Decision, Profile, load_profiles
from .rules import WORKSPACE, WRITABLE_DIRS, WRITE_SINKS

__all__ = [
    "ENV_VAR",
    "WORKSPACE",
    "WRITABLE_DIRS",
    "WRITE_SINKS",
    "CellContext",
    "Decision",
    "Profile",
    "Verdict",
    "check",
    "load_profiles",
    "scan_imports",
]
