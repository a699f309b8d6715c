"""envd's process service in Connect's JSON encoding: `Start` (a server stream) runs a command
in the sandbox's jail, `List` shows those running or waiting, `SendSignal` kills one.

A command is a cell of the sandbox's Python session that runs the program in a process group
of its own, with the cell's own stdout and stderr (so it streams, is redacted and recorded like
any cell, and is policy-checked under the sandbox's profile); its exit code is the cell's value.
The session runs one cell at a time, so a second command waits for the first. Killing a command
interrupts its cell, which kills the command's whole process group: the session goes on."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import signal
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from ...contract import RunResult
from ..state import ServerState
from .access import E2BError, Sandbox, Sandboxes, sandbox_call
from .envd import workspace_path
from .interpreter import _Cell, admit_cell
from .rpc import END_STREAM, envelope, rpc_error, unwrap

FIRST_PID = 1000
INTERRUPT_EVERY_S = 0.1
KILLED = "killed"  # the interrupt's reason, as the supervisor hears it
SIGNALS = {"SIGNAL_SIGKILL": signal.SIGKILL, "SIGNAL_SIGTERM": signal.SIGTERM}

# The cell that runs a command. The function leaves the session's namespace as it is called;
# on an interrupt (a kill, the cell's time) it kills the command's whole process group, and
# every process that carries the command's mark in its environment (one that left the group:
# setsid, a daemon), so nothing the command started keeps running; its value is then -9
# (SIGKILL's, as Popen says).
COMMAND_CELL = """\
def _execbox_command(argv, cwd, envs):
    import os, subprocess, signal
    mark = os.urandom(8).hex()
    marked = ("EXECBOX_COMMAND=" + mark).encode()

    def kill_marked():
        for _ in range(100):  # until none is left: a marked process may fork as it is killed
            killed = 0
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open("/proc/" + pid + "/environ", "rb") as f:
                        if marked in f.read().split(b"\\0"):
                            os.kill(int(pid), 9)
                            killed += 1
                except OSError:
                    pass
            if not killed:
                return

    noted = []  # an interrupt while the process starts: acted on once its pid is known
    armed = signal.signal(signal.SIGINT, lambda *_: noted.append(1))
    process = subprocess.Popen(
        argv, cwd=cwd, env={**os.environ, **envs, "EXECBOX_COMMAND": mark},
        stdin=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        signal.signal(signal.SIGINT, armed)
        if noted:
            raise KeyboardInterrupt
        return process.wait()
    except BaseException:
        while True:  # an interrupt comes again until the cell stops: it starts this over
            try:
                try:
                    os.killpg(process.pid, 9)
                except OSError:
                    pass
                kill_marked()
                code = process.wait()
                break
            except KeyboardInterrupt:
                continue
        if code == -9:
            return code
        raise
globals().pop("_execbox_command")(%r, %r, %r)"""


@dataclass
class Command:
    """A command of a sandbox, from its start until its end event is sent."""

    pid: int
    config: dict[str, Any]
    session: Any
    killed: bool = False
    started: bool = False  # its cell has begun (a kill before that skips it)
    done: bool = False  # its cell has returned: no interrupt may reach a later cell
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: asyncio.Task[None] | None = None

    async def stop(self) -> None:
        """Interrupt its cell, once the session has it: between the cell's turn and the
        session's taking it, the session has no cell to interrupt yet. Tried under the lock
        that `done` is set under, so no interrupt follows the cell's end."""
        while True:
            with self.lock:
                if self.done or (self.started and self.session.interrupt(KILLED)):
                    return
            await asyncio.sleep(INTERRUPT_EVERY_S)


class Commands:
    """Each sandbox's commands, by E2B pid (unique per server: a pid never names another
    sandbox's command)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pids = itertools.count(FIRST_PID)
        self._by_sandbox: dict[str, dict[int, Command]] = {}

    def add(self, sandbox: Sandbox, config: dict[str, Any], session: Any) -> Command:
        with self._lock:
            command = Command(next(self._pids), config, session)
            self._by_sandbox.setdefault(sandbox.id, {})[command.pid] = command
            return command

    def drop(self, sandbox: Sandbox, command: Command) -> None:
        with self._lock:
            running = self._by_sandbox.get(sandbox.id, {})
            running.pop(command.pid, None)
            if not running:
                self._by_sandbox.pop(sandbox.id, None)

    def of(self, sandbox: Sandbox) -> list[Command]:
        with self._lock:
            return list(self._by_sandbox.get(sandbox.id, {}).values())

    def get(self, sandbox: Sandbox, pid: Any) -> Command | None:
        with self._lock:
            return self._by_sandbox.get(sandbox.id, {}).get(pid) if isinstance(pid, int) else None


def command_config(req: dict[str, Any]) -> dict[str, Any]:
    """The command a Start request asks for (cmd, args, envs, cwd), checked."""
    process = req.get("process") or {}
    if not isinstance(process, dict):
        raise E2BError(400, "process is an object")
    cmd, args = process.get("cmd", ""), process.get("args") or []
    if (
        not isinstance(cmd, str)
        or not cmd
        or not isinstance(args, list)
        or not all(isinstance(a, str) for a in args)
    ):
        raise E2BError(400, "process.cmd is required; process.args are strings")
    if req.get("pty"):
        raise E2BError(501, "execbox does not support PTYs: run commands without one")
    envs = process.get("envs") or {}
    if not isinstance(envs, dict) or not all(isinstance(v, str) for v in envs.values()):
        raise E2BError(400, "process.envs maps names to strings")
    cwd = process.get("cwd") or None
    if cwd is not None and not isinstance(cwd, str):
        raise E2BError(400, "process.cwd is a string")
    if cwd is not None:
        rel = workspace_path(cwd)
        cwd = "/workspace/" + rel if rel else "/workspace"
    return {"cmd": cmd, "args": list(args), "envs": dict(envs), "cwd": cwd}


def command_code(config: dict[str, Any]) -> str:
    return COMMAND_CELL % ([config["cmd"], *config["args"]], config["cwd"], config["envs"])


def router(state: ServerState, sandboxes: Sandboxes) -> APIRouter:
    api = APIRouter()
    commands = Commands()

    @api.post("/process.Process/Start")
    async def start(request: Request) -> StreamingResponse:
        sandbox = await sandbox_call(state, sandboxes, request)
        config = command_config(unwrap(await request.body()))
        session = state.sessions.get(sandbox.tenant, sandbox.id)
        timeout_s = _timeout(state, sandbox, request.headers.get("connect-timeout-ms"))
        release = admit_cell(state, sandbox.tenant, session)
        command = commands.add(sandbox, config, session)

        def begin() -> None:
            with command.lock:
                skip = command.killed or command.done
                command.started = not skip
            if skip:
                finish()
                raise _KilledBeforeStart

        def finish() -> None:  # its cell returned, or never will
            with command.lock:
                command.done = True
            commands.drop(sandbox, command)

        def end() -> None:
            # The stream is over: a command still waiting for its turn will not run (no one
            # would see it); one running goes on to its end.
            with command.lock:
                waiting = not command.started
            if waiting:
                finish()
            release()

        try:
            cell = _Cell(
                state,
                sandbox.tenant,
                session,
                sandbox.id,
                command_code(config),
                "python",
                timeout_s,
                hooks=(begin, finish),
            )
        except BaseException:
            end()
            raise
        return StreamingResponse(_events(cell, command, end), media_type="application/connect+json")

    @api.post("/process.Process/List")
    async def listing(request: Request) -> Response:
        sandbox = await sandbox_call(state, sandboxes, request)
        found = [
            {"pid": c.pid, "config": {k: v for k, v in c.config.items() if v is not None}}
            for c in commands.of(sandbox)
            if not c.killed
        ]
        return _json({"processes": found})

    @api.post("/process.Process/SendSignal")
    async def send_signal(request: Request) -> Response:
        sandbox = await sandbox_call(state, sandboxes, request)
        try:
            req = _message(await request.body())
        except E2BError as exc:
            return rpc_error("invalid_argument", exc.message)
        selector = req.get("process") or {}
        if req.get("signal") not in SIGNALS:
            return rpc_error("unimplemented", f"invalid signal: {req.get('signal')!r}")
        pid = selector.get("pid") if isinstance(selector, dict) else None
        command = commands.get(sandbox, pid)
        if command is None or command.killed:
            return rpc_error("not_found", f"process with pid {pid!r} not found")
        with command.lock:
            command.killed = True
        command.stopping = asyncio.create_task(command.stop())
        return _json({})

    @api.post("/process.Process/{method}")
    async def other(method: str, request: Request) -> Response:
        await sandbox_call(state, sandboxes, request)
        return rpc_error(
            "unimplemented",
            f"execbox does not support process.Process/{method}: a command runs as a cell "
            "of the sandbox's session with no stdin, and cannot be reconnected to",
        )

    return api


class _KilledBeforeStart(Exception):
    """A command killed while it waited for its turn: its cell never runs."""


def _message(body: bytes) -> dict[str, Any]:
    """A unary call's JSON message (the SDKs send it bare, not in a stream envelope)."""
    try:
        message = json.loads(body or b"{}")
    except ValueError:
        raise E2BError(400, "a request is JSON") from None
    if not isinstance(message, dict):
        raise E2BError(400, "a request is a JSON object")
    return message


def _json(answer: dict[str, Any]) -> Response:
    return Response(json.dumps(answer), media_type="application/json")


async def _events(cell: _Cell, command: Command, end: Callable[[], None]) -> AsyncIterator[bytes]:
    """Start, output chunks, end: E2B's process events as Connect stream messages."""
    try:
        yield envelope({"event": {"start": {"pid": command.pid}}})
        async for name, item in cell.items():
            if name in ("stdout", "stderr"):
                yield _data(name, item)
            elif name == "result":
                yield envelope({"event": {"end": _end(item)}})
                yield envelope({}, END_STREAM)
            elif isinstance(item, _KilledBeforeStart):
                yield envelope({"event": {"end": _signalled(signal.SIGKILL)}})
                yield envelope({}, END_STREAM)
            else:
                yield envelope({"error": {"code": "unavailable", "message": str(item)}}, END_STREAM)
    finally:
        end()
        await asyncio.sleep(0)


def _timeout(state: ServerState, sandbox: Sandbox, header: str | None) -> float | None:
    """The command's wall time: the SDK's `timeout` (Connect-Timeout-Ms), within what the
    sandbox's profile allows a cell; without one, the session's per-cell time."""
    if not header or not header.isdigit() or int(header) <= 0:
        return None
    most = float(state.executor.profiles[sandbox.profile].max_limits.timeout_s)
    return min(int(header) / 1000, most, 3600.0)


def _data(stream: str, text: str) -> bytes:
    chunk = base64.b64encode(text.encode()).decode()
    return envelope({"event": {"data": {stream: chunk}}})


def _signalled(number: int) -> dict[str, Any]:
    """envd's end of a process a signal ended: Go's exit code -1 and its words."""
    words = (signal.strsignal(number) or f"signal {number}").lower()
    return {
        "exitCode": -1,
        "exited": False,
        "status": f"signal: {words}",
        "error": f"signal: {words}",
    }


def _end(result: RunResult) -> dict[str, Any]:
    """The command's exit: its code when it ran (a signal's end as envd says it); otherwise
    -1 and why (a limit, policy)."""
    values = [o.data for o in result.outputs or [] if o.mime_type == "text/plain"]
    if result.status.value == "ok" and values and values[-1].lstrip("-").isdigit():
        code = int(values[-1])
        if code < 0:
            return _signalled(-code)
        return {"exitCode": code, "exited": True, "status": f"exit status {code}"}
    why = result.error.message if result.error else result.status.value
    return {"exitCode": -1, "exited": False, "status": result.status.value, "error": why}
