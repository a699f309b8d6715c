"""envd's Connect-RPC services in their JSON encoding: `process.Process/Start` (a server
stream) runs a command in the sandbox's jail, and `filesystem.Filesystem/*` (unary) stat, list,
move and remove workspace entries.

A command is a cell of the sandbox's Python session that runs the program with the cell's own
stdout and stderr (so it streams, is redacted and recorded like any cell, and is policy-checked
under the sandbox's profile); its exit code is the cell's value. Filesystem calls go through
the session's files API (no link followed); directories are seen through the files they hold,
so an empty directory does not show and cannot be made."""

from __future__ import annotations

import asyncio
import base64
import json
import posixpath
import struct
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from ...contract import Artifact, RunResult
from ..errors import ApiError
from ..state import ServerState
from .access import E2BError, Sandbox, Sandboxes, sandbox_call
from .envd import e2b_path, files_call, workspace_path
from .interpreter import _Cell, admit_cell

END_STREAM = 0x02
MAX_MESSAGE = 1 << 20
CONNECT_CODES = {
    400: "invalid_argument",
    401: "unauthenticated",
    404: "not_found",
    409: "already_exists",
    413: "resource_exhausted",
    429: "resource_exhausted",
    501: "unimplemented",
    502: "unavailable",
    503: "unavailable",
    507: "resource_exhausted",
}


class RpcError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    data = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(data)) + data


def unwrap(body: bytes) -> dict[str, Any]:
    """The one message of a client-stream body (5-byte prefix: flags, length)."""
    if len(body) < 5:
        raise E2BError(400, "a Connect stream message needs its 5-byte prefix")
    flags, size = struct.unpack(">BI", body[:5])
    if flags & 0x01:
        raise E2BError(400, "compressed Connect messages are not supported")
    if size > MAX_MESSAGE or len(body) < 5 + size:
        raise E2BError(400, "a Connect message is cut short or too large")
    try:
        message = json.loads(body[5 : 5 + size])
    except ValueError:
        raise E2BError(400, "a Connect message is JSON") from None
    if not isinstance(message, dict):
        raise E2BError(400, "a Connect message is a JSON object")
    return message


def _entry(rel: str, kind: str, size: int = 0) -> dict[str, Any]:
    directory = kind == "dir"
    return {
        "name": posixpath.basename(rel) or "user",
        "type": "FILE_TYPE_DIRECTORY" if directory else "FILE_TYPE_FILE",
        "path": e2b_path(rel),
        "size": str(size),
        "mode": 0o755 if directory else 0o644,
        "permissions": "drwxr-xr-x" if directory else "-rw-r--r--",
        "owner": "user",
        "group": "user",
    }


def _tree(files: list[Artifact]) -> dict[str, tuple[str, int]]:
    """Every entry the workspace's regular files imply: path -> (kind, size)."""
    tree: dict[str, tuple[str, int]] = {"": ("dir", 0)}
    for f in files:
        tree[f.path] = ("file", f.size)
        parent = posixpath.dirname(f.path)
        while parent:
            tree[parent] = ("dir", 0)
            parent = posixpath.dirname(parent)
    return tree


async def _listing(state: ServerState, sandbox: Sandbox) -> dict[str, tuple[str, int]]:
    files: list[Artifact] = await files_call(state, sandbox, "list", "")
    return _tree(files)


def _under(tree: dict[str, tuple[str, int]], rel: str) -> list[str]:
    prefix = rel + "/" if rel else ""
    return [p for p in tree if p and p.startswith(prefix)]


async def _move(state: ServerState, sandbox: Sandbox, req: dict[str, Any]) -> dict[str, Any]:
    source, target = (
        workspace_path(_text(req, "source")),
        workspace_path(_text(req, "destination")),
    )
    tree = await _listing(state, sandbox)
    if source not in tree or not source:
        raise RpcError("not_found", f"path {req.get('source')!r} not found")
    if posixpath.normpath(source) == posixpath.normpath(target):
        # Copy then remove would remove the only copy.
        return {"entry": _entry(source, *tree[source])}
    moves = (
        [(source, target)]
        if tree[source][0] == "file"
        else [(p, target + p[len(source) :]) for p in _under(tree, source) if tree[p][0] == "file"]
    )
    # Each file is held in memory between its read and its write: booked as a file read is.
    room = getattr(state.sessions.get(sandbox.tenant, sandbox.id), "room_bytes", 0)
    reservation = state.results.reserve(room, sandbox.tenant.name)
    try:
        for src, dst in moves:
            data = await files_call(state, sandbox, "read", src)
            await files_call(state, sandbox, "write", dst, data)
            await files_call(state, sandbox, "remove", src)
    finally:
        reservation.release()
    return {"entry": _entry(target, tree[source][0], tree[source][1])}


async def _filesystem(
    state: ServerState, sandbox: Sandbox, method: str, req: dict[str, Any]
) -> dict[str, Any]:
    if method == "MakeDir":
        raise RpcError(
            "unimplemented",
            "execbox does not support making empty directories: a file written at a path "
            "makes its directories",
        )
    if method in ("WatchDir", "CreateWatcher", "GetWatcherEvents", "RemoveWatcher"):
        raise RpcError("unimplemented", "execbox does not support watching directories")
    if method == "Move":
        return await _move(state, sandbox, req)
    rel = workspace_path(_text(req, "path"))
    tree = await _listing(state, sandbox)
    if rel not in tree:
        raise RpcError("not_found", f"path {req.get('path')!r} not found")
    kind, size = tree[rel]
    if method == "Stat":
        return {"entry": _entry(rel, kind, size)}
    if method == "ListDir":
        if kind != "dir":
            raise RpcError("invalid_argument", f"path {req.get('path')!r} is not a directory")
        try:
            depth = max(1, int(req.get("depth") or 1))
        except (TypeError, ValueError, OverflowError):
            raise RpcError("invalid_argument", "depth is a whole number") from None
        base = rel.count("/") + 1 if rel else 0
        entries = [
            _entry(p, *tree[p]) for p in sorted(_under(tree, rel)) if p.count("/") - base < depth
        ]
        return {"entries": entries}
    if method == "Remove":
        if not rel:
            raise RpcError("invalid_argument", "the workspace itself cannot be removed")
        if kind == "file":
            await files_call(state, sandbox, "remove", rel)
        else:
            for p in sorted(_under(tree, rel), key=lambda p: -p.count("/")):
                await files_call(state, sandbox, "remove", p)
            await files_call(state, sandbox, "remove", rel)
        return {}
    raise RpcError("unimplemented", f"execbox does not support filesystem.Filesystem/{method}")


def _text(req: dict[str, Any], name: str) -> str:
    value = req.get(name, "")
    if not isinstance(value, str):
        raise RpcError("invalid_argument", f"{name} is a string")
    return value


def _command_code(req: dict[str, Any]) -> str:
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
    # Its output is the cell's own stdout and stderr; its exit code the cell's value.
    return (
        "__import__('subprocess').run("
        f"{[cmd, *args]!r}, cwd={cwd!r}, "
        f"env={{**__import__('os').environ, **{dict(envs)!r}}}, "
        "stdin=__import__('subprocess').DEVNULL).returncode"
    )


def router(state: ServerState, sandboxes: Sandboxes) -> APIRouter:
    api = APIRouter()

    @api.post("/filesystem.Filesystem/{method}")
    async def filesystem(method: str, request: Request) -> Response:
        sandbox = await sandbox_call(state, sandboxes, request)
        try:
            req = json.loads(await request.body() or b"{}")
            if not isinstance(req, dict):
                raise RpcError("invalid_argument", "a request is a JSON object")
            answer = await _filesystem(state, sandbox, method, req)
        except RpcError as exc:
            return _rpc_error(exc.code, exc.message)
        except (E2BError, ApiError) as exc:
            return _rpc_error(CONNECT_CODES.get(exc.status, "unknown"), exc.message)
        except ValueError as exc:
            return _rpc_error("invalid_argument", f"bad request: {exc}")
        return Response(json.dumps(answer), media_type="application/json")

    @api.post("/process.Process/Start")
    async def start(request: Request) -> StreamingResponse:
        sandbox = await sandbox_call(state, sandboxes, request)
        code = _command_code(unwrap(await request.body()))
        session = state.sessions.get(sandbox.tenant, sandbox.id)
        timeout_s = _timeout(state, sandbox, request.headers.get("connect-timeout-ms"))
        release = admit_cell(state, sandbox.tenant, session)
        try:
            cell = _Cell(state, sandbox.tenant, session, sandbox.id, code, "python", timeout_s)
        except BaseException:
            release()
            raise
        return StreamingResponse(_events(cell, release), media_type="application/connect+json")

    @api.post("/process.Process/{method}")
    async def other(method: str, request: Request) -> Response:
        await sandbox_call(state, sandboxes, request)
        if method == "List":
            return Response(json.dumps({"processes": []}), media_type="application/json")
        return _rpc_error(
            "unimplemented",
            f"execbox does not support process.Process/{method}: a command runs as a cell "
            "of the sandbox's session, to its end (no stdin, signals or reconnecting)",
        )

    return api


async def _events(cell: _Cell, release: Any) -> AsyncIterator[bytes]:
    """Start, output chunks, end: E2B's process events as Connect stream messages."""
    try:
        yield envelope({"event": {"start": {"pid": 1}}})
        while True:
            name, item = await cell.queue.get()
            if name in ("stdout", "stderr"):
                with cell.lock:
                    cell.held -= len(item)
                cell.sent[name].append(item)
                yield _data(name, item)
                continue
            if name == "failed":
                yield envelope({"error": {"code": "unavailable", "message": str(item)}}, END_STREAM)
                return
            result: RunResult = item
            for stream in ("stdout", "stderr"):
                whole, streamed = getattr(result, stream), "".join(cell.sent[stream])
                rest = whole[len(streamed) :] if whole.startswith(streamed) else ""
                if rest:
                    yield _data(stream, rest)
            yield envelope({"event": {"end": _end(result)}})
            yield envelope({}, END_STREAM)
            return
    finally:
        release()
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


def _end(result: RunResult) -> dict[str, Any]:
    """The command's exit: its code when it ran; otherwise -1 and why (a limit, policy)."""
    values = [o.data for o in result.outputs or [] if o.mime_type == "text/plain"]
    if result.status.value == "ok" and values and values[-1].lstrip("-").isdigit():
        code = int(values[-1])
        return {"exitCode": code, "exited": True, "status": f"exit status {code}"}
    why = result.error.message if result.error else result.status.value
    return {"exitCode": -1, "exited": False, "status": result.status.value, "error": why}


def _rpc_error(code: str, message: str) -> Response:
    status = {v: k for k, v in reversed(CONNECT_CODES.items())}.get(code, 500)
    return Response(
        json.dumps({"code": code, "message": message}),
        status_code=status,
        media_type="application/json",
    )
