"""envd's Connect-RPC plumbing in its JSON encoding, and its filesystem service:
`filesystem.Filesystem/*` (unary) stat, list, make, move and remove workspace entries through
the session's files API (no link followed; directories are real, empty ones included). The
process service is `process`."""

from __future__ import annotations

import json
import posixpath
import struct
from typing import Any

from fastapi import APIRouter, Request, Response

from ...contract import Artifact
from ..errors import ApiError
from ..state import ServerState
from .access import E2BError, Sandbox, Sandboxes, sandbox_call
from .envd import e2b_path, files_call, workspace_path

END_STREAM = 0x02
MAX_MESSAGE = 1 << 20
CONNECT_CODES = {
    400: "invalid_argument",
    401: "unauthenticated",
    404: "not_found",
    409: "aborted",  # the session is busy (a cell runs): retry
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


def _tree(files: list[Artifact], dirs: list[str]) -> dict[str, tuple[str, int]]:
    """Every entry of the workspace: path -> (kind, size)."""
    tree: dict[str, tuple[str, int]] = {"": ("dir", 0)}
    tree.update((d, ("dir", 0)) for d in dirs)
    tree.update((f.path, ("file", f.size)) for f in files)
    return tree


async def _listing(state: ServerState, sandbox: Sandbox) -> dict[str, tuple[str, int]]:
    files, dirs = await files_call(state, sandbox, "tree", "")
    return _tree(files, dirs)


def _under(tree: dict[str, tuple[str, int]], rel: str) -> list[str]:
    prefix = rel + "/" if rel else ""
    return [p for p in tree if p and p.startswith(prefix)]


async def _move(state: ServerState, sandbox: Sandbox, req: dict[str, Any]) -> dict[str, Any]:
    source, target = (
        workspace_path(_text(req, "source")),
        workspace_path(_text(req, "destination")),
    )
    if not source or not target:
        raise RpcError("invalid_argument", "the workspace itself cannot be moved or replaced")
    tree = await _listing(state, sandbox)
    if source not in tree:
        raise RpcError("not_found", f"path {req.get('source')!r} not found")
    await files_call(state, sandbox, "rename", source, target.encode())
    return {"entry": _entry(target, *tree[source])}


async def _make_dir(state: ServerState, sandbox: Sandbox, req: dict[str, Any]) -> dict[str, Any]:
    rel = workspace_path(_text(req, "path"))
    if not rel or not await files_call(state, sandbox, "mkdir", rel):
        raise RpcError("already_exists", f"directory already exists: {e2b_path(rel)}")
    return {"entry": _entry(rel, "dir")}


async def _filesystem(
    state: ServerState, sandbox: Sandbox, method: str, req: dict[str, Any]
) -> dict[str, Any]:
    if method == "MakeDir":
        return await _make_dir(state, sandbox, req)
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
        # In one call in the sandbox: the listing shows no links, FIFOs or entries past its
        # depth, which a directory may hold too.
        await files_call(state, sandbox, "rmtree" if kind == "dir" else "remove", rel)
        return {}
    raise RpcError("unimplemented", f"execbox does not support filesystem.Filesystem/{method}")


def _text(req: dict[str, Any], name: str) -> str:
    value = req.get(name, "")
    if not isinstance(value, str):
        raise RpcError("invalid_argument", f"{name} is a string")
    return value


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
            return rpc_error(exc.code, exc.message)
        except (E2BError, ApiError) as exc:
            return rpc_error(CONNECT_CODES.get(exc.status, "unknown"), exc.message)
        except ValueError as exc:
            return rpc_error("invalid_argument", f"bad request: {exc}")
        return Response(json.dumps(answer), media_type="application/json")

    return api


def rpc_error(code: str, message: str) -> Response:
    """A unary call's error in Connect's shape, with the HTTP status its code maps to."""
    status = {"already_exists": 409, **{v: k for k, v in reversed(CONNECT_CODES.items())}}.get(
        code, 500
    )
    return Response(
        json.dumps({"code": code, "message": message}),
        status_code=status,
        media_type="application/json",
    )
