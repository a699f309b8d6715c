"""Tool schemas for agent frameworks, and a runner for the tool calls a model makes.

    tool = execbox.tools.openai_tool()            # or anthropic_tool()
    ... the model answers with a tool call ...
    observation = execbox.tools.execute_tool_call(executor, call)

The schemas' parameters come from the `RunPython` model; their descriptions tell the model what
is installed, that there is no network, where files are and which limits apply. The observation
is compact text a model reads well: status, error type and line, output (cut in the middle with
a note saying how much when long), artifacts, and a hint when a limit ended the run.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any, Literal, NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .contract import Limits, RunResult, Status
from .errors import UsageError
from .sandbox.inside.charts import MIME as CHART_MIME

__all__ = [
    "CODE_DESCRIPTIONS",
    "LANGUAGES",
    "TOOL_NAMES",
    "RunPython",
    "Runner",
    "ToolCallOutcome",
    "anthropic_tool",
    "describe_environment",
    "describe_language",
    "execute_tool_call",
    "format_observation",
    "openai_tool",
    "parameters_schema",
    "parse_tool_call",
    "perform_tool_call",
]

TOOL_NAME = "run_python"
LANGUAGES = ("python", "javascript", "bash")
# A tool's default name says its language: a model picks a tool by its name.
TOOL_NAMES = {"python": TOOL_NAME, "javascript": "run_javascript", "bash": "run_bash"}
MAX_OUTPUT_CHARS = 4000  # per stream in an observation: a model's context is the scarce resource
_PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)")


class _SessionFiles(Protocol):
    def write(self, path: str, data: bytes) -> Any: ...


class SessionLike(Protocol):
    """What `execute_tool_call` needs of an `execbox.Session`."""

    @property
    def files(self) -> _SessionFiles: ...

    def run(self, code: str, *, timeout_s: float | None = None) -> RunResult: ...


class Runner(Protocol):
    """What `execute_tool_call` needs of an `execbox.Executor` or an `execbox.Client`."""

    def run(
        self,
        code: str,
        *,
        language: str = ...,
        stdin: bytes | str | None = ...,
        files: Mapping[str, bytes] | None = ...,
        limits: Limits | Mapping[str, Any] | None = ...,
        profile: str = ...,
        network: str | Sequence[str] = ...,
        environment: str | None = ...,
    ) -> RunResult: ...


class ToolCallOutcome(NamedTuple):
    """A tool call's observation for the model, and the result of the run (None when the
    arguments were refused and nothing ran)."""

    observation: str
    result: RunResult | None


class RunPython(BaseModel):
    """Arguments of the `run_python` tool, as a model sends them."""

    model_config = ConfigDict(extra="forbid")

    code: str = Field(
        min_length=1,
        description="The complete Python program to run. Nothing is kept from earlier calls, so "
        "include every import and definition. print() what you need to see.",
    )
    stdin: str = Field("", description="Text fed to the program's standard input.")
    files: dict[str, str] = Field(
        default_factory=dict,
        description="Input files to place in /workspace before the program starts (read-only): "
        'relative path -> text content, e.g. {"data.csv": "a,b\\n1,2\\n"}.',
    )
    timeout_s: float | None = Field(
        None,
        gt=0,
        le=3600,  # Limits.timeout_s's own bound: a cell's timeout is checked only later
        description="Wall-time limit in seconds for this run.",
    )


# What the `code` argument holds, per language (the MCP tools use the same words).
CODE_DESCRIPTIONS = {
    "python": str(RunPython.model_fields["code"].description),
    "javascript": "The complete JavaScript program to run with Node.js, as main.js (CommonJS "
    "require; import/export syntax runs it as an ES module). Nothing is kept from earlier "
    "calls. console.log() what you need to see.",
    "bash": "The complete bash script to run, as main.sh, in /workspace. Nothing is kept from "
    "earlier calls. Echo or print what you need to see.",
}


def check_language(language: str) -> str:
    """`language`, or UsageError naming the languages a tool can run."""
    if language not in LANGUAGES:
        raise UsageError(
            f"unknown language {language!r}: a tool runs one of {', '.join(LANGUAGES)}"
        )
    return language


_STATELESS = "Each call starts from a clean state: nothing is kept between calls. "
_STATEFUL = (
    "Calls run as cells of one Python session, like a notebook: variables, imports and "
    "files persist from call to call, and the value of a last expression is shown. "
)
_STATEFUL_CODE = (
    "Python code to run as the next cell. Variables, imports and files from "
    "earlier calls are still there. print() what you need to see, or end with an "
    "expression."
)


def runtime_packages() -> dict[str, str]:
    """The packages user code can import and their pinned versions (runtime/requirements.in)."""
    runtime = resources.files("execbox") / "runtime"
    try:
        text = (runtime / "requirements.in").read_text()
    except OSError:  # an install without the .in file: the lock pins the same versions
        text = (runtime / "requirements.lock").read_text()
        wanted = {"numpy", "pandas", "matplotlib", "scipy"}
        return {m[1]: m[2] for m in map(_PIN.match, text.splitlines()) if m and m[1] in wanted}
    return {m[1]: m[2] for m in map(_PIN.match, text.splitlines()) if m}


def environment_packages(name: str) -> dict[str, str]:
    """The packages of the built environment `name` and their locked versions; UsageError
    when it is not built."""
    from . import environments

    text = (environments.lookup(name) / "requirements.lock").read_text()
    return {m[1]: m[2] for m in map(_PIN.match, text.splitlines()) if m}


def _python_version(environment: str | None = None) -> str:
    from . import environments
    from .image import Image

    try:
        root = environments.lookup(environment) if environment is not None else None
        return ".".join(Image.load(root).python_version.split(".")[:2])
    except Exception:  # noqa: BLE001 - no image on this host: the image is built from this Python
        return f"{sys.version_info.major}.{sys.version_info.minor}"


def _profile_limits(profile: str) -> tuple[Limits, Limits | None]:
    """The profile's default limits and maximums; the contract's defaults when unreadable."""
    from . import policy

    try:
        found = policy.load_profiles().get(profile)
    except Exception:  # noqa: BLE001 - a description must not fail on a broken profiles file
        found = None
    return (found.limits, found.max_limits) if found else (Limits(), None)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if n == int(n) or n >= 10 else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def describe_environment(
    limits: Limits | None = None,
    *,
    profile: str = "data",
    stateful: bool = False,
    timeout_arg: str = "timeout_s",
    network: Sequence[str] | None = None,
    environment: str | None = None,
) -> str:
    """What a model should know before it writes code for the sandbox, in a few sentences.

    `limits` are the limits the caller runs with; None means the profile's defaults.
    `stateful`: the calls run as cells of one session (`execute_tool_call(..., session=)`).
    `timeout_arg`: how the tool's argument that raises the wall-time limit is spelled.
    `network`: the hosts the caller lets its runs reach (None: no network).
    `environment`: the built environment the calls run in (None: the default); its packages
    are the ones listed (UsageError when it is not built)."""
    default_limits, max_limits = _profile_limits(profile)
    lim = limits or default_limits
    pins = runtime_packages() if environment is None else environment_packages(environment)
    packages = ", ".join(f"{name} {version}" for name, version in pins.items())
    longest = f", at most {max_limits.timeout_s:g} s" if max_limits else ""
    return (
        f"Run a Python {_python_version(environment)} program in a fresh, isolated sandbox and "
        "get back its "
        "status, stdout, stderr, the error (type and line) and the files it wrote. "
        + (_STATEFUL if stateful else _STATELESS)
        + f"Installed: {packages} and the standard library; nothing else can be installed. "
        "matplotlib uses the Agg backend: save charts with plt.savefig('chart.png'). "
        + (_network_sentence(network) if network else "There is no network access. ")
        + "The working directory is /workspace: input files are "
        "there, read-only; files the program writes under /workspace come back as artifacts, "
        "as written (secrets are redacted from output, not from files). "
        f"Limits per run: {lim.timeout_s:g} s wall time ({timeout_arg}{longest}), "
        f"{lim.effective_cpu_s:g} s CPU time, {lim.memory_mib} MiB memory, {lim.pids} processes, "
        f"{lim.disk_mib} MiB disk; stdout and stderr are cut at {_size(lim.output_bytes)} each; "
        f"at most {lim.artifact_files} artifacts, {_size(lim.artifact_bytes)} in all."
    )


_RUNTIMES = {
    "javascript": "a JavaScript program (as main.js: CommonJS, or an ES module when it uses "
    "import/export) with Node.js{version}",
    "bash": "a bash script (as main.sh) with coreutils, grep, sed, awk, jq and the other "
    "commands of the read-only system",
}


def describe_language(
    language: str,
    *,
    profile: str = "data",
    limits: Limits | None = None,
    timeout_arg: str = "limits.timeout_s",
    network: Sequence[str] | None = None,
    environment: str | None = None,
) -> str:
    """What a model should know before it writes code in `language` for the sandbox (Python's
    is `describe_environment`); UsageError for a language no tool runs. `environment`: the
    built environment the calls run in, whose npm packages a JavaScript run can require."""
    if check_language(language) == "python":
        return describe_environment(
            limits,
            profile=profile,
            timeout_arg=timeout_arg,
            network=network,
            environment=environment,
        )
    default_limits, max_limits = _profile_limits(profile)
    lim = limits or default_limits
    longest = f", at most {max_limits.timeout_s:g} s" if max_limits else ""
    runtime = _RUNTIMES[language].format(version=_node_version())
    has = ""
    if language == "javascript":
        npm = npm_packages(environment)
        listed = ", ".join(f"{name} {version}" for name, version in npm.items())
        has = (
            f"Installed: Node's built-in modules (fs, path, crypto, zlib, ...) and these npm "
            f"packages, for require() or import: {listed}. "
            if npm
            else "Node's built-in modules only (fs, path, crypto, zlib, ...): no npm packages. "
        )
    return (
        f"Run {runtime} in a fresh, isolated sandbox and get back its status, "
        "stdout, stderr, the error (type and line) and the files it wrote. "
        + _STATELESS
        + has
        + "Nothing can be installed. "
        + (_network_sentence(network) if network else "There is no network access. ")
        + "The working directory is /workspace: input files are "
        "there, read-only; files written under /workspace come back as artifacts. "
        f"Limits per run: {lim.timeout_s:g} s wall time ({timeout_arg}{longest}), "
        f"{lim.effective_cpu_s:g} s CPU time, {lim.memory_mib} MiB memory, {lim.pids} processes "
        f"and threads, {lim.disk_mib} MiB disk; stdout and stderr are cut at "
        f"{_size(lim.output_bytes)} each."
    )


def npm_packages(environment: str | None = None) -> dict[str, str]:
    """The npm packages a JavaScript run in `environment` (None: the default) can require,
    and their locked versions; empty when it has none or is not built here."""
    from . import environments

    try:
        root = (
            environments.lookup(environment)
            if environment is not None
            else environments.default_root()
        )
    except Exception:  # noqa: BLE001 - no environment on this host: nothing to list
        return {}
    return environments.npm_packages_of(root)


def _node_version() -> str:
    """The major version of the Node.js the jail runs, after a space; empty without one."""
    from .image import interpreter_pins

    pin = interpreter_pins().get("node")
    major = pin["version"].removeprefix("v").split(".")[0] if pin else ""
    return f" {major}" if major.isdigit() else ""


def _network_sentence(network: Sequence[str]) -> str:
    return (
        "Network: HTTP and HTTPS only, to these hosts only (ports 80 and 443 unless one is "
        f"named): {', '.join(network)}; through the proxy in HTTP_PROXY and HTTPS_PROXY, which "
        "urllib uses by itself; no DNS and no other connections. "
    )


def parameters_schema(
    limits: Limits | None = None,
    *,
    profile: str = "data",
    stateful: bool = False,
    language: str = "python",
) -> dict[str, Any]:
    """JSON schema of the tool's arguments, derived from `RunPython` (no titles, refs inlined);
    the `code` argument described for `language`. Sessions run Python only."""
    _check_stateful(check_language(language), stateful)
    default_limits, max_limits = _profile_limits(profile)
    lim = limits or default_limits
    schema = _inline_refs(RunPython.model_json_schema())
    _drop_titles(schema)
    schema.pop("description", None)  # the tool's own description says it all
    schema["properties"]["code"]["description"] = CODE_DESCRIPTIONS[language]
    if stateful:
        schema["properties"]["code"]["description"] = _STATEFUL_CODE
        del schema["properties"]["stdin"]  # a session's cells have no stdin
    timeout = schema["properties"]["timeout_s"]
    timeout["description"] += f" Default {lim.timeout_s:g}" + (
        f", at most {max_limits.timeout_s:g}." if max_limits else "."
    )
    if max_limits:
        for option in timeout.get("anyOf", [timeout]):
            if option.get("type") == "number":
                option["maximum"] = max_limits.timeout_s
    return schema


def openai_tool(
    limits: Limits | None = None,
    *,
    name: str | None = None,
    profile: str = "data",
    stateful: bool = False,
    api: Literal["chat", "responses"] = "chat",
    environment: str | None = None,
    language: str = "python",
) -> dict[str, Any]:
    """The tool in OpenAI's function-calling format: Chat Completions (`api="chat"`, the
    default) or the Responses API (`api="responses"`, the function fields at the top level).
    `stateful=True` describes calls that run as cells of one session; `environment`, calls
    that run in that environment (its packages are listed); `language`, the language the
    calls run ("python", "javascript" or "bash"; the default name is `TOOL_NAMES[language]`)."""
    function = {
        "name": name or TOOL_NAMES[check_language(language)],
        "description": _describe(limits, profile, stateful, environment, language),
        "parameters": parameters_schema(
            limits, profile=profile, stateful=stateful, language=language
        ),
    }
    if api == "responses":
        return {"type": "function", **function}
    return {"type": "function", "function": function}


def anthropic_tool(
    limits: Limits | None = None,
    *,
    name: str | None = None,
    profile: str = "data",
    stateful: bool = False,
    environment: str | None = None,
    language: str = "python",
) -> dict[str, Any]:
    """The tool in Anthropic's Messages API format (`name`, `description`, `input_schema`).
    `stateful=True` describes calls that run as cells of one session; `environment`, calls
    that run in that environment (its packages are listed); `language`, the language the
    calls run ("python", "javascript" or "bash"; the default name is `TOOL_NAMES[language]`)."""
    return {
        "name": name or TOOL_NAMES[check_language(language)],
        "description": _describe(limits, profile, stateful, environment, language),
        "input_schema": parameters_schema(
            limits, profile=profile, stateful=stateful, language=language
        ),
    }


def _check_stateful(language: str, stateful: bool) -> None:
    if stateful and language != "python":
        raise UsageError(f"sessions run Python only, not {language}: leave stateful off")


def _describe(
    limits: Limits | None, profile: str, stateful: bool, environment: str | None, language: str
) -> str:
    _check_stateful(check_language(language), stateful)
    if language == "python":
        return describe_environment(
            limits, profile=profile, stateful=stateful, environment=environment
        )
    return describe_language(
        language, profile=profile, limits=limits, timeout_arg="timeout_s", environment=environment
    )


def parse_tool_call(call: Any) -> tuple[str | None, Any]:
    """`(tool name or None, raw arguments)` of an OpenAI tool call (Chat Completions or
    Responses), an Anthropic `tool_use` block, an SDK object of either, or plain arguments
    (a dict or a JSON string). Arguments are returned as found: a dict or a JSON string."""
    if hasattr(call, "model_dump"):  # the vendors' SDK objects are pydantic models
        call = call.model_dump()
    if isinstance(call, str):
        return None, call
    if not isinstance(call, Mapping):
        raise UsageError(f"not a tool call: {type(call).__name__}")
    if isinstance(call.get("function"), Mapping):  # OpenAI Chat Completions
        return call["function"].get("name"), call["function"].get("arguments", "{}")
    if call.get("type") == "function_call":  # OpenAI Responses
        return call.get("name"), call.get("arguments", "{}")
    if call.get("type") == "tool_use":  # Anthropic
        return call.get("name"), call.get("input", {})
    return None, call


def execute_tool_call(
    executor: Runner,
    call: Any,
    *,
    limits: Limits | None = None,
    profile: str = "data",
    name: str | None = None,
    session: SessionLike | None = None,
    max_output_chars: int = MAX_OUTPUT_CHARS,
    network: Sequence[str] | None = None,
    environment: str | None = None,
    language: str = "python",
) -> str:
    """Run a tool call (`run_python`, or the tool of `language`) and return the observation
    to hand back to the model.

    `executor` is an `Executor` or a `Client` (the same call runs locally or on a server).
    `call` is what the model produced (see `parse_tool_call`). Arguments the model got wrong
    come back as an observation saying what to fix, not as an exception; a call of another
    tool or an unknown profile is the caller's mistake (UsageError), and `Overloaded` or a
    closed session raise as they do from the Executor and the Session. With `session`, the
    code runs as a cell of that stateful session (its files are written into the session
    first) instead of a fresh run. `network`: the hosts a fresh run may reach (the caller's
    choice, never the model's; pass the same to `describe_environment`). `environment`: the
    environment a fresh run runs in (None: the default; a session's is its own). `language`:
    what the code is ("python", "javascript" or "bash"; a session runs Python only).
    """
    return perform_tool_call(
        executor,
        call,
        limits=limits,
        profile=profile,
        name=name,
        session=session,
        max_output_chars=max_output_chars,
        network=network,
        environment=environment,
        language=language,
    ).observation


def perform_tool_call(
    executor: Runner,
    call: Any,
    *,
    limits: Limits | None = None,
    profile: str = "data",
    name: str | None = None,
    session: SessionLike | None = None,
    max_output_chars: int = MAX_OUTPUT_CHARS,
    network: Sequence[str] | None = None,
    environment: str | None = None,
    language: str = "python",
) -> ToolCallOutcome:
    """`execute_tool_call` (same arguments), with the `RunResult` beside the observation: the
    result is None when the arguments were refused and nothing ran, so a framework can send
    that case back through its own retry or error path."""
    _check_stateful(check_language(language), session is not None)
    name = name or TOOL_NAMES[language]
    called, raw = parse_tool_call(call)
    if called is not None and called != name:
        raise UsageError(f"tool call for {called!r}, not {name!r}")
    try:
        args = (
            RunPython.model_validate_json(raw)
            if isinstance(raw, str)
            else RunPython.model_validate(raw)
        )
    except ValidationError as exc:
        return ToolCallOutcome(_invalid(_problems(exc)), None)
    if session is not None:
        try:
            for path, content in args.files.items():
                session.files.write(path, content.encode())
        except UsageError as exc:  # a path the model made up badly
            return ToolCallOutcome(_invalid(str(exc)), None)
        result = session.run(args.code, timeout_s=args.timeout_s)
    else:
        from .request import make_request

        run_limits: Limits | dict[str, Any] | None = limits
        if args.timeout_s is not None:  # validated with the rest: model_copy would not check it
            run_limits = {
                **(limits.model_dump(exclude_unset=True) if limits is not None else {}),
                "timeout_s": args.timeout_s,
            }
        files = {k: v.encode() for k, v in args.files.items()}
        try:  # validated first: a bad argument is the model's to fix, not run()'s exception
            make_request(
                args.code,
                language=language,
                stdin=args.stdin,
                files=files,
                limits=run_limits,
                profile=profile,
                network=list(network) if network else "none",
                environment=environment,
            )
        except UsageError as exc:  # say, a file name with '..' in it
            cause = exc.__cause__
            problems = _problems(cause) if isinstance(cause, ValidationError) else str(exc)
            return ToolCallOutcome(_invalid(problems), None)
        result = executor.run(
            args.code,
            language=language,
            stdin=args.stdin,
            files=files,
            limits=run_limits,
            profile=profile,
            network=list(network) if network else "none",
            environment=environment,
        )
    return ToolCallOutcome(format_observation(result, max_output_chars=max_output_chars), result)


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors()
    )


def _invalid(problems: str) -> str:
    return f"status: invalid_arguments\nThe tool call was not run: {problems.rstrip('.')}."


_LIMIT_HINTS = {
    Status.timeout: "The run was killed at the wall-time limit ({timeout_s:g} s). Make the code "
    "faster (smaller data, vectorised numpy/pandas) or pass a larger timeout_s.",
    Status.cpu_limit: "The run used up its CPU time ({cpu_s:g} s). Make the code do less work.",
    Status.memory_limit: "The run was killed at the memory limit ({memory_mib} MiB). Use less "
    "memory: smaller arrays, chunked reading, fewer copies.",
    Status.disk_limit: "A write failed: the workspace is full ({disk_mib} MiB). Write less.",
    Status.output_limit: "The output passed the cap ({output_bytes} bytes per stream) and was "
    "cut. Print summaries (head(), describe(), counts), not whole data.",
    Status.forbidden: "The sandbox killed the program for a forbidden system call. There is no "
    "network and no debugging of other processes; plain computation works.",
    Status.policy_denied: "The policy refused the code before it ran; change what the message "
    "names.",
    Status.needs_approval: "The run is held until a person approves it; it has not run.",
    Status.budget_exceeded: "The execution budget of this task is used up.",
    Status.network_limit: "The run passed its network cap ({network_bytes} bytes, "
    "{network_connections} connections) and was ended. Fetch less.",
    Status.sandbox_error: "The sandbox failed (not the code's fault); trying again may work.",
}


def format_observation(result: RunResult, *, max_output_chars: int = MAX_OUTPUT_CHARS) -> str:
    """A compact, model-friendly text of a result (shared by `execute_tool_call` and the MCP
    server): status, error type and line, output (long output cut in the middle, with a note
    saying so and how much), artifacts, and a hint naming the limit that ended the run."""
    exit_note = f", exit code {result.exit_code}" if result.exit_code not in (None, 0) else ""
    lines = [f"status: {result.status.value}{exit_note}"]
    err = result.error
    if err is not None:
        where = (
            f" (line {err.line}" + (f", column {err.column}" if err.column else "") + ")"
            if err.line
            else ""
        )
        rule = f" [rule {err.rule}]" if err.rule else ""
        lines.append(f"error: {err.type}{where}: {err.message}{rule}")
    for label, text, capped in (
        ("stdout", result.stdout, result.stdout_truncated),
        ("stderr", result.stderr, result.stderr_truncated),
    ):
        if not text and not capped:
            continue
        shown, note = _cut(text, max_output_chars)
        notes = [
            n
            for n in (
                note,
                f"the sandbox stopped collecting it at {_size(result.limits.output_bytes)}"
                if capped
                else "",
            )
            if n
        ]
        header = f"{label} ({'; '.join(notes)})" if notes else label
        lines.append(f"{header}:\n{shown.rstrip(chr(10))}")
    has_plain = any(out.mime_type == "text/plain" for out in result.outputs)
    for out in result.outputs:
        if out.mime_type in ("text/plain", "application/json"):
            shown, note = _cut(out.data, max_output_chars)
            header = f"output ({note})" if note else "output"
            lines.append(f"{header}:\n{shown}" if "\n" in shown else f"{header}: {shown}")
        elif out.mime_type.startswith("image/"):
            lines.append(f"output: {out.mime_type} ({_size(len(out.data) * 3 // 4)})")
        elif out.mime_type == CHART_MIME:  # a figure's data: the image line above names it
            continue
        elif not has_plain:  # html and the like, when no plain-text form came with them
            lines.append(f"output: {out.mime_type} ({_size(len(out.data.encode()))})")
    if result.artifacts:
        listed = ", ".join(
            f"{a.path} ({a.mime_type}, {_size(a.size)})" for a in result.artifacts[:20]
        )
        more = f", and {len(result.artifacts) - 20} more" if len(result.artifacts) > 20 else ""
        lines.append(f"artifacts: {listed}{more}")
    if result.artifacts_truncated:
        lines.append(
            f"some files were not collected: at most {result.limits.artifact_files} "
            f"artifacts and {_size(result.limits.artifact_bytes)} in all"
        )
    hint = _LIMIT_HINTS.get(result.status)
    if hint:
        lim = result.limits
        lines.append(
            "hint: "
            + hint.format(
                timeout_s=lim.timeout_s,
                cpu_s=lim.effective_cpu_s,
                memory_mib=lim.memory_mib,
                disk_mib=lim.disk_mib,
                output_bytes=lim.output_bytes,
            )
        )
    if (
        result.status is Status.ok
        and not result.stdout
        and not result.artifacts
        and not result.outputs
    ):
        lines.append("(no output: print() the values you want to see)")
    return "\n".join(lines)


def _cut(text: str, max_chars: int) -> tuple[str, str]:
    """Keep the head and the tail of long text, on line boundaries where one is near; say how
    much of the middle was cut."""
    if len(text) <= max_chars:
        return text, ""
    head_len = max_chars * 2 // 3
    tail_start = len(text) - (max_chars - head_len)
    newline = text.rfind("\n", head_len * 3 // 4, head_len)
    head = text[: newline + 1] if newline >= 0 else text[:head_len]
    newline = text.find("\n", tail_start, tail_start + (len(text) - tail_start) // 4)
    tail = text[newline + 1 :] if newline >= 0 else text[tail_start:]
    cut = len(text) - len(head) - len(tail)
    return (
        f"{head}[... {cut:,} characters cut ...]\n{tail}",
        f"{len(text):,} characters, {cut:,} cut from the middle",
    )


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """Replace `$ref`s with their definitions: some function-calling APIs ignore `$defs`."""
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                merged = {
                    **defs[ref.removeprefix("#/$defs/")],
                    **{k: v for k, v in node.items() if k != "$ref"},
                }
                return resolve(merged)
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    resolved: dict[str, Any] = resolve(schema)
    return resolved


def _drop_titles(node: Any) -> None:
    """Pydantic's generated titles repeat the field names; they cost a model tokens."""
    if isinstance(node, dict):
        props = node.get("properties")
        node.pop("title", None)
        if isinstance(props, dict):
            for value in props.values():
                _drop_titles(value)
        for key in ("anyOf", "items", "additionalProperties"):
            child = node.get(key)
            for item in child if isinstance(child, list) else [child]:
                _drop_titles(item)
