"""A fake sandbox for tests of code that uses execbox, as httpx ships `MockTransport`.

    from execbox.testing import FakeResult, FakeSandbox

    def handler(run):                       # run: FakeRun (run.spec is the RunSpec)
        return FakeResult(stdout="42\\n") if "6 * 7" in run.code else FakeResult(exit_code=1)

    with execbox.Executor(backend=FakeSandbox(handler)) as ex:
        ex.run("print(6 * 7)").stdout       # '42\\n'

Everything above the sandbox is real: policy, budgets, the cache, redaction, records, sessions'
bookkeeping, admission. Nothing runs the code, so it needs neither root nor the runtime image,
and it proves nothing about isolation: that is what the real sandbox's own tests are for.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .backend import RunSpec, SessionBackend
from .contract import ErrorInfo, Limits, Output, Status
from .errors import UsageError
from .sandbox.host.channel import SessionEnded
from .sandbox.host.errors import HostError
from .sandbox.host.pump import OutputCallback, RawRun
from .sandbox.inside.artifacts import guess_mime

__all__ = ["FakeResult", "FakeRun", "FakeSandbox", "Handler", "RunSpec"]


@dataclass(frozen=True)
class FakeResult:
    """What a handler says the code did. `status` defaults to ok for exit code 0, else error;
    output past the run's `output_bytes` is cut and the result is `output_limit`, as in the
    real sandbox. `artifacts` (path: bytes) are the files the code left in /workspace; a
    session cell's go into the session's workspace. `outputs` are a cell's rich outputs;
    `ended` says a cell ended its session's interpreter. `sandbox_error` makes the sandbox
    itself fail (the run's status is sandbox_error, a session ends)."""

    stdout: str | bytes = ""
    stderr: str | bytes = ""
    exit_code: int | None = 0
    status: Status | str | None = None
    error: ErrorInfo | None = None
    signal: str | None = None
    artifacts: Mapping[str, bytes] = field(default_factory=dict)
    outputs: Sequence[Output] = ()
    wall_ms: float = 1.0
    ended: bool = False
    sandbox_error: str | None = None


class FakeRun:
    """What a handler is asked: `spec` (for a cell: kind "cell", run_id the session's id,
    files empty). Output written with `write` streams to the caller at once, as a program's
    prints do, and comes before the FakeResult's own in the result."""

    def __init__(self, spec: RunSpec, killed: threading.Event) -> None:
        self.spec = spec
        self.code = spec.code
        self.stdout = bytearray()
        self.stderr = bytearray()
        self._killed = killed

    @property
    def cancelled(self) -> bool:
        """Whether the caller cancelled the run (a long handler may stop early)."""
        return self._killed.is_set()

    def write(self, data: str | bytes, *, stderr: bool = False) -> None:
        chunk = _bytes(data)
        buffer, callback = (
            (self.stderr, self.spec.on_stderr) if stderr else (self.stdout, self.spec.on_stdout)
        )
        room = self.spec.limits.output_bytes - len(buffer)
        if callback is not None and room > 0 and chunk:
            callback(chunk[:room])
        buffer += chunk


# A handler returns what the run did; a plain string is its stdout.
Handler = Callable[[FakeRun], FakeResult | str]


class FakeSandbox:
    """A `SandboxBackend` that answers every run and cell with `handler` (default: nothing
    printed, exit code 0). `runs` lists what it was asked, in order, cells included;
    `sessions` the sessions it opened, by id, with their in-memory workspaces.
    `environments`: the digest of each environment by name (the default's is `digest`)."""

    def __init__(
        self,
        handler: Handler | None = None,
        *,
        digest: str = "fake",
        environments: Mapping[str, str] | None = None,
        default_environment: str | None = None,
    ) -> None:
        self.handler = handler or (lambda run: FakeResult())
        self._digest = digest
        self.environments = dict(environments or {})
        self.default_environment = default_environment
        self._lock = threading.Lock()
        self.runs: list[RunSpec] = []
        self.sessions: dict[str, FakeSession] = {}
        self.closed = False

    @property
    def digest(self) -> str:
        return self._digest

    def environment(self, name: str) -> str:
        if name == self.default_environment:
            return self._digest
        if name not in self.environments:
            raise UsageError(f"no environment named {name!r}; build it with `execbox env build`")
        return self.environments[name]

    def info(self) -> dict[str, Any]:
        return {}

    def start(self, tenant: str | None, environment: str | None = None) -> None:
        if self.closed:
            raise UsageError("the fake sandbox is closed")

    def run(self, spec: RunSpec) -> RawRun:
        return self.answer(spec, {})

    def answer(
        self,
        spec: RunSpec,
        workspace: dict[str, bytes],
        killed: threading.Event | None = None,
    ) -> RawRun:
        """The handler's answer to `spec` as the sandbox reports it (callbacks fed, caps
        applied, a cancel or `killed` honoured, artifacts spooled when asked)."""
        with self._lock:
            self.runs.append(spec)
        killed = killed or threading.Event()
        if spec.cancel is not None:
            spec.cancel.attach(killed.set)
        run = FakeRun(spec, killed)
        try:
            got = self.handler(run)
        finally:
            if spec.cancel is not None:
                spec.cancel.detach()
        fake = FakeResult(stdout=got) if isinstance(got, str) else got
        if fake.sandbox_error is not None:
            raise HostError(fake.sandbox_error)
        if killed.is_set():
            fake = replace(
                fake,
                status=Status.error,
                exit_code=None,
                error=ErrorInfo(type="Cancelled", message="the run was cancelled by its caller"),
            )
        cap = spec.limits.output_bytes
        run.write(fake.stdout)
        run.write(fake.stderr, stderr=True)
        stdout, stderr = bytes(run.stdout), bytes(run.stderr)
        workspace.update(fake.artifacts)
        arts = [] if spec.kind == "cell" else list(fake.artifacts.items())
        data: list[bytes | None] = [blob for _, blob in arts]
        if spec.spool_dir is not None:
            for index, (_, blob) in enumerate(arts):
                fd = os.open(
                    os.path.join(spec.spool_dir, str(index)),
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                    0o600,
                )
                with os.fdopen(fd, "wb") as fh:
                    fh.write(blob)
            data = [None] * len(arts)
        status = fake.status or (Status.ok if fake.exit_code == 0 else Status.error)
        meta: dict[str, Any] = {
            "status": Status(status).value,
            "exit_code": fake.exit_code,
            "signal": fake.signal,
            "error": fake.error.model_dump() if fake.error else None,
            "artifacts": [_entry(path, blob) for path, blob in arts],
            "metrics": {"wall_ms": fake.wall_ms, "cpu_ms": fake.wall_ms, "memory_peak_bytes": 0},
            "outputs": [o.model_dump() for o in fake.outputs],
            "ended": fake.ended,
        }
        return RawRun(meta, data, stdout[:cap], stderr[:cap], len(stdout) > cap, len(stderr) > cap)

    def open_session(
        self,
        session_id: str,
        limits: Limits,
        env: Mapping[str, str],
        files: Sequence[tuple[str, bytes]],
        tenant: str | None,
        environment: str | None = None,
        network: Sequence[str] | None = None,
        on_network_limit: Callable[[str], None] | None = None,
        language: str = "python",
    ) -> SessionBackend:
        session = FakeSession(self, session_id, limits, env, dict(files), tenant)
        with self._lock:
            self.sessions[session_id] = session
        return session

    def close(self) -> None:
        self.closed = True
        for session in list(self.sessions.values()):
            session.close()


class FakeSession:
    """A fake session's interpreter: cells go to the handler, files to `workspace`."""

    def __init__(
        self,
        sandbox: FakeSandbox,
        session_id: str,
        limits: Limits,
        env: Mapping[str, str],
        workspace: dict[str, bytes],
        tenant: str | None,
    ) -> None:
        self.id = session_id
        self.limits = limits
        self.env = dict(env)
        self.workspace = workspace
        self.dirs: set[str] = set()  # directories made by `mkdir` (others: files' parents)
        self.tenant = tenant
        self.killed = False
        self.closed = False
        self._sandbox = sandbox
        self._cell_killed = threading.Event()  # a kill ends the cell in flight, as in the sandbox

    def cell(
        self,
        code: str,
        timeout_s: float,
        cpu_s: float,
        output_bytes: int,
        backstop_s: float,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> RawRun:
        self._check()
        limits = self.limits.model_copy(
            update={"timeout_s": timeout_s, "output_bytes": output_bytes}
        )
        spec = RunSpec(
            run_id=self.id,
            code=code,
            limits=limits,
            kind="cell",
            env=self.env,
            tenant=self.tenant,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
        )
        raw = self._sandbox.answer(spec, self.workspace, self._cell_killed)
        if self.killed:  # killed while the cell ran
            raise HostError("the session was killed")
        if raw.meta["ended"]:
            self.closed = True
        return raw

    def file_op(
        self, op: str, path: str = "", data: bytes | None = None
    ) -> tuple[dict[str, Any], bytes]:
        """The session files API over `workspace` (files) and `dirs`, as the supervisor
        answers it: directories hold what is under them, a file is never a directory."""
        self._check()
        if op == "write":
            if self._is_dir(path) or any(p in self.workspace for p in _parents(path)):
                return _failed(f"{path!r} is a directory or under a file")
            self.workspace[path] = data or b""
        elif op == "list":
            return {
                "ok": True,
                "entries": [_entry(p, self.workspace[p]) for p in sorted(self.workspace)],
                "dirs": sorted(self._all_dirs()),
            }, b""
        elif op == "usage":
            return {
                "ok": True,
                "disk_bytes": sum(map(len, self.workspace.values())),
                "disk_total_bytes": self.limits.disk_mib << 20,
            }, b""
        elif op == "mkdir":
            if path in self.workspace or any(p in self.workspace for p in _parents(path)):
                return _failed(f"a file is at {path!r} or on its way")
            made = not self._is_dir(path)
            self.dirs.update([path, *_parents(path)])
            return {"ok": True, "created": made}, b""
        elif op == "rename":
            return self._rename(path, (data or b"").decode())
        elif self._is_dir(path):
            inside = [p for p in self.workspace if p.startswith(path + "/")]
            if op == "remove" and (inside or any(d.startswith(path + "/") for d in self.dirs)):
                return _failed(f"the directory {path!r} is not empty")
            if op not in ("remove", "rmtree"):
                return _failed(f"{path!r} is a directory")
            for name in inside:
                del self.workspace[name]
            self.dirs = {d for d in self.dirs if d != path and not d.startswith(path + "/")}
        elif path not in self.workspace:
            return _failed(f"no file {path!r} in the workspace")
        elif op == "read":
            return {"ok": True}, self.workspace[path]
        elif op in ("remove", "rmtree"):
            del self.workspace[path]
        else:
            return _failed(f"unknown file operation {op!r}")
        return {"ok": True}, b""

    def _all_dirs(self) -> set[str]:
        return self.dirs.union(*(_parents(p) for p in self.workspace))

    def _is_dir(self, path: str) -> bool:
        return path in self._all_dirs()

    def _rename(self, source: str, target: str) -> tuple[dict[str, Any], bytes]:
        if target == source:
            return {"ok": True}, b""
        if target.startswith(source + "/"):
            return _failed(f"cannot move {source!r} into itself ({target!r})")
        if source in self.workspace:
            if self._is_dir(target):
                return _failed(f"{target!r} is a directory")
            self.workspace[target] = self.workspace.pop(source)
        elif self._is_dir(source):
            if target in self.workspace or any(
                p.startswith(target + "/") for p in (*self.workspace, *self.dirs)
            ):
                return _failed(f"{target!r} is a file or a directory that is not empty")
            cut = len(source)
            for name in [p for p in self.workspace if p.startswith(source + "/")]:
                self.workspace[target + name[cut:]] = self.workspace.pop(name)
            self.dirs = {
                target + d[cut:] if d == source or d.startswith(source + "/") else d
                for d in self.dirs
            }
            self.dirs.add(target)
        else:
            return _failed(f"no file {source!r} in the workspace")
        self.dirs.update(_parents(target))
        return {"ok": True}, b""

    def kill(self) -> None:
        self.killed = True
        self._cell_killed.set()

    def close(self) -> None:
        self.closed = True

    def _check(self) -> None:
        if self.killed or self.closed:
            raise SessionEnded({"status": "error", "error": {"message": "the session has ended"}})


def _bytes(text: str | bytes) -> bytes:
    return text.encode() if isinstance(text, str) else text


def _parents(path: str) -> list[str]:
    """`a/b/c`'s directories: `a`, `a/b`."""
    parts = path.split("/")
    return ["/".join(parts[:n]) for n in range(1, len(parts))]


def _failed(message: str) -> tuple[dict[str, Any], bytes]:
    return {"ok": False, "error": message}, b""


def _entry(path: str, blob: bytes) -> dict[str, Any]:
    return {
        "path": path,
        "size": len(blob),
        "sha256": hashlib.sha256(blob).hexdigest(),
        "mime_type": guess_mime(path, blob[:4096]),
    }
