"""The execution contract: what goes into a run and what comes out.

These models are the public wire format (DESIGN.md section 2). Field names and status values are
the contract; change them only on purpose and keep `schema()` and the docs in step. No I/O here.
"""

from __future__ import annotations

import base64
import io
import json
import tokenize
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_serializer,
    field_validator,
    model_validator,
)

from .network.allowlist import parse_entries

MIB = 1024 * 1024
# What one request (a run, a session, a cell) may register as secrets: each value costs
# matching on every result, so a flood of them is refused before anything is built.
MAX_SECRETS = 256
MAX_SECRETS_BYTES = 64 * 1024
# What an environment may be called (`execbox env build NAME`): it names a directory.
ENVIRONMENT_NAME = r"^[a-z][a-z0-9_-]{0,31}$"
# Variables the sandbox's runner sets for a language's interpreter (sandbox.inside.interpreters).
RUNNER_ENV: dict[str, tuple[str, ...]] = {
    "javascript": ("UV_THREADPOOL_SIZE",),
    "bash": ("BASH_ENV",),
}


def check_secrets(values: Iterable[str]) -> tuple[str, ...]:
    """`values` as a tuple; ValueError naming the limit when they are more than MAX_SECRETS
    values or MAX_SECRETS_BYTES of UTF-8 in all, or not all strings."""
    values = tuple(values)
    if len(values) > MAX_SECRETS:
        raise ValueError(
            f"{len(values)} secrets given; at most {MAX_SECRETS} per request "
            "(execbox.contract.MAX_SECRETS)"
        )
    if not all(isinstance(v, str) for v in values):
        raise ValueError("secrets must be strings")
    size = sum(len(v.encode("utf-8", "surrogatepass")) for v in values)
    if size > MAX_SECRETS_BYTES:
        raise ValueError(
            f"secrets hold {size} bytes of UTF-8; at most {MAX_SECRETS_BYTES} per "
            "request (execbox.contract.MAX_SECRETS_BYTES)"
        )
    return values


def _checked_secrets(values: list[str]) -> list[str]:
    check_secrets(values)
    return values


Secrets = Annotated[
    list[str],
    AfterValidator(_checked_secrets),
    Field(
        description=f"Values redacted, with their escaped forms (repr, JSON, URL, HTML) and "
        f"their starts and ends shown alone (see redact.part_length), from "
        f"output, errors and the record; at most {MAX_SECRETS} values and "
        f"{MAX_SECRETS_BYTES} bytes. Artifacts and files are not redacted."
    ),
]
"""The `secrets` field of a request model (HTTP API): capped as `check_secrets` says."""


class BoundSecret(BaseModel):
    """A secret bound to hosts: the run's environment holds a placeholder under `name`, and
    the network proxy puts `value` in its place only in the `headers` of HTTPS requests to
    `hosts`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="The environment variable that holds the placeholder.")
    value: str = Field(description="The secret; it never enters the sandbox.")
    hosts: list[str] = Field(
        description="The names (or '*.domain'), with ':PORT' unless 443, whose HTTPS requests "
        "get the value; each must be on the run's network allowlist. Plain http and other "
        "ports of these names are refused."
    )
    headers: list[str] | None = Field(
        default=None,
        description="The request headers the value is swapped into (default: Authorization).",
    )


BoundSecrets = Annotated[
    list[BoundSecret],
    Field(
        description="Secrets bound to hosts (runs with a network allowlist): the code sees a "
        "placeholder, the proxy swaps in the value in the named headers of HTTPS requests "
        "to the secret's hosts only. Value and placeholder are redacted like `secrets`."
    ),
]
"""The `bound_secrets` field of a request model (HTTP API)."""


def _base64_schema(schema: dict[str, Any]) -> None:
    """Bytes travel as base64 text in JSON; say so in the schema (not 'format: binary')."""
    schema.pop("format", None)
    schema["contentEncoding"] = "base64"


Language = Literal["python", "javascript", "bash"]
"""What `RunRequest.code` is written in: Python, JavaScript (Node.js) or a bash script."""


class Status(StrEnum):
    """How a run ended. Only `sandbox_error` is execbox's fault; the rest describe the code."""

    ok = "ok"
    error = "error"
    timeout = "timeout"
    cpu_limit = "cpu_limit"
    memory_limit = "memory_limit"
    disk_limit = "disk_limit"
    output_limit = "output_limit"
    forbidden = "forbidden"
    policy_denied = "policy_denied"
    needs_approval = "needs_approval"
    budget_exceeded = "budget_exceeded"
    sandbox_error = "sandbox_error"
    network_limit = "network_limit"


class Limits(BaseModel):
    """Resource limits of one run. Defaults follow the seed baseline profile."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float = Field(5.0, gt=0, le=3600, description="Wall-clock time limit in seconds.")
    cpu_s: float | None = Field(
        None,
        gt=0,
        le=3600,
        description="CPU time limit of the whole tree in seconds; null = timeout_s.",
    )
    memory_mib: int = Field(512, ge=16, le=65536, description="Memory limit (RAM + swap) in MiB.")
    pids: int = Field(64, ge=4, le=4096, description="Maximum processes and threads at once.")
    disk_mib: int = Field(
        100, ge=1, le=65536, description="Size of the writable /workspace in MiB."
    )
    output_bytes: int = Field(
        MIB, ge=1024, le=256 * MIB, description="Cap on stdout and on stderr, each, in bytes."
    )
    artifact_bytes: int = Field(10 * MIB, ge=0, le=1024 * MIB, description="Cap on artifact bytes.")
    artifact_files: int = Field(100, ge=0, le=10000, description="Cap on the number of artifacts.")
    network_bytes: int = Field(
        100 * MIB,
        ge=0,
        le=64 * 1024 * MIB,
        description="Cap on the bytes through the network proxy, up and down together "
        "(runs with a network allowlist).",
    )
    network_connections: int = Field(
        100,
        ge=1,
        le=100000,
        description="Cap on the destinations a run asks the network proxy for (each "
        "CONNECT, each forwarded request, refused ones included).",
    )

    @property
    def effective_cpu_s(self) -> float:
        return self.cpu_s if self.cpu_s is not None else self.timeout_s


class InputFile(BaseModel):
    """A file placed read-only in the workspace before the code starts."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Relative path inside /workspace, e.g. 'data/sales.csv'.")
    data: bytes = Field(
        description="File content (base64 in JSON).", json_schema_extra=_base64_schema
    )

    @field_validator("name")
    @classmethod
    def _relative_clean_path(cls, name: str) -> str:
        parts = name.split("/")
        if (
            not name
            or name.startswith("/")
            or any(p in ("", ".", "..") for p in parts)
            or "\x00" in name
            or len(name.encode()) > 1024
            or any(len(p.encode()) > 255 for p in parts)
        ):
            raise ValueError(
                f"input file name {name!r} must be a clean relative path "
                "(no '..', no leading '/', no empty parts, at most 255 bytes per part)"
            )
        return name

    @field_validator("data", mode="before")
    @classmethod
    def _decode_base64(cls, value: Any) -> Any:
        if isinstance(value, str):
            return base64.b64decode(value, validate=True)
        return value

    @field_serializer("data")
    def _encode_base64(self, data: bytes) -> str:
        return base64.b64encode(data).decode()


SOURCE_FILENAME = "main.py"  # the name the code runs under in the sandbox
SOURCE_ERROR = "source_error"  # where a RunRequest keeps its undecodable source's SyntaxError


def decode_source(data: bytes) -> str:
    """The text of a source file's bytes, decoded as CPython decodes a file it runs: a UTF-8
    BOM, else a PEP 263 coding cookie, else UTF-8. Raises SyntaxError as CPython does for
    `python main.py`, with the line and column of the first byte that does not decode."""
    head = data.removeprefix(b"\xef\xbb\xbf").splitlines(keepends=True)[:2]
    try:
        encoding, read = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        try:  # no cookie was read because a first line is not UTF-8: CPython names the byte
            b"".join(head).decode("utf-8")
        except UnicodeDecodeError:
            encoding, read = "utf-8", []
        else:
            raise SyntaxError(
                str(exc), (SOURCE_FILENAME, _cookie_line(head) or 1, None, None)
            ) from None
    cookie_line = _cookie_line(head[: len(read)])  # a cookie below a line of code is none
    skip = 3 if encoding == "utf-8-sig" else 0
    try:
        return data[skip:].decode("utf-8" if skip else encoding)
    except UnicodeDecodeError as exc:
        start = exc.start + skip
        line_start = data.rfind(b"\n", 0, start) + 1
        line_end = data.find(b"\n", start)
        lineno = data.count(b"\n", 0, start) + 1
        column = len(data[max(line_start, skip) : start].decode(exc.encoding)) + 1
        text = data[line_start : None if line_end < 0 else line_end + 1].decode(
            exc.encoding, "replace"
        )
        if cookie_line is not None:
            message = f"(unicode error) {exc}"
        else:  # CPython's words for a file it runs
            message = (
                f"Non-UTF-8 code starting with '\\x{data[start]:02x}' in file "
                f"{SOURCE_FILENAME} on line {lineno}, but no encoding declared; "
                "see https://peps.python.org/pep-0263/ for details"
            )
        raise SyntaxError(message, (SOURCE_FILENAME, lineno, column, text)) from None


def _cookie_line(lines: list[bytes]) -> int | None:
    return next(
        (i + 1 for i, line in enumerate(lines) if tokenize.cookie_re.match(line.decode("latin-1"))),
        None,
    )


class RunRequest(BaseModel):
    """Everything a run needs. The sandbox sees nothing that is not in here."""

    model_config = ConfigDict(extra="forbid")

    language: Language = Field(
        "python",
        description="Language of `code`: python, javascript (the machine's Node.js) or bash.",
    )
    code: str = Field(description="The program to run.")
    stdin: bytes = Field(
        b"",
        description="Bytes fed to standard input (base64 in JSON).",
        json_schema_extra=_base64_schema,
    )
    files: list[InputFile] = Field(default_factory=list, description="Read-only input files.")
    limits: Limits = Field(default_factory=Limits, description="Resource limits.")
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment of the program (empty unless given)."
    )
    network: Literal["none"] | list[str] = Field(
        "none",
        description="Network access: 'none' (the default), or an allowlist of "
        "'host[:port]' entries ('*.example.com' for the names under a domain, an address, a "
        "CIDR block; ports 80 and 443 unless an entry names one), reached through the "
        "proxy that HTTP_PROXY/HTTPS_PROXY/ALL_PROXY name in the run.",
    )
    profile: str = Field("data", description="Policy profile checked before the run.")
    environment: str | None = Field(
        None,
        pattern=ENVIRONMENT_NAME,
        description="The named environment (`execbox env list`) whose packages the code can "
        "import; null = the executor's default. The profile must allow it.",
    )

    @model_validator(mode="wrap")
    @classmethod
    def _source_bytes(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """In Python, `code` may be the bytes of a source file, decoded as CPython decodes one.
        Bytes that do not decode still make a request: its `code` shows the bad bytes as \\x
        escapes and `source_error` holds CPython's SyntaxError, which the run reports as its
        result without starting the sandbox."""
        source = data.get("code") if isinstance(data, dict) else None
        if not isinstance(source, (bytes, bytearray, memoryview)):
            return handler(data)
        source = bytes(source)
        error = None
        if isinstance(data, dict) and data.get("language", "python") != "python":
            # Node and bash read UTF-8 text: bytes that are not are a caller's mistake.
            try:
                text = source.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"code: not UTF-8 text ({exc})") from exc
            return handler({**data, "code": text})
        try:
            code = decode_source(source)
        except SyntaxError as exc:
            error = exc
            code = source.decode("utf-8", "backslashreplace")
        request = handler({**data, "code": code})
        if error is not None:
            # Kept where pydantic keeps private attributes (copies and comparisons carry it),
            # set only here: a declared PrivateAttr costs every request a Python call (~4 us).
            object.__setattr__(request, "__pydantic_private__", {SOURCE_ERROR: error})
        return request

    @property
    def source_error(self) -> SyntaxError | None:
        """CPython's SyntaxError for source bytes that do not decode; None for text."""
        private = self.__pydantic_private__
        return private.get(SOURCE_ERROR) if private else None

    @field_validator("code")
    @classmethod
    def _unicode_code(cls, code: str) -> str:
        try:
            code.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate ("\udcff" in JSON, say)
            line = code.count("\n", 0, exc.start) + 1
            raise ValueError(
                f"the code is not valid Unicode text: a lone surrogate "
                f"{code[exc.start]!r} on line {line}"
            ) from None
        return code

    @field_validator("env")
    @classmethod
    def _valid_env(cls, env: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        for key, value in env.items():
            if not key or "=" in key or "\x00" in key or "\x00" in value:
                raise ValueError(f"invalid environment variable name or value: {key!r}")
        # The runner's own variables (Node's thread pool, bash's prelude with the `set -e`
        # report): a request's value would replace them, so it is refused, not ignored.
        language = info.data.get("language", "python")
        for name in RUNNER_ENV.get(language, ()):
            if name in env:
                raise ValueError(
                    f"environment variable {name} is set by execbox for {language} runs; "
                    "leave it out"
                )
        return env

    @field_validator("network")
    @classmethod
    def _network_entries(cls, network: str | list[str]) -> str | list[str]:
        if isinstance(network, str):
            return network
        if not network:
            raise ValueError("network: give 'none' or at least one 'host[:port]' entry")
        return [entry.text for entry in parse_entries(network)]

    @field_validator("files")
    @classmethod
    def _unique_names(cls, files: list[InputFile]) -> list[InputFile]:
        names = [f.name for f in files]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate input file names: {dupes}")
        prefixes = {"/".join(n.split("/")[:i]) for n in names for i in range(1, n.count("/") + 1)}
        clash = sorted(prefixes & set(names))
        if clash:
            raise ValueError(f"input names used both as file and directory: {clash}")
        return files

    @field_validator("stdin", mode="before")
    @classmethod
    def _stdin_base64(cls, value: Any) -> Any:
        if isinstance(value, str):
            return base64.b64decode(value, validate=True)
        return value

    @field_serializer("stdin")
    def _stdin_to_base64(self, data: bytes) -> str:
        return base64.b64encode(data).decode()


class ErrorInfo(BaseModel):
    """A structured error: what failed, and where in the user's code."""

    type: str = Field(description="Exception type, or the limit that ended the run.")
    message: str = Field(description="Human-readable message; limits name the setting to raise.")
    line: int | None = Field(None, description="1-based line in the user's code, when known.")
    column: int | None = Field(None, description="1-based column (SyntaxError), when known.")
    traceback: str | None = Field(None, description="Traceback showing the user's frames only.")
    rule: str | None = Field(None, description="Policy rule id, for policy_denied/needs_approval.")


class Artifact(BaseModel):
    """A regular file the run created or changed under /workspace."""

    path: str = Field(description="Path relative to /workspace.")
    size: int = Field(description="Size in bytes.")
    sha256: str = Field(description="Hex SHA-256 of the content.")
    mime_type: str = Field(description="Guessed MIME type.")
    data: bytes | None = Field(None, exclude=True, repr=False, description="Content (not in JSON).")


class Metrics(BaseModel):
    """Resource use of the whole process tree."""

    wall_ms: float = Field(description="Wall time from start of the code to the end of the tree.")
    cpu_ms: float = Field(description="CPU time (user + system) of every process in the run.")
    memory_peak_bytes: int | None = Field(
        description="Peak memory of the run's cgroup, in bytes; null where the kernel keeps "
        "no peak (cgroup v2 before Linux 5.19)."
    )
    node: str | None = Field(
        None,
        description="The cluster node that ran it (its Ray node id); null for a run on the "
        "caller's own machine.",
    )


class Output(BaseModel):
    """One rich output of a session cell (a display call, a chart, the last expression)."""

    mime_type: str = Field(description="text/plain, image/png, text/html or application/json.")
    data: str = Field(description="The content: text as is, binary data base64-encoded.")


class NetworkConnection(BaseModel):
    """One destination a run asked its network proxy for, allowed or not."""

    time: str = Field(description="When it was asked for (ISO 8601, UTC).")
    method: str = Field(description="CONNECT (a tunnel, TLS) or the forwarded request's method.")
    host: str = Field(description="The host as the run asked for it.")
    port: int = Field(description="The port asked for.")
    address: str | None = Field(None, description="The address dialled; null when none was.")
    verdict: Literal["allowed", "denied", "failed"] = Field(
        description="allowed; denied by a rule; failed (name or connection error)."
    )
    rule: str = Field(description="The rule that decided: network.allow, network.host, ...")
    entry: str | None = Field(None, description="The allowlist entry that matched the host.")
    message: str | None = Field(None, description="Why it was denied or failed.")
    bytes_up: int = Field(0, description="Bytes sent to the destination.")
    bytes_down: int = Field(0, description="Bytes received from the destination.")
    duration_ms: float | None = Field(None, description="How long it lasted.")


class RunResult(BaseModel):
    """The outcome of one run (or of one session cell)."""

    run_id: str
    status: Status
    exit_code: int | None = None
    signal: str | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    error: ErrorInfo | None = None
    artifacts: list[Artifact] = Field(
        default_factory=list,
        description="Files the run wrote, bytes as written: secret redaction applies to "
        "output, errors and artifact paths, not to artifact bytes.",
    )
    artifacts_truncated: bool = Field(
        False, description="True when files were left out because of the artifact caps."
    )
    inputs_read: list[str] | None = Field(
        None,
        description="The input files the code read (a session cell: the session so far); "
        "null when no inputs were given.",
    )
    metrics: Metrics = Field(
        default_factory=lambda: Metrics(wall_ms=0, cpu_ms=0, memory_peak_bytes=0)
    )
    limits: Limits = Field(default_factory=Limits)
    unenforced_limits: list[str] = Field(
        default_factory=list,
        description="The fields of `limits` that did not hold for this run: `memory_mib` and "
        "`pids` in rootless mode with no delegated cgroup, accepted unenforced by the caller "
        "(see `execbox doctor`); empty when every limit held.",
    )
    code_sha256: str = Field(
        "",
        description="The sha256 of the code as recorded: with the registered secrets and "
        "known key formats in it redacted (of the code itself when none are).",
    )
    image_digest: str = ""
    cached: bool = False
    session_id: str | None = Field(None, description="The session a cell ran in; null for runs.")
    network_log: list[NetworkConnection] = Field(
        default_factory=list,
        description="Every destination the run asked its network proxy for; empty without "
        "a network allowlist.",
    )
    outputs: list[Output] = Field(
        default_factory=list,
        description="Rich outputs of a session cell, in order; the last expression's value is "
        "a text/plain item. Empty for runs.",
    )

    @property
    def ok(self) -> bool:
        return self.status is Status.ok

    def artifact(self, path: str) -> Artifact:
        """The artifact at `path`; KeyError if the run produced none there."""
        for art in self.artifacts:
            if art.path == path:
                return art
        raise KeyError(path)


class StreamEvent(BaseModel):
    """One event of a streamed run or cell: output as it happens, then the result."""

    kind: Literal["stdout", "stderr", "result"]
    text: str | None = Field(None, description="The output chunk (stdout/stderr events).")
    result: RunResult | None = Field(None, description="The final result (the last event).")


def schema() -> dict[str, Any]:
    """JSON schema of the request and result models, for other languages and tools."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "execbox execution contract",
        "RunRequest": RunRequest.model_json_schema(),
        "RunResult": RunResult.model_json_schema(mode="serialization"),
    }


def write_schema(path: Path) -> None:
    path.write_text(json.dumps(schema(), indent=2, sort_keys=True) + "\n")
