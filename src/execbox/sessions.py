"""Stateful sessions: one long-lived sandboxed interpreter whose cells share variables, imports
and files, like a notebook.

A session has the same isolation as a run (namespaces, cgroup, seccomp, uid, read-only system,
its own workspace); its memory and pids limits hold for the whole session, its wall and CPU
limits for each cell. Every cell goes through the executor's pipeline: policy check, redaction,
a run record carrying the session id. A cell past its time is interrupted and the session goes
on; a session whose interpreter dies (out of memory, a forbidden call, unresponsive to an
interrupt) is over, and every later call raises `SessionClosed` saying why.

    with executor.session() as s:
        s.run("import pandas as pd; df = pd.DataFrame({'x': [1, 2, 3]})")
        s.run("df.x.sum()").outputs[-1].data   # '6'

A JavaScript session (`language="javascript"`) is one Node process with the same jail, limits
and protocol: its cells share the main context (top-level `let`/`const` persist, top-level
`await` works) and its last expression's value is the output (see `sandbox/inside/session.js`).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .contract import (
    MIB,
    Artifact,
    ErrorInfo,
    Limits,
    NetworkConnection,
    Output,
    RunRequest,
    RunResult,
    Status,
    StreamEvent,
)
from .errors import Overloaded, SandboxError, SessionClosed, UsageError
from .network.session import SessionNetwork
from .policy import CellContext, Profile, check
from .redact import checked_secrets
from .request import FileSource, make_request, new_run_id
from .results import result_of
from .routing import EXEC_TIME_ENV, EXEC_TIME_PREFIXES
from .sandbox.host.channel import SessionEnded
from .sandbox.host.errors import HostError
from .sandbox.host.pump import OutputCallback

if TYPE_CHECKING:
    from .backend import SandboxBackend, SessionBackend
    from .budget import Budget
    from .executor import Executor

log = logging.getLogger(__name__)

DEFAULT_IDLE_TIMEOUT_S = 600.0
SESSION_LANGUAGES = ("python", "javascript")
DEFAULT_MAX_LIFETIME_S = 3600.0

# The error type of a cell ended by `Session.kill`, by the status it ends with.
KILLED_TYPES = {Status.timeout: "SessionExpired", Status.network_limit: "NetworkLimitExceeded"}


@dataclass(frozen=True)
class SessionUsage:
    """What a session's processes use now, as its cgroup and workspace count it."""

    cpu_ns: int  # CPU time since the session started, all its processes
    memory_bytes: int  # memory charged now (page cache and tmpfs files included)
    memory_cache_bytes: int  # of which page cache and tmpfs files
    disk_bytes: int  # used in the workspace
    disk_total_bytes: int  # the workspace's size


class Session:
    """A sandboxed, stateful interpreter. Thread-safe: cells and file calls run one at a time."""

    def __init__(
        self,
        executor: Executor,
        channel: SessionBackend,
        session_id: str,
        *,
        profile: str,
        limits: Limits,
        env: dict[str, str],
        idle_timeout_s: float,
        max_lifetime_s: float,
        secrets: Iterable[str] = (),
        input_bytes: int = 0,
        environment: str | None = None,
        image_digest: str = "",
        network: str | list[str] = "none",
        language: str = "python",
    ) -> None:
        self.id = session_id
        self.language = language  # every cell's, for its whole life
        self.profile = profile
        self.network = network  # for its whole life: each cell's request carries it
        self.environment = environment  # its name, None for the default: it never changes
        self.image_digest = image_digest
        self.limits = limits
        self.env = env
        self.idle_timeout_s = idle_timeout_s
        self.max_lifetime_s = max_lifetime_s
        self.created_at = time.monotonic()
        self.last_used = self.created_at
        self.cells = 0
        self.room_bytes = limits.disk_mib * MIB + input_bytes  # the workspace's size
        self.end_reason: str | None = None
        self.killed_status = Status.sandbox_error  # what a cell ended by `kill` reports
        self.files = SessionFiles(self)
        self.policy_context = CellContext()  # what earlier cells bound, for the policy check
        # What the session's network served after its last cell (a process left running),
        # filled when it ends: no cell's result can hold it.
        self.network_log_after_cells: list[NetworkConnection] = []
        self._executor = executor
        self._channel = channel
        self._secrets = tuple(secrets)
        self._lock = threading.RLock()
        self._busy = False

    @property
    def closed(self) -> bool:
        return self.end_reason is not None

    def run(
        self,
        code: str,
        *,
        timeout_s: float | None = None,
        secrets: Iterable[str] = (),
        budget: Budget | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> RunResult:
        """Run one cell. `timeout_s` overrides the session's per-cell wall time (CPU time
        follows it unless the session's limits set `cpu_s`); `budget` is shared with other
        calls as for `Executor.run`. Never raises for the code; raises SessionClosed when the
        session has ended."""
        if timeout_s is not None and not 0 < timeout_s <= 3600:
            raise UsageError(f"timeout_s must be in (0, 3600], not {timeout_s!r}")
        secrets = checked_secrets(secrets)
        with self._use():
            self.cells += 1
            result = self._executor.run_cell(
                self,
                code,
                timeout_s=timeout_s,
                secrets=(*self._secrets, *secrets),
                budget=budget,
                on_stdout=on_stdout,
                on_stderr=on_stderr,
            )
            return result

    def execute(
        self,
        request: RunRequest,
        base: RunResult,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        backstop_s: float,
    ) -> RunResult:
        """The sandbox stage of one cell's pipeline (the executor calls it, under `run`'s
        lock): the cell in this session's interpreter. An interpreter gone ends the session."""
        limits = request.limits
        base = base.model_copy(update={"session_id": self.id})
        try:
            raw = self._channel.cell(
                request.code,
                limits.timeout_s,
                limits.effective_cpu_s,
                limits.output_bytes,
                limits.timeout_s + backstop_s,
                on_stdout,
                on_stderr,
            )
        except SessionEnded as exc:
            self._mark_ended(f"has ended: {exc}")
            raise SessionClosed(f"session {self.id} has ended: {exc}") from exc
        except HostError as exc:
            if self.end_reason is not None:  # ended on purpose during the cell: say why
                self._mark_ended(self.end_reason)
                kind = KILLED_TYPES.get(self.killed_status, "SandboxError")
                return base.model_copy(
                    update={
                        "status": self.killed_status,
                        "error": ErrorInfo(
                            type=kind,
                            message=f"the session {self.end_reason} during this cell",
                        ),
                    }
                )
            log.error("cell of session %s: sandbox error: %s", self.id, exc)
            self._mark_ended(f"has ended with a sandbox error: {exc}")
            return base.model_copy(
                update={"error": ErrorInfo(type="SandboxError", message=str(exc))}
            )
        result = result_of(
            base, raw, functools.partial(self._executor.allowed_environments, self.profile)
        )
        outputs = [Output(**item) for item in raw.meta.get("outputs", [])]
        result = result.model_copy(update={"outputs": outputs})
        if raw.meta.get("ended"):
            reason = result.error.message if result.error else "the interpreter exited"
            self._mark_ended(f"has ended ({result.status.value}): {reason}")
        return result

    async def astream(
        self, code: str, *, timeout_s: float | None = None
    ) -> AsyncIterator[StreamEvent]:
        """Run one cell and yield its output as it happens, then the result."""
        from .streaming import stream_events

        async for event in stream_events(
            lambda out, err: self.run(code, timeout_s=timeout_s, on_stdout=out, on_stderr=err)
        ):
            yield event

    def close(self) -> None:
        """End the session: its processes, cgroup and workspace are gone when this returns. A
        cell running in another thread is cut short (its result says so)."""
        if self._busy:
            self.kill("was closed by the caller", Status.error)
        self.end("was closed by the caller")

    def end(self, reason: str) -> None:
        """End the session for `reason` (idle, lifetime, the executor closing)."""
        with self._lock:
            if self.end_reason is None:
                self.end_reason = reason
            self._channel.close()
            self._keep_last_log()
        self._executor.forget_session(self.id)

    def kill(self, reason: str, status: Status) -> None:
        """End the session now, even mid-cell; a running cell returns `status` with `reason`.
        Safe from any thread (it only signals the session's supervisor)."""
        if self.end_reason is None:
            self.end_reason = reason
            self.killed_status = status
        self._channel.kill()

    def usage(self) -> SessionUsage:
        """What the session uses now (a call between cells, as a file call is)."""
        answer, _ = self.files._call("usage")
        return SessionUsage(
            **{k: int(answer.get(k) or 0) for k in SessionUsage.__dataclass_fields__}
        )

    def interrupt(self, reason: str) -> bool:
        """Interrupt the running cell (KeyboardInterrupt in it); the session goes on. False
        when no cell runs (a file call is no cell) or the backend cannot interrupt one. Safe
        from any thread."""
        interrupt = getattr(self._channel, "interrupt", None)
        if not self._busy or interrupt is None or self.end_reason is not None:
            return False
        return bool(interrupt(reason))

    def _mark_ended(self, reason: str) -> None:
        """The interpreter is gone (seen by a cell or a file call, under the session's lock)."""
        if self.end_reason is None:
            self.end_reason = reason
        self._channel.close()
        self._keep_last_log()
        self._executor.forget_session(self.id)

    def _keep_last_log(self) -> None:
        """Keep (and log) what the session's network served after its last cell."""
        channel = self._channel
        if not isinstance(channel, SessionNetwork) or not channel.after_cells:
            return
        if self.network_log_after_cells:  # ended already
            return
        entries = [NetworkConnection(**e) for e in channel.after_cells]
        self.network_log_after_cells = self._executor.redacted_network_log(entries, self._secrets)
        log.info(
            "session %s: %d network connection(s) after its last cell: %s",
            self.id,
            len(entries),
            ", ".join(
                f"{e.method} {e.host}:{e.port} {e.verdict}" for e in self.network_log_after_cells
            ),
        )

    def _use(self) -> _InUse:
        return _InUse(self)

    def expired(self, now: float) -> str | None:
        """Why the session should be closed now, or None."""
        if self._busy:
            if now - self.created_at >= self.max_lifetime_s:
                return (
                    f"reached its maximum lifetime of {self.max_lifetime_s:g} s "
                    "(max_lifetime_s) and was ended"
                )
            return None
        if now - self.last_used >= self.idle_timeout_s:
            return f"expired after {self.idle_timeout_s:g} s idle (idle_timeout_s)"
        if now - self.created_at >= self.max_lifetime_s:
            return (
                f"reached its maximum lifetime of {self.max_lifetime_s:g} s (max_lifetime_s)"
                " and was ended"
            )
        return None

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"ended: {self.end_reason}" if self.closed else "open"
        return f"<Session {self.id} {state}, {self.cells} cells>"


class _InUse:
    """Holds the session's lock for one call and checks that it is still open."""

    def __init__(self, session: Session) -> None:
        self.s = session

    def __enter__(self) -> SessionBackend:
        s = self.s
        s._lock.acquire()
        if s.end_reason is not None:
            s._lock.release()
            raise SessionClosed(f"session {s.id} {s.end_reason}")
        s._busy = True
        return s._channel

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        s = self.s
        s._busy = False
        s.last_used = time.monotonic()
        s._lock.release()


# A session workspace's regular files and its directories, each in path order.
WorkspaceTree = tuple[list[Artifact], list[str]]


class SessionFiles:
    """Files in the session's /workspace, with the same link safety as artifacts: symlinks are
    never followed, FIFOs and devices never opened."""

    def __init__(self, session: Session) -> None:
        self._s = session

    def _call(
        self, op: str, path: str = "", data: bytes | None = None
    ) -> tuple[dict[str, Any], bytes]:
        if op not in ("list", "usage"):
            _check_path(path)
        with self._s._use() as channel:
            try:
                answer, blob = channel.file_op(op, path, data)
            except SessionEnded as exc:
                self._s._mark_ended(f"has ended: {exc}")
                raise SessionClosed(f"session {self._s.id} has ended: {exc}") from exc
            except HostError as exc:
                self._s._mark_ended(f"has ended with a sandbox error: {exc}")
                raise SessionClosed(
                    f"session {self._s.id} has ended with a sandbox error: {exc}"
                ) from exc
        if not answer.get("ok"):
            raise UsageError(str(answer.get("error")))
        return answer, blob

    def write(self, path: str, data: bytes | str) -> Artifact:
        """Create or replace `path` (parents created) with `data`; returns its metadata."""
        payload = data.encode() if isinstance(data, str) else bytes(data)
        room = self._s.room_bytes
        if len(payload) > room:
            raise UsageError(
                f"{path!r} is {len(payload)} bytes, more than the session's "
                f"workspace holds ({room} bytes); raise limits.disk_mib"
            )
        self._call("write", path, payload)
        import hashlib

        from .sandbox.inside.artifacts import guess_mime

        return Artifact(
            path=path,
            size=len(payload),
            sha256=hashlib.sha256(payload).hexdigest(),
            mime_type=guess_mime(path, payload[:4096]),
        )

    def read(self, path: str) -> bytes:
        """The bytes of a regular file (UsageError for a link, FIFO, directory or no file)."""
        return self._call("read", path)[1]

    def list(self) -> list[Artifact]:
        """Every regular file in the workspace, inputs included, in path order."""
        answer, _ = self._call("list")
        return [Artifact(**entry) for entry in answer.get("entries", [])]

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file, a link (never its target) or an empty directory; with `recursive`,
        a directory and all it holds (links in it removed, never followed)."""
        self._call("rmtree" if recursive else "remove", path)

    def make_dir(self, path: str) -> bool:
        """Make the directory `path` and its parents: True when made, False when it was a
        directory already (UsageError when a file or link is there, or on the way)."""
        answer, _ = self._call("mkdir", path)
        return bool(answer.get("created"))

    def rename(self, source: str, target: str) -> None:
        """Move a file, link (never its target) or directory to `target`, replacing a file
        or an empty directory there; `target`'s parents are made."""
        _check_path(target)
        self._call("rename", source, target.encode())

    def tree(self) -> WorkspaceTree:
        """`list()`'s files, and every directory in the workspace (empty ones too), each in
        path order."""
        answer, _ = self._call("list")
        files = [Artifact(**entry) for entry in answer.get("entries", [])]
        return files, [str(d) for d in answer.get("dirs", [])]


class SessionTable:
    """The executor's open sessions: each opened within `max_sessions`, policy-checked,
    then found by id until it ends. Thread-safe."""

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self._lock = threading.Lock()
        self._sessions: dict[str, Session | None] = {}  # None: the place is held, opening

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def open(
        self,
        executor: Executor,
        backend: SandboxBackend,
        profiles: Mapping[str, Profile],
        check_open: Callable[[], None],
        *,
        environment: str | None,
        profile: str,
        limits: Limits | Mapping[str, Any] | None,
        env: Mapping[str, str] | None,
        files: Mapping[str, FileSource] | None,
        idle_timeout_s: float,
        max_lifetime_s: float,
        secrets: Iterable[str],
        tenant: str | None,
        network: str | Sequence[str] = "none",
        language: str = "python",
    ) -> Session:
        """A new session of `executor` (see `Executor.session`)."""
        if language not in SESSION_LANGUAGES:
            raise UsageError(
                f"sessions run {' or '.join(SESSION_LANGUAGES)}, not {language!r}; "
                "run other languages as runs"
            )
        if language == "javascript":
            late = sorted(
                k for k in env or {} if k in EXEC_TIME_ENV or k.startswith(EXEC_TIME_PREFIXES)
            )
            if late:  # a staged Node has started: what Node reads only as it starts is too late
                raise UsageError(
                    f"a JavaScript session cannot set {late[0]}, which Node reads only as it "
                    "starts; leave it out (a run may set it)"
                )
        for name, value in (("idle_timeout_s", idle_timeout_s), ("max_lifetime_s", max_lifetime_s)):
            if not 0 < value <= 7 * 24 * 3600:
                raise UsageError(f"{name} must be in (0, 604800] seconds, not {value!r}")
        secrets = checked_secrets(secrets)
        template = make_request(
            "",
            language=language,
            limits=limits,
            env=env,
            files=files,
            profile=profile,
            environment=environment,
            network=network,
        )
        default = backend.default_environment
        verdict = check(template, profiles, default_environment=default)
        if verdict.decision != "allow":
            raise UsageError(
                f"the session was refused by policy profile {profile!r} (rule "
                f"{verdict.rule}): {verdict.message}"
            )
        limits_ = verdict.limits
        check_open()
        digest = backend.digest if environment is None else backend.environment(environment)
        where = None if digest == backend.digest else digest
        backend.start(tenant, where)
        with self._lock:
            if len(self._sessions) >= self.max_sessions:
                raise Overloaded(
                    f"{len(self._sessions)} sessions are open (max_sessions="
                    f"{self.max_sessions}); close one or raise max_sessions"
                )
            session_id = new_run_id()
            self._sessions[session_id] = None

        started: list[Session] = []

        def ended_by(message: str) -> None:  # the proxy's thread, past a network limit
            if started:
                started[0].kill(f"passed a network limit: {message}", Status.network_limit)

        try:
            channel = backend.open_session(
                session_id,
                limits_,
                template.env,
                [(f.name, f.data) for f in template.files],
                tenant,
                where,
                network=None if template.network == "none" else template.network,
                on_network_limit=lambda message: ended_by(message),
                language=language,
            )
        except HostError as exc:
            self.forget(session_id)
            raise SandboxError(f"the session could not start: {exc}") from exc
        except BaseException:
            self.forget(session_id)
            raise
        session = Session(
            executor,
            channel,
            session_id,
            profile=profile,
            limits=limits_,
            env=dict(template.env),
            idle_timeout_s=idle_timeout_s,
            max_lifetime_s=max_lifetime_s,
            secrets=secrets,
            input_bytes=sum(len(f.data) for f in template.files),
            environment=environment,
            image_digest=digest,
            network=template.network,
            language=language,
        )
        started.append(session)
        with self._lock:
            self._sessions[session_id] = session
        log.info(
            "session %s started (%s, %s, %s)",
            session_id,
            language,
            profile,
            environment or "default",
        )
        return session

    def get(self, session_id: str) -> Session:
        """An open session by id; UsageError when there is none (never started, or ended)."""
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            raise UsageError(f"no open session {session_id!r}")
        return session

    def live(self) -> list[Session]:
        """The open sessions (the reaper's view)."""
        with self._lock:
            return [s for s in self._sessions.values() if s is not None]

    def forget(self, session_id: str) -> None:
        """Drop an ended session from the open ones."""
        with self._lock:
            self._sessions.pop(session_id, None)


def _check_path(path: str) -> None:
    from .contract import InputFile

    try:
        InputFile(name=path, data=b"")
    except ValueError as exc:
        raise UsageError(
            f"bad session file path {path!r}: it must be a clean relative path inside /workspace"
        ) from exc


class Reaper:
    """Closes sessions that have been idle or alive too long."""

    def __init__(self, executor: Executor, interval_s: float = 0.5) -> None:
        self._executor = executor
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name="execbox-session-reaper", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            now = time.monotonic()
            for session in self._executor.live_sessions():
                try:
                    reason = session.expired(now)
                    if not reason:
                        continue
                    if session._busy:  # over its lifetime mid-cell: kill it now
                        session.kill(reason, Status.timeout)
                    else:
                        session.end(reason)
                except Exception:  # noqa: BLE001 - one session's trouble must not stop expiry
                    log.exception("expiring session %s failed", session.id)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
