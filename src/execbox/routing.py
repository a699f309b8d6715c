"""Slot routing: the modules a program imports, read from its text, pick the kind of slot it
runs in (a choice of speed, not of policy)."""

from __future__ import annotations

import re
import sys
import unicodedata

# What an environment's zygotes import before they fork, of what the environment's tree has
# (`backend.warm_tiers`): the data stack, then the modules data code commonly imports that
# cost a second or more of CPU per run (scikit-learn, statsmodels, seaborn: in `ml`, not in
# the default `data`). sympy (0.5 s) and openpyxl (0.1 s) are left to the runs that use them:
# rarer, and every module here grows the zygote that their runs fork.
DATA_STACK = ("numpy", "numpy.random", "pandas", "matplotlib", "matplotlib.pyplot", "scipy")
WARM_IMPORTS = (
    *DATA_STACK,
    "sklearn",
    "sklearn.linear_model",
    "sklearn.ensemble",
    "statsmodels.api",
    "seaborn",
)
# The tiers: forking a zygote costs with its size (page tables, copies, teardown), so where
# the tree has more than the data stack, the heavy zygote preloads only the data stack and a
# full zygote, started at the first run that imports one of these, preloads the rest too
# (`program_kind`; bench/environments.py).
BEYOND_DATA_STACK = frozenset(m.split(".")[0] for m in WARM_IMPORTS) - frozenset(
    m.split(".")[0] for m in DATA_STACK
)


# Blanks within a statement: spaces, tabs and backslash-newline continuations.
_BLANK = r"(?:[ \t]|\\\r?\n)"
# After an `import` keyword: the dotted names it imports (`a.b as c, d`).
_IMPORTED_NAMES = re.compile(
    rf"{_BLANK}+([\w.]+(?:{_BLANK}+as{_BLANK}+\w+)?"
    rf"(?:{_BLANK}*,{_BLANK}*[\w.]+(?:{_BLANK}+as{_BLANK}+\w+)?)*)"
)
# Before it: `from a.b `, ending where the keyword starts.
_FROM_MODULE = re.compile(rf"(?<![\w.])from{_BLANK}+([\w.]+){_BLANK}+")
_FROM_REACH = 512  # how far back from `import` its `from a.b` may start
# After `__import__` or `import_module`: a constant name as the first argument.
_CONSTANT_ARGUMENT = re.compile(r"[ \t]*\([ \t]*[\"']([\w.]+)[\"']")


def scan_imports(code: str) -> frozenset[str]:
    """The top-level modules `code` imports, read from its text without parsing it: the names
    after each `import` keyword (`import a.b as c, d`, `from a.b import c`) and the constant
    first argument of `__import__(...)` and `import_module(...)`. Relative imports are left
    out, as the syntax tree's analysis leaves them out.

    A stand-in for the syntax tree where only the slot's kind depends on the imports: it finds
    every import that tree's analysis finds in ordinary code (tests compare the two over the
    standard library), and may find more (an import written in a string or a comment), which
    at worst runs the code in a bigger interpreter than it needs. One it misses (`__import__`
    spelled with other Unicode forms of its letters, which the parser normalizes) still works
    in a light program, at the price of the import, as an import with a computed name does.
    Linear in the code's size: 0.35-0.55 s here for a megabyte of nothing but `import ` (the
    default profile's cap), where parsing a megabyte of ordinary code took 0.7-1.7 s."""
    found: set[str] = set()
    at = code.find("import")
    while at >= 0:
        end = at + 6
        before = code[at - 1] if at else " "
        after = code[end] if end < len(code) else " "
        if at >= 2 and code.startswith("__", at - 2) and code.startswith("__", end):
            match = _CONSTANT_ARGUMENT.match(code, end + 2)
            if match:
                found.add(match[1])
        elif code.startswith("_module", end):
            match = _CONSTANT_ARGUMENT.match(code, end + 7)
            if match:
                found.add(match[1])
        elif not (before.isalnum() or before in "_.") and not (after.isalnum() or after == "_"):
            match, reach = None, max(0, at - _FROM_REACH)
            start = code.rfind("from", reach, at)
            while start >= 0 and match is None:  # `from a_from_b import c`: the first `from`
                match = _FROM_MODULE.fullmatch(code, start, at)
                start = code.rfind("from", reach, start)
            if match:
                found.add(match[1])
            else:
                match = _IMPORTED_NAMES.match(code, end)
                if match:
                    found.update(part.split()[0] for part in match[1].replace("\\", " ").split(","))
        at = code.find("import", end)
    tops = {name.split(".")[0] for name in found if not name.startswith(".")}
    return frozenset(top if top.isascii() else unicodedata.normalize("NFKC", top) for top in tops)


def program_kind(imports: frozenset[str] | None) -> str:
    """Which kind of slot runs the code (`protocol.SLOT_KINDS`): "light" (standard library
    only, a fork of a small interpreter) when the code imports nothing else; "full" when it
    imports a module that only the full zygote preloads (`BEYOND_DATA_STACK`:
    scikit-learn, statsmodels, seaborn), whose bigger interpreter costs more to fork; else a
    fork of the heavy zygote (the data stack already imported): "pandas" when it imports
    pandas (its program has copied the pages pandas' use writes), "heavy" otherwise. A host
    without a full zygote (its environment has nothing beyond the data stack, as the
    default's) runs "full" in a heavy slot. Code the policy could not parse fails to compile
    in the sandbox too: it goes light. An import the analysis cannot see (a computed name)
    still works in a lighter program, at the price of importing the module then."""
    if imports is None or imports <= _STDLIB:
        return "light"
    if not imports.isdisjoint(BEYOND_DATA_STACK):
        return "full"
    return "pandas" if "pandas" in imports else "heavy"


_STDLIB = frozenset(sys.stdlib_module_names)

# Variables Node reads only as it starts (options, module paths, locale, time zone, TLS): a
# staged Node (`sandbox.inside.staged`) started without them cannot apply them.
EXEC_TIME_PREFIXES = ("NODE_", "UV_", "LC_", "OPENSSL_", "SSL_CERT_")
EXEC_TIME_ENV = frozenset({"LANG", "LANGUAGE", "TZ", "ICU_DATA"})


def interpreter_kind(language: str, env: dict[str, str], code: str) -> str:
    """Which kind of slot runs JavaScript or bash: a staged interpreter waiting for its code
    ("javascript", "bash"), else a light slot whose program execs the interpreter for its
    request (the env in place): JavaScript whose `env` sets a variable Node reads only as it
    starts; bash whose code cannot be an argument or whose `env` names a variable a staged
    bash could not hand on as it is (`bash_env_stages`)."""
    if language == "javascript":
        if any(name in EXEC_TIME_ENV or name.startswith(EXEC_TIME_PREFIXES) for name in env):
            return "light"
        return "javascript"
    if (
        language == "bash"
        and _bash_stages(code)
        and all(map(bash_env_stages, env))
        and _bash_env_fits(env)
    ):
        return "bash"
    return "light"


# Bash's own variables: readonly (export fails), dynamic (exported, they would be recomputed),
# or steering the staged bash itself before it execs the code's (IFS, the locale's LC_*;
# SHLVL, which its exec lowers by one);
# `__execbox_*` are the staged bash's own (`staged.STAGED_BASH`).
_BASH_OWN = frozenset(
    "BASHOPTS SHELLOPTS ENV EUID UID PPID GROUPS RANDOM SRANDOM SECONDS LINENO FUNCNAME "
    "HISTCMD EPOCHSECONDS EPOCHREALTIME IFS DIRSTACK PIPESTATUS OPTIND OPTARG OPTERR COLUMNS "
    "LINES POSIXLY_CORRECT LANG SHLVL _".split()
)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Bash takes the code as one argument below this (interpreters.MAX_ARGUMENT_BYTES).
_BASH_MAX_ARGUMENT = 120 * 1024


def bash_env_stages(name: str) -> bool:
    """Whether a staged bash can export `name` for the code's bash as exec would pass it."""
    return (
        _IDENTIFIER.fullmatch(name) is not None
        and name not in _BASH_OWN
        and not name.startswith(("BASH", "LC_", "COMP_", "__execbox_"))
    )


# The environment a staged bash surely passes to exec (each string is under the kernel's
# 128 KiB, all of them well under the argument space): a larger one goes the unstaged way,
# where exec's E2BIG is a set-up error, not the code's exit status 126.
_BASH_MAX_ENV = 1 << 20


def _bash_env_fits(env: dict[str, str]) -> bool:
    sizes = [len(k) + len(v.encode("utf-8", "surrogatepass")) + 2 for k, v in env.items()]
    return all(size <= _BASH_MAX_ARGUMENT for size in sizes) and sum(sizes) <= _BASH_MAX_ENV


def _bash_stages(code: str) -> bool:
    """Code a staged bash passes to `bash -c` as the unstaged way does: no NUL (an argument
    ends there), not too long for one argument."""
    return "\0" not in code and len(code.encode("utf-8", "surrogatepass")) <= _BASH_MAX_ARGUMENT
