"""The check of one request: input caps, limits against the profile, then the syntax tree."""

from __future__ import annotations

import ast
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from ..contract import Limits, RunRequest
from ..errors import SandboxUnavailable, UsageError
from ..network.allowlist import parse_entries, within
from ..routing import scan_imports
from ..sandbox.inside import interpreters
from . import javascript
from .analysis import Analysis
from .names import CellContext
from .profiles import Decision, Profile, first_excess, limit_value, show_number
from .rules import reads_code


@dataclass(frozen=True)
class Verdict:
    """The policy's answer for one request.

    `rule`, `message` and `line` explain a deny or a hold (and an allow without analysis,
    rule "code.syntax"); `line` is the 1-based line of the code, None when the rule is not
    about a line. `limits` are the limits the run gets (or asked for, when denied).
    """

    decision: Decision
    rule: str | None
    message: str | None
    line: int | None
    limits: Limits
    # Top-level modules the code imports (statically, and through __import__/importlib with a
    # constant name): from its syntax tree under a profile with rules about the code, else
    # from a scan of its text (`scan_imports`); None when the code did not parse.
    imports: frozenset[str] | None = None


# ast.parse from several threads at once can fail with "AST constructor recursion depth
# mismatch" on CPython 3.11 (python/cpython#106905); parses are short, so serialize them.
_PARSE_LOCK = threading.Lock()


def check(
    request: RunRequest,
    profiles: Mapping[str, Profile],
    *,
    cell: CellContext | None = None,
    default_environment: str | None = None,
) -> Verdict:
    """Decide whether `request` may run under its profile, and with which limits. `cell`: the
    code is a session cell, which IPython runs (its `!cmd` and `%magic` are not Python) after
    the cells `cell` holds the bindings of; an allowed or held cell's are added to it.
    `default_environment`: the name of the environment a request naming none runs in (None:
    not known by a name); every profile allows it, and the others its `environments` lists.

    Raises UsageError when the request names a profile that `profiles` does not define.
    """
    profile = profiles.get(request.profile)
    if profile is None:
        known = ", ".join(repr(name) for name in profiles) or "none"
        raise UsageError(f"unknown policy profile {request.profile!r}; known profiles: {known}")
    verdict = Checker(request, request.profile, profile, profiles, cell, default_environment).run()
    if verdict.decision == "allow" and profile.missing_imports == "approval" and verdict.imports:
        return missing_imports(
            verdict, request.profile, profile, request.environment, default_environment
        )
    return verdict


def missing_imports(
    verdict: Verdict,
    key: str,
    profile: Profile,
    environment: str | None = None,
    default: str | None = None,
) -> Verdict:
    """Rule import.missing: hold code that imports a top-level module `environment` (None:
    `default`, the executor's, else the home's) lacks, naming the environments `profile` allows
    that have it (the hint a run that went ahead would get)."""
    from .. import environments

    default = default or environments.default_name()
    name = environment or default
    have = environments.modules_of(environments.lookup(name))
    missing = sorted(m for m in verdict.imports or () if m not in have and m != "__future__")
    if not missing:
        return verdict
    hint = environments.missing_hint_in(missing[0], [name], profile.allowed_environments(default))
    return replace(
        verdict,
        decision="needs_approval",
        rule="import.missing",
        message=(
            f"the code imports {', '.join(missing)}, which environment {name!r} lacks; profile "
            f"{key!r} holds such runs for approval ({hint})"
        ),
        line=None,
    )


def _effective_limits(requested: Limits, profile: Profile) -> Limits:
    """The profile's default limits overridden by the fields `requested` set explicitly."""
    cap = profile.max_limits
    if not requested.model_fields_set and profile.limits.effective_cpu_s <= cap.effective_cpu_s:
        return profile.limits  # most requests set none: the defaults as they are (frozen)
    explicit = {field: getattr(requested, field) for field in requested.model_fields_set}
    limits = Limits.model_validate({**profile.limits.model_dump(), **explicit})
    if "cpu_s" not in explicit and limits.effective_cpu_s > cap.effective_cpu_s:
        # The caller asked for a longer timeout, not for more CPU time: CPU time followed the
        # timeout by default. Cap it at the profile's maximum instead of denying a request for
        # something the caller never asked for.
        limits = Limits.model_validate({**limits.model_dump(), "cpu_s": cap.effective_cpu_s})
    return limits


def _lines(data: bytes) -> int:
    """Lines of a CSV file, header included: a cheap upper bound on its rows (a quoted field
    with a newline counts twice), without parsing."""
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({n} bytes)"
    return f"{n} bytes"


class Checker:
    """One check of one request: the rules in order, then the syntax tree."""

    def __init__(
        self,
        request: RunRequest,
        key: str,
        profile: Profile,
        profiles: Mapping[str, Profile],
        cell: CellContext | None = None,
        default_environment: str | None = None,
    ) -> None:
        self.request = request
        self.default_environment = default_environment
        self.key = key
        self.profile = profile
        self.profiles = profiles
        self.cell = cell
        self.limits = _effective_limits(request.limits, profile)

    def verdict(
        self,
        decision: Decision,
        rule: str | None = None,
        message: str | None = None,
        line: int | None = None,
        imports: frozenset[str] | None = None,
    ) -> Verdict:
        return Verdict(
            decision=decision,
            rule=rule,
            message=message,
            line=line,
            limits=self.limits,
            imports=imports,
        )

    def advice(self, accepts: Callable[[Profile], bool], otherwise: str) -> str:
        """What to do: the first other profile (in file order) that accepts, and `otherwise`."""
        for key, profile in self.profiles.items():
            if key != self.key and accepts(profile):
                return f"choose profile {key!r}, or {otherwise}"
        return otherwise

    def run(self) -> Verdict:
        p, key = self.profile, self.key
        code_bytes = len(self.request.code.encode("utf-8", "surrogatepass"))
        if code_bytes > p.max_code_bytes:
            return self.verdict(
                "deny",
                "code.size",
                (
                    f"the code is {_size(code_bytes)}, over the {_size(p.max_code_bytes)} cap of "
                    f"profile {key!r}; "
                    + self.advice(
                        lambda q: code_bytes <= q.max_code_bytes,
                        "make the code smaller (pass data as input files)",
                    )
                ),
            )
        denied = (
            self.language()
            or self.inputs()
            or self.limit_maximums()
            or self.network()
            or self.environment()
        )
        if denied is not None:
            return denied
        verdict = self.code()
        if verdict.decision == "allow" and self.request.network != "none" and p.network_approval:
            return self.verdict(
                "needs_approval",
                "network.approval",
                f"profile {key!r} holds every run with network access for approval "
                f"(asked for: {', '.join(self.request.network)})",
                imports=verdict.imports,
            )
        return verdict

    def language(self) -> Verdict | None:
        """Rule language.not_allowed: the profile lists the languages it runs; its rules about
        the code read Python's syntax tree only, so it cannot vouch for another language."""
        language, p, key = self.request.language, self.profile, self.key
        if language in p.languages and (language != "bash" or not reads_code(p)):
            return None
        why = (
            f"profile {key!r} runs {', '.join(p.languages)}"
            if language not in p.languages
            else f"profile {key!r} has rules about the code, which a bash script would escape"
        )
        return self.verdict(
            "deny",
            "language.not_allowed",
            f"{language} code is not allowed: {why}; "
            + self.advice(
                lambda q: language in q.languages and not reads_code(q), "write it in Python"
            ),
        )

    def code(self) -> Verdict:
        """The verdict on the code itself (its encoding, syntax and the profile's rules)."""
        p, key = self.profile, self.key
        undecodable = self.request.source_error
        if undecodable is not None:  # as CPython, which reads nothing of such a file
            return self.verdict(
                "allow",
                "code.encoding",
                (
                    f"the code was not analysed (SyntaxError: {undecodable.msg}); "
                    "the run reports the error"
                ),
                undecodable.lineno,
            )
        if self.request.language == "javascript":
            return self.javascript()
        if self.request.language != "python":  # bash: `language` let it through unread
            return self.verdict("allow", imports=frozenset())
        if not reads_code(p):
            # No rule of the profile is about the code (the default profile, `data`): nothing
            # to parse it for. Its imports only pick the kind of slot it runs in, a choice of
            # speed, so a scan of the text stands in for the syntax tree (see `scan_imports`).
            return self.verdict("allow", imports=scan_imports(self.request.code))
        try:
            with _PARSE_LOCK:  # CPython 3.11's parser is not safe from several threads
                tree = ast.parse(self.request.code, filename="main.py")  # as the sandbox does
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            line = exc.lineno if isinstance(exc, SyntaxError) else None
            if self.cell is not None:
                # IPython turns what is not Python into calls the rules never see: `!cmd` and
                # `x = !cmd` run a shell, `%magic` anything. Only Python is let through.
                return self.verdict(
                    "deny",
                    "code.not_python",
                    (
                        f"the cell is not Python ({type(exc).__name__}: {exc}); under profile "
                        f"{key!r} a cell must be Python: IPython's shell escapes and magics (!cmd, "
                        "%magic) would run past its rules; "
                        + self.advice(lambda q: not reads_code(q), "write it in Python")
                    ),
                    line,
                )
            # Not a deny: the sandbox compiles the code too and reports the error with its line
            # and column as an ordinary `error` result, which tells the author far more.
            return self.verdict(
                "allow",
                "code.syntax",
                (
                    f"the code was not analysed ({type(exc).__name__}: {exc}); "
                    "the run reports the error"
                ),
                line,
            )
        analysis = Analysis(tree, self, self.cell.snapshot() if self.cell else None)
        findings = analysis.findings
        imports = frozenset(analysis.imports)
        if self.cell is not None and all(f.decision != "deny" for f in findings):
            # The cell runs, now or once approved: what it binds holds for the next ones.
            self.cell.add(analysis.resolver)
        for decision in ("deny", "needs_approval"):
            chosen = [f for f in findings if f.decision == decision]
            if chosen:
                first = min(chosen, key=lambda f: (f.line, f.col))
                return self.verdict(first.decision, first.rule, first.message, first.line, imports)
        return self.verdict("allow", imports=imports)

    def javascript(self) -> Verdict:
        """The profile's JavaScript rules, on the modules acorn finds (see `javascript`)."""
        p, key = self.profile, self.key
        if not p.javascript_modules_deny and not reads_code(p):
            return self.verdict("allow", imports=frozenset())
        node = interpreters.find("node")
        if node is None:
            raise SandboxUnavailable("javascript runs need node in /usr/bin or /usr/local/bin")
        steering = sorted(k for k in self.request.env if k.startswith(javascript.STEERING_ENV))
        if steering:
            return self.verdict(
                "deny",
                "js.env",
                f"environment variable {steering[0]} steers Node or its loader before the code "
                f"runs, past the checks of profile {key!r}; leave it out",
            )
        found = javascript.analyse(self.request.code, node)
        if found.error is not None:
            # Not the Python rule's allow: what acorn cannot read, V8 may still run (acorn
            # refuses some code V8 takes, and a deep enough expression overflows its stack).
            message, line = found.error
            return self.verdict(
                "deny",
                "js.syntax",
                f"the check of profile {key!r} cannot read the code ({message}, line {line}), "
                "and runs only code it has read; fix the syntax",
                line,
                frozenset(),
            )
        denied = set(p.javascript_modules_deny)
        modules = [(name, line) for name, line in found.modules if name in denied]
        if modules:
            name, line = min(modules, key=lambda m: m[1])
            return self.verdict(
                "deny",
                "js.module_denied",
                f"module {name!r} (line {line}) is denied by profile {key!r}; "
                + self.advice(
                    lambda q: "javascript" in q.languages and name not in q.javascript_modules_deny,
                    "do without it",
                ),
                line,
                frozenset(),
            )
        if found.dynamic:
            what, line = min(found.dynamic, key=lambda d: d[1])
            return self.verdict(
                "deny",
                "js.dynamic",
                f"{what} (line {line}): profile {key!r} checks the modules JavaScript code "
                "loads, and cannot follow this; name modules with a constant require('...')",
                line,
                frozenset(),
            )
        return self.verdict("allow", imports=frozenset())

    def inputs(self) -> Verdict | None:
        p, key, files = self.profile, self.key, self.request.files
        if len(files) > p.max_input_files:
            count = len(files)
            return self.verdict(
                "deny",
                "input.files",
                (
                    f"{count} input files, over the cap of {p.max_input_files} of profile {key!r}; "
                    + self.advice(
                        lambda q: count <= q.max_input_files, "send fewer files (e.g. one archive)"
                    )
                ),
            )
        total = sum(len(f.data) for f in files) + len(self.request.stdin)
        if total > p.max_input_bytes:
            return self.verdict(
                "deny",
                "input.bytes",
                (
                    f"input files and stdin total {_size(total)}, over the "
                    f"{_size(p.max_input_bytes)} cap of profile {key!r}; "
                    + self.advice(lambda q: total <= q.max_input_bytes, "send less data")
                ),
            )
        csv_lines = [(f.name, _lines(f.data)) for f in files if f.name.lower().endswith(".csv")]
        over = [(name, rows) for name, rows in csv_lines if rows > p.max_csv_rows]
        if over:
            name, rows = over[0]
            return self.verdict(
                "deny",
                "input.csv_rows",
                (
                    f"input {name!r} has {rows} lines, over the {p.max_csv_rows}-row cap of "
                    f"profile {key!r}; "
                    + self.advice(lambda q: rows <= q.max_csv_rows, "send a sample or an aggregate")
                ),
            )
        return None

    def network(self) -> Verdict | None:
        """Each network entry the request asks for must fall within a pattern of the
        profile's `network_allow` (rules network.not_allowed, network.entry)."""
        asked = self.request.network
        if asked == "none":
            return None
        key, allowed = self.key, self.profile.network_allow

        def accepts(q: Profile) -> bool:
            patterns = parse_entries(q.network_allow, pattern=True)
            return all(any(within(e, p) for p in patterns) for e in entries)

        entries = parse_entries(list(asked))
        if not allowed:
            return self.verdict(
                "deny",
                "network.not_allowed",
                f"profile {key!r} allows no network access (asked for: {', '.join(asked)}); "
                + self.advice(accepts, "run without network"),
            )
        patterns = parse_entries(allowed, pattern=True)
        for entry in entries:
            if not any(within(entry, pattern) for pattern in patterns):
                return self.verdict(
                    "deny",
                    "network.entry",
                    f"network entry {entry.text!r} is not within what profile {key!r} allows "
                    f"({', '.join(allowed)}); "
                    + self.advice(accepts, "ask for hosts and ports the profile allows"),
                )
        return None

    def environment(self) -> Verdict | None:
        """A run naming an environment: the default, or one its profile lists."""
        asked = self.request.environment
        default = self.default_environment
        if asked is None or asked == default:
            return None  # the default environment: every profile allows it

        def allows(profile: Profile) -> bool:
            return asked in (profile.environments or ())

        if allows(self.profile):
            return None
        names = ", ".join(
            [f"the default ({default!r})" if default else "the default"]
            + [repr(n) for n in self.profile.environments or ()]
        )
        return self.verdict(
            "deny",
            "environment.not_allowed",
            (
                f"environment {asked!r} is not allowed under profile {self.key!r}, which allows "
                f"{names}; " + self.advice(allows, "ask for one of those (environment=...)")
            ),
        )

    def limit_maximums(self) -> Verdict | None:
        excess = first_excess(self.limits, self.profile.max_limits)
        if excess is None:
            return None
        field, value, most = excess
        return self.verdict(
            "deny",
            "limits.max",
            (
                f"limits.{field} = {show_number(value)} is over the maximum of {show_number(most)} under profile "
                f"{self.key!r}; "
                + self.advice(
                    lambda q: value <= limit_value(q.max_limits, field),
                    f"ask for at most {show_number(most)}",
                )
            ),
        )
