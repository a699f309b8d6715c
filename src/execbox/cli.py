"""The `execbox` command. Exit status: 0 when the run's status is ok, 1 for any other run status,
2 for usage or host errors.

It starts light: commands import what they need when they run, and the commands of other
modules load when named, so that `execbox run` through a running server costs little more than
starting Python (see `client.uds`).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NoReturn

import click

from .client import local
from .errors import ExecboxError, UsageError

if TYPE_CHECKING:
    from .contract import RunRequest, RunResult
    from .image import Image
    from .sandbox.host.probe import Check

EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
# Past this much time beyond the run itself, `execbox run` says what its own executor cost.
START_NOTE_S = 0.5


def _fail(message: str) -> NoReturn:
    click.echo(f"execbox: {message}", err=True)
    sys.exit(EXIT_USAGE)


def _parse_inputs(specs: tuple[str, ...]) -> dict[str, Path]:
    files: dict[str, Path] = {}
    for spec in specs:
        path, _, name = spec.partition(":")
        files[name or Path(path).name] = Path(path)
    return files


def _parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"--env expects NAME=VALUE, got {pair!r}")
        env[name] = value
    return env


def write_artifacts(result: RunResult, directory: Path) -> list[Path]:
    """Write the run's artifacts under `directory`, never outside it and never through a link.

    An artifact whose path cannot be created (say, a file where another artifact needs a
    directory) is skipped with a warning; the others are still written.
    """
    return write_files(((art.path, art.data) for art in result.artifacts), directory)


def write_files(files: Iterable[tuple[str, bytes | None]], directory: Path) -> list[Path]:
    """`write_artifacts` for (path, bytes) pairs; a pair without bytes is skipped."""
    written = []
    directory.mkdir(parents=True, exist_ok=True)
    root_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for path, data in files:
            if data is None:
                continue
            parts = [p.replace("\x00", "_") for p in path.split("/")]
            if any(p in ("", ".", "..") for p in parts):
                continue
            try:
                _write_one(root_fd, parts, data)
                written.append(directory / path)
            except OSError as exc:
                click.echo(f"execbox: artifact {path!r} not written: {exc}", err=True)
    finally:
        os.close(root_fd)
    return written


def _write_one(root_fd: int, parts: list[str], data: bytes) -> None:
    dir_fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            try:
                os.mkdir(part, 0o755, dir_fd=dir_fd)
            except FileExistsError:
                pass
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = nxt
        fd = os.open(
            parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd
        )
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    finally:
        os.close(dir_fd)


class LazyGroup(click.Group):
    """A group whose commands from other modules (`name: "module:attribute"`) are imported
    only when named, or when the help lists them."""

    def __init__(self, *args: Any, lazy: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            module, _, attribute = self.lazy[cmd_name].partition(":")
            command = getattr(importlib.import_module(module), attribute)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    lazy={
        "serve": "execbox.server.cli:serve",
        "keys": "execbox.server.cli:keys",
        "mcp": "execbox.mcp:mcp_command",
        "ask": "execbox.agent.cli:ask_cmd",
        "env": "execbox.env_cli:env_group",
        "eval": "execbox.evals.cli:eval_group",
    },
)
@click.version_option(package_name="execbox")
def main() -> None:
    """execbox: run the code AI agents write, isolated, limited, and with evidence."""


@main.command("run")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "--stdin",
    "stdin_path",
    type=click.Path(dir_okay=False, exists=True),
    help="File fed to the program's standard input.",
)
@click.option(
    "--input",
    "inputs",
    multiple=True,
    metavar="PATH[:NAME]",
    help="Input file placed read-only in /workspace (as NAME). Repeatable.",
)
@click.option(
    "--language",
    type=click.Choice(["python", "javascript", "bash"]),
    help="Language of FILE (default: from its extension, .js/.mjs/.cjs javascript, .sh/.bash "
    "bash; else python).",
)
@click.option("--timeout", type=float, help="Wall time limit in seconds (default 5).")
@click.option("--cpu", type=float, help="CPU time limit in seconds (default: the wall limit).")
@click.option("--memory", type=int, help="Memory limit in MiB (default 512).")
@click.option("--disk", type=int, help="Workspace size in MiB (default 100).")
@click.option("--pids", type=int, help="Process and thread limit (default 64).")
@click.option("--output-bytes", type=int, help="Cap on stdout and stderr each (default 1 MiB).")
@click.option(
    "--env",
    "env_pairs",
    multiple=True,
    metavar="NAME=VALUE",
    help="Environment variable for the program (the default environment is empty).",
)
@click.option(
    "--allow-net",
    "allow_net",
    multiple=True,
    metavar="HOST[:PORT]",
    help="A host the program may reach through the network proxy ('*.example.com' for the "
    "names under a domain; ports 80 and 443 unless one is named). Repeatable; none: no network.",
)
@click.option(
    "--secret-for",
    "secret_for",
    multiple=True,
    metavar="NAME=HOST[,HOST]",
    help="Bind the secret in this shell's variable NAME to HOSTs: the program's NAME holds a "
    "placeholder, the proxy sends the value only in the Authorization header of HTTPS "
    "requests to them (HOST:PORT unless 443). Repeatable.",
)
@click.option("--network-bytes", type=int, help="Cap on network proxy traffic (default 100 MiB).")
@click.option(
    "--network-connections", type=int, help="Cap on network connections asked for (default 100)."
)
@click.option("--json", "as_json", is_flag=True, help="Print exactly one RunResult as JSON.")
@click.option(
    "--artifacts-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write the run's artifacts here.",
)
@click.option(
    "--profile",
    default="data",
    show_default=True,
    help="Policy profile checked before the run (see profiles.toml).",
)
@click.option(
    "--environment",
    metavar="NAME",
    help="The environment to run in (`execbox env list`; default: the default one).",
)
@click.option("--no-cache", is_flag=True, help="Always run, never answer from the result cache.")
@click.option(
    "--secret",
    "secrets",
    multiple=True,
    metavar="VALUE",
    help="A value to redact from output, errors and the record. Repeatable.",
)
@click.option(
    "--server",
    metavar="URL",
    help="Send the run to this execbox serve: unix:PATH or http(s)://HOST:PORT (key from "
    "EXECBOX_API_KEY or EXECBOX_API_KEY_FILE); 'none' runs here. Default: EXECBOX_SERVER, else "
    "the local socket of a running execbox serve, else here.",
)
@click.option(
    "--allow-unenforced-limits",
    metavar="LIMITS",
    help="Rootless mode without a delegated cgroup: run although these limits (memory,pids) "
    "are not enforced (also EXECBOX_ALLOW_UNENFORCED_LIMITS). Refused otherwise.",
)
@click.option(
    f"--{local.PLAIN_HTTP_FLAG}",
    "plain_http",
    is_flag=True,
    help="Send the API key to an http:// server that is not on loopback, where anyone on the "
    "way can read it (refused otherwise: use https).",
)
def run_cmd(
    file: str,
    stdin_path: str | None,
    inputs: tuple[str, ...],
    language: str | None,
    timeout: float | None,
    cpu: float | None,
    memory: int | None,
    disk: int | None,
    pids: int | None,
    output_bytes: int | None,
    env_pairs: tuple[str, ...],
    allow_net: tuple[str, ...],
    secret_for: tuple[str, ...],
    network_bytes: int | None,
    network_connections: int | None,
    as_json: bool,
    artifacts_dir: Path | None,
    profile: str,
    environment: str | None,
    no_cache: bool,
    secrets: tuple[str, ...],
    server: str | None,
    allow_unenforced_limits: str | None,
    plain_http: bool,
) -> None:
    """Run FILE (or - for standard input) in a fresh sandbox."""
    if allow_unenforced_limits is not None:
        from .sandbox.host import rootless

        try:
            rootless.parse_allowed(allow_unenforced_limits)
        except ValueError as exc:
            _fail(str(exc))
        # The executor this command starts reads it (a server applies its own setting).
        os.environ[rootless.ALLOW_ENV] = allow_unenforced_limits

    try:
        # Bytes: decoded as CPython decodes a file (BOM, coding cookie); bytes that do not
        # decode are the run's SyntaxError, a result like any other.
        code = sys.stdin.buffer.read() if file == "-" else Path(file).read_bytes()
    except OSError as exc:
        _fail(f"cannot read {file}: {exc}")
    overrides: dict[str, Any] = {
        k: v
        for k, v in {
            "timeout_s": timeout,
            "cpu_s": cpu,
            "memory_mib": memory,
            "disk_mib": disk,
            "pids": pids,
            "output_bytes": output_bytes,
            "network_bytes": network_bytes,
            "network_connections": network_connections,
        }.items()
        if v is not None
    }
    on_stdout = None if as_json else _writer(sys.stdout.buffer)
    on_stderr = None if as_json else _writer(sys.stderr.buffer)
    language = language or language_of(file)
    # Plain text goes to a local server the fast way; what is not (or a run that sets this
    # process's own limits) takes the full path, which decodes it as CPython would.
    text = plain_source(code, language) if allow_unenforced_limits is None else None
    target = UNCHOSEN if text is None else _choose_early(server, plain_http)
    if isinstance(target, local.Target) and target.socket is not None:
        served = _run_served(
            target.socket,
            {
                "language": language,
                "code": text,
                "stdin": stdin_path,
                "inputs": inputs,
                "env_pairs": env_pairs,
                "limits": overrides,
                "profile": profile,
                "network": list(allow_net) if allow_net else "none",
                "environment": environment,
                "cache": False if no_cache else None,
                "secrets": list(secrets),
                "secret_for": secret_for,
            },
            as_json=as_json,
            artifacts_dir=artifacts_dir,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
        )
        if served is not None:
            sys.exit(served)
    from .contract import Limits
    from .request import make_request

    try:
        request = make_request(
            code,
            language=language,
            stdin=Path(stdin_path).read_bytes() if stdin_path else None,
            files=_parse_inputs(inputs),
            env=_parse_env(env_pairs),
            limits=Limits(**overrides) if overrides else None,
            profile=profile,
            network=list(allow_net) if allow_net else "none",
            environment=environment,
        )
        if isinstance(target, _Unchosen):
            # JSON carries text only: source bytes that do not decode are answered here, as
            # CPython's SyntaxError, without a sandbox.
            target = (
                None
                if request.source_error is not None
                else local.choose(server, plain_http=plain_http)
            )
        result, in_process = _run(
            request,
            target,
            cache=False if no_cache else None,
            secrets=secrets,
            bound_secrets=bound_from_environment(secret_for),
            on_stdout=on_stdout,
            on_stderr=on_stderr,
        )
    except ExecboxError as exc:
        _fail(str(exc))
    except ValueError as exc:
        _fail(f"invalid limits: {exc}")
    if artifacts_dir is not None:
        write_artifacts(result, artifacts_dir)
    if as_json:
        click.echo(result.model_dump_json())
    else:
        _summary(result, artifacts_dir)
        if in_process:
            _start_note(_process_age_s(), result)
    sys.exit(EXIT_OK if result.ok else EXIT_RUN_FAILED)


class _Unchosen:
    """No server chosen yet."""


UNCHOSEN = _Unchosen()


def _choose_early(server: str | None, plain_http: bool) -> local.Target | None | _Unchosen:
    """The server, chosen before the request is built; UNCHOSEN when the choice is an error,
    which the full path reports in the order a run without a server reports its errors."""
    try:
        return local.choose(server, plain_http=plain_http)
    except UsageError:
        return UNCHOSEN


def _writer(stream: BinaryIO) -> Callable[[bytes], None]:
    """A callback writing output to `stream` as it comes."""

    def write(data: bytes) -> None:
        stream.write(data)
        stream.flush()

    return write


def plain_source(code: bytes, language: str) -> str | None:
    """The program's text when it is plain UTF-8 (no BOM, no coding cookie, for Python), which
    reads the same everywhere; None for anything else, which the full path decodes."""
    if language == "python" and (
        code.startswith(b"\xef\xbb\xbf") or b"coding" in b"\n".join(code.split(b"\n", 2)[:2])
    ):
        return None
    try:
        return code.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _run_served(
    socket_path: Path,
    run: dict[str, Any],
    *,
    as_json: bool,
    artifacts_dir: Path | None,
    on_stdout: Callable[[bytes], None] | None,
    on_stderr: Callable[[bytes], None] | None,
) -> int | None:
    """The run on the local server's socket without httpx or pydantic, printed as a run sent
    any other way is: its exit status, or None when nothing ran and the full path must say
    why (the server found the request invalid, input that cannot be read)."""
    import binascii

    from .client import uds

    def b64(data: bytes) -> str:
        return binascii.b2a_base64(data, newline=False).decode()

    try:
        files = [
            {"name": name, "data": b64(path.read_bytes())}
            for name, path in _parse_inputs(run.pop("inputs")).items()
        ]
        stdin_path = run.pop("stdin")
        stdin = Path(stdin_path).read_bytes() if stdin_path else b""
        env = _parse_env(run.pop("env_pairs"))
        bound = bound_from_environment(run.pop("secret_for"))
    except (OSError, UsageError):
        return None
    body = {**run, "stdin": b64(stdin), "files": files, "env": env}
    if not body["limits"]:
        del body["limits"]  # the server's defaults, as Limits() gives them
    if body["environment"] is None:
        del body["environment"]  # a server from before environments knows no such field
    if bound:
        body["bound_secrets"] = bound
    timeout_s = float(run["limits"].get("timeout_s", 0)) + local.ANSWER_MARGIN_S
    try:
        raw, result, data = uds.run(
            socket_path,
            body,
            timeout_s=timeout_s,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            artifacts=artifacts_dir is not None,
        )
    except (uds.NotSent, uds.Invalid):
        return None
    except ExecboxError as exc:
        _fail(str(exc))
    if artifacts_dir is not None:
        write_files(((a["path"], data.get(a["path"])) for a in result["artifacts"]), artifacts_dir)
    if as_json:
        click.echo(raw.decode())
    else:
        summary(result, artifacts_dir)
    return EXIT_OK if result["status"] == "ok" else EXIT_RUN_FAILED


def _run(
    request: RunRequest,
    target: local.Target | None,
    *,
    cache: bool | None,
    secrets: tuple[str, ...],
    bound_secrets: list[dict[str, Any]],
    on_stdout: Callable[[bytes], None] | None,
    on_stderr: Callable[[bytes], None] | None,
) -> tuple[RunResult, bool]:
    """The run on the server `execbox run` chose (see client.local), else in this process;
    and whether it ran in this process."""
    options: dict[str, Any] = {
        "cache": cache,
        "secrets": secrets,
        "bound_secrets": bound_secrets,
        "on_stdout": on_stdout,
        "on_stderr": on_stderr,
    }
    if target is not None:
        return local.run_on(target, request, **options), False
    from .executor import Executor

    with Executor() as executor:
        return executor.run_request(request, **options), True


def _process_age_s() -> float:
    """Seconds since this process started (its interpreter's start and imports included)."""
    with open("/proc/self/stat") as fh:
        # Field 22, counted after the command name's closing parenthesis (which may hold spaces).
        start_ticks = int(fh.read().rpartition(")")[2].split()[19])
    return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")


def _start_note(elapsed_s: float, result: RunResult) -> None:
    """Say once what the command cost beyond its run: a user who sees `wall=4ms` and waited a
    second and more should learn why, and how to stop paying it. (Not under --json: a program
    reads that output, and can keep an executor itself.)"""
    overhead = elapsed_s - result.metrics.wall_ms / 1000
    if overhead <= START_NOTE_S:
        return
    click.echo(
        f"[execbox] this command took {elapsed_s:.1f} s, the run {result.metrics.wall_ms:.0f} ms: "
        f"the rest ({overhead:.1f} s) is starting Python and a sandbox executor and closing it, "
        "which every `execbox run` does. With `execbox serve` running, `execbox run` uses it "
        "and starts in a fraction of that; in Python, keep one `execbox.Executor`.",
        err=True,
    )


LANGUAGE_OF_SUFFIX = {
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".sh": "bash",
    ".bash": "bash",
}


def language_of(file: str) -> str:
    """The language FILE's extension names; python for any other (and for standard input)."""
    return LANGUAGE_OF_SUFFIX.get(Path(file).suffix.lower(), "python")


def bound_from_environment(pairs: tuple[str, ...]) -> list[dict[str, Any]]:
    """`--secret-for NAME=HOST[,HOST]`: the value from this process's environment (never
    from the command line, which other users of the host can read)."""
    bound = []
    for pair in pairs:
        name, sep, hosts = pair.partition("=")
        if not sep or not name or not hosts:
            raise UsageError(f"--secret-for {pair!r}: give NAME=HOST[,HOST]")
        value = os.environ.get(name)
        if value is None:
            raise UsageError(f"--secret-for {name}: no variable {name} in this shell's environment")
        bound.append({"name": name, "value": value, "hosts": hosts.split(",")})
    return bound


def _summary(result: RunResult, artifacts_dir: Path | None) -> None:
    summary(result.model_dump(mode="json", include=SUMMARY_FIELDS), artifacts_dir)


SUMMARY_FIELDS = {
    "status",
    "cached",
    "exit_code",
    "signal",
    "metrics",
    "run_id",
    "error",
    "network_log",
    "artifacts",
    "unenforced_limits",
}


def summary(result: Mapping[str, Any], artifacts_dir: Path | None) -> None:
    """The run's summary lines on stderr, from its RunResult's JSON (SUMMARY_FIELDS)."""
    m = result["metrics"]
    peak = m["memory_peak_bytes"]
    mem = "unknown" if peak is None else f"{peak / 2**20:.1f}MiB"
    line = (
        f"[execbox] {result['status']}{' (cached)' if result['cached'] else ''}"
        f"  exit={result['exit_code']}"
        f"{'  signal=' + result['signal'] if result['signal'] else ''}"
        f"  wall={m['wall_ms']:.0f}ms  cpu={m['cpu_ms']:.0f}ms  mem={mem}  run={result['run_id']}"
    )
    click.echo(line, err=True)
    unenforced = result.get("unenforced_limits") or []
    if unenforced:
        click.echo(
            f"[execbox] warning: limits NOT enforced for this run: {', '.join(unenforced)} "
            "(rootless mode without a delegated cgroup; see `execbox doctor`)",
            err=True,
        )
    error = result["error"]
    if error and result["status"] != "error":
        click.echo(f"[execbox] {error['type']}: {error['message']}", err=True)
    for conn in result["network_log"]:
        click.echo(
            f"[execbox] network {conn['method']} {conn['host']}:{conn['port']} "
            f"{conn['verdict']} ({conn['rule']}) up={conn['bytes_up']} down={conn['bytes_down']}"
            + (f": {conn['message']}" if conn["message"] else ""),
            err=True,
        )
    for art in result["artifacts"]:
        where = f" -> {artifacts_dir / art['path']}" if artifacts_dir else ""
        click.echo(
            f"[execbox] artifact {art['path']} ({art['size']} bytes, {art['mime_type']}){where}",
            err=True,
        )


@main.group(cls=LazyGroup)
def runs() -> None:
    """Inspect, replay and approve recorded runs."""


def _store() -> Any:
    from .records import RunStore

    return RunStore()


@runs.command("list")
@click.option("--limit", default=20, show_default=True)
@click.option("--status", help="Only runs with this status.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def runs_list(limit: int, status: str | None, as_json: bool) -> None:
    """The most recent runs, newest first."""
    import time as _time

    for rec in _store().list(limit=limit, status=status):
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "run_id": rec.run_id,
                        "created_at": rec.created_at,
                        "kind": rec.kind,
                        "status": rec.status,
                        "profile": rec.profile,
                        "code_sha256": rec.code_sha256,
                    }
                )
            )
            continue
        when = _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(rec.created_at))
        first = (rec.code.strip().splitlines() or [""])[0][:48]
        click.echo(f"{rec.run_id}  {when}  {rec.status:<15} {rec.kind:<9} {first}")


@runs.command("show")
@click.argument("run_id")
def runs_show(run_id: str) -> None:
    """The full record of one run, as JSON."""
    rec = _store().get(run_id)
    if rec is None:
        _fail(f"no run {run_id!r}")
    click.echo(rec.model_dump_json(indent=2))


@runs.command("replay")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Print the replay report as JSON.")
@click.option(
    "--secret",
    "secrets",
    multiple=True,
    metavar="VALUE",
    help="A secret the record keeps redacted, given again. Repeatable.",
)
def runs_replay(run_id: str, as_json: bool, secrets: tuple[str, ...]) -> None:
    """Run a recorded run again under its recorded limits; exit 0 when the results match."""
    from .executor import Executor

    try:
        with Executor() as executor:
            report = executor.replay(run_id, secrets=secrets)
    except ExecboxError as exc:
        _fail(str(exc))
    if as_json:
        click.echo(report.model_dump_json())
    else:
        verdict = "matches" if report.matches else f"differs in {', '.join(report.differences)}"
        click.echo(f"replay {report.replay.run_id} of {run_id}: {verdict}")
        if report.image_changed:
            click.echo(
                f"note: image changed {report.original.image_digest} -> "
                f"{report.replay.image_digest}"
            )
        if report.env_redacted:
            click.echo(
                f"note: environment values were redacted in the record: "
                f"{', '.join(report.env_redacted)}"
            )
    sys.exit(EXIT_OK if report.matches else EXIT_RUN_FAILED)


@runs.command("approve")
@click.argument("run_id")
@click.option("--by", "approved_by", help="Who approves (stored with the record).")
@click.option("--json", "as_json", is_flag=True, help="Print the RunResult as JSON.")
@click.option(
    "--secret",
    "secrets",
    multiple=True,
    metavar="VALUE",
    help="A secret the record keeps redacted, given again. Repeatable.",
)
def runs_approve(
    run_id: str, approved_by: str | None, as_json: bool, secrets: tuple[str, ...]
) -> None:
    """Release a run held by policy (`needs_approval`) and run it now."""
    from .executor import Executor

    try:
        with Executor() as executor:
            result = executor.approve(run_id, approved_by=approved_by, secrets=secrets)
    except ExecboxError as exc:
        _fail(str(exc))
    if as_json:
        click.echo(result.model_dump_json())
    else:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        _summary(result, None)
    sys.exit(EXIT_OK if result.ok else EXIT_RUN_FAILED)


def _host_checks() -> list[Check]:
    """The sandbox's checks of this host, with what mounting environments needs listed
    before the runtime image's own check."""
    from .environments.doctor import checks as environment_checks
    from .sandbox.host.probe import run_checks

    checks = run_checks()
    if any(c.name == "root" for c in checks) and all(
        c.ok for c in checks if c.name in ("linux", "root")
    ):
        # What mounting the runtime image needs, listed before the image's own check.
        at = next((i for i, c in enumerate(checks) if c.name == "runtime image"), len(checks))
        checks[at:at] = environment_checks()
    return checks


def _print_checks(checks: list[Check]) -> None:
    for c in checks:
        mark = "ok  " if c.ok else ("FAIL" if c.required else "warn")
        click.echo(f"{mark} {c.name:<14} {c.detail}")
        if not c.ok and c.fix:
            click.echo(f"     {'':<14} fix: {c.fix}")


def _smoke_runs() -> bool:
    """A standard-library run and a numpy run in the real sandbox, each reported on a line."""
    from .executor import Executor

    try:
        with Executor() as ex:
            r = ex.run("import os; print(os.getuid())")
            # The data stack's zygote starts in the background: its own smoke run.
            heavy = ex.run("import numpy, pandas; print(numpy.__version__)")
    except ExecboxError as exc:
        click.echo(f"FAIL {'smoke run':<14} {exc}")
        return False
    ok = r.ok and r.stdout.strip() != "0"
    click.echo(
        f"{'ok  ' if ok else 'FAIL'} {'smoke run':<14} status={r.status.value} "
        f"uid={r.stdout.strip()} wall={r.metrics.wall_ms:.1f}ms"
    )
    click.echo(
        f"{'ok  ' if heavy.ok else 'FAIL'} {'numpy run':<14} "
        f"status={heavy.status.value} "
        + (
            f"numpy={heavy.stdout.strip()}"
            if heavy.ok
            else f"error={heavy.error.message if heavy.error else ''}"
        )
    )
    return ok and heavy.ok


@main.command()
def doctor() -> None:
    """Say what this host can enforce, what is missing, and how to fix it."""
    checks = _host_checks()
    _print_checks(checks)
    if all(c.ok or not c.required for c in checks):
        sys.exit(EXIT_OK if _smoke_runs() else EXIT_USAGE)
    sys.exit(EXIT_USAGE)


@main.command()
def setup() -> None:
    """Check this host, build the runtime image, and prove a sandboxed run works.

    Exits 2, building nothing, when the host cannot sandbox: each failed check says its fix.
    """
    from .image import LOCK_FILE, build

    # The image is what setup makes: only the checks before it decide whether it can.
    checks = [c for c in _host_checks() if c.name != "runtime image"]
    _print_checks(checks)
    failed = [c.name for c in checks if c.required and not c.ok]
    if failed:
        _fail(
            f"this host cannot sandbox ({', '.join(failed)} failed); fix what the FAIL lines "
            "say and run `execbox setup` again"
        )
    click.echo("building the runtime image (minutes the first time; an identical one is reused)")
    try:
        img = build(LOCK_FILE)
    except ExecboxError as exc:
        _fail(str(exc))
    click.echo(f"ok   {'runtime image':<14} {img.digest} at {img.root}")
    if not _smoke_runs():
        _fail("the runtime image is built but a sandboxed run failed; see `execbox doctor`")
    click.echo("execbox is set up: try `execbox run` on a Python file")


@main.group()
def image() -> None:
    """Build and inspect the runtime image user code runs in."""


@image.command("build")
@click.option(
    "--lock",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Lock file (default: the one shipped with execbox).",
)
def image_build(lock: Path | None) -> None:
    """Build the pinned runtime environment (reuses an identical build)."""
    from .image import LOCK_FILE, build

    try:
        img = build(lock or LOCK_FILE)
    except ExecboxError as exc:
        _fail(str(exc))
    click.echo(f"image {img.digest} at {img.root}")


def _current_image() -> Image:
    from .image import Image

    try:
        return Image.load()
    except ExecboxError as exc:
        _fail(str(exc))


@image.command("info")
def image_info() -> None:
    """Print the current image's manifest."""
    click.echo((_current_image().root / "manifest.json").read_text().rstrip())


@image.command("verify")
def image_verify() -> None:
    """Recompute the image digest and compare it with the recorded one."""
    from .image import verify

    img = _current_image()
    if verify(img):
        click.echo(f"ok {img.digest}")
    else:
        _fail(f"image at {img.root} no longer matches its digest {img.digest}; rebuild it")


@main.command()
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path))
def schema(output: Path | None) -> None:
    """Print (or write) the JSON schema of the execution contract."""
    if output:
        from .contract import write_schema

        write_schema(output)
    else:
        from .contract import schema as get_schema

        click.echo(json.dumps(get_schema(), indent=2, sort_keys=True))


assert isinstance(runs, LazyGroup)
runs.lazy.update({"asks": "execbox.agent.cli:asks_cmd", "trace": "execbox.agent.cli:trace_cmd"})

from .cluster.cli import cluster_group as _cluster_command  # noqa: E402

main.add_command(_cluster_command)


if __name__ == "__main__":
    main()
