"""envd's file API on a sandbox's workspace: `GET /files` reads, `POST /files` writes (one
octet-stream body, or multipart with one part per file), `GET /health`.

Paths are E2B's: absolute under /home/user (E2B's default user's home) or /workspace, or
relative to it; every call goes through the session's files API, which walks the workspace
without following links, never opens a FIFO or device, and caps sizes by the workspace's."""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from ...errors import SessionClosed, UsageError
from ..sessions import DOWNLOAD_CHUNK
from ..state import ServerState
from .access import E2BError, Sandbox, Sandboxes, sandbox_call

ROOTS = ("/home/user", "/workspace")


def workspace_path(path: str) -> str:
    """The workspace-relative path of an E2B path, or E2B's 400."""
    if not path or "\x00" in path:
        raise E2BError(400, "a path is required")
    if path.startswith("/"):
        clean = posixpath.normpath(path)
        for root in ROOTS:
            if clean == root:
                return ""
            if clean.startswith(root + "/"):
                return clean[len(root) + 1 :]
        raise E2BError(
            400,
            f"{path!r} is outside the sandbox's workspace: execbox sandboxes reach files "
            "only under /home/user (the workspace) or /workspace",
        )
    return path


def e2b_path(rel: str) -> str:
    return "/home/user/" + rel if rel else "/home/user"


def _file_error(exc: Exception, path: str) -> E2BError:
    if isinstance(exc, SessionClosed):
        return E2BError(502, f"The sandbox was not found: {exc}")
    message = str(exc)
    if "no file" in message or "No such file" in message:
        return E2BError(404, f"path {path!r} not found")
    if "no room" in message or "more than the session's workspace holds" in message:
        return E2BError(507, message)
    return E2BError(400, message)


async def files_call(
    state: ServerState, sandbox: Sandbox, op: str, path: str, data: bytes | None = None
) -> Any:
    """One call on the sandbox session's files API (a 409 while a cell runs, as execbox's):
    `read`, `write`, `remove`, `rmtree`, `mkdir`, `rename` (`data`: the target) or `tree`."""
    session = state.sessions.get(sandbox.tenant, sandbox.id)
    files = session.files
    release = state.quotas.hold(sandbox.tenant)
    try:
        if op == "read":
            return await state.on_session(sandbox.id, lambda: files.read(path), cell=False)
        if op == "write":
            assert data is not None
            return await state.on_session(sandbox.id, lambda: files.write(path, data), cell=False)
        if op == "remove":
            return await state.on_session(sandbox.id, lambda: files.remove(path), cell=False)
        if op == "rmtree":
            return await state.on_session(
                sandbox.id, lambda: files.remove(path, recursive=True), cell=False
            )
        if op == "mkdir":
            return await state.on_session(sandbox.id, lambda: files.make_dir(path), cell=False)
        if op == "rename":
            assert data is not None
            target = data.decode()
            return await state.on_session(
                sandbox.id, lambda: files.rename(path, target), cell=False
            )
        return await state.on_session(sandbox.id, files.tree, cell=False)
    except (UsageError, SessionClosed) as exc:
        raise _file_error(exc, path) from exc
    finally:
        release()


def router(state: ServerState, sandboxes: Sandboxes) -> APIRouter:
    api = APIRouter()

    @api.get("/health", status_code=204)
    async def health(request: Request) -> Response:
        sandbox = await sandbox_call(state, sandboxes, request)
        if state.sessions.get(sandbox.tenant, sandbox.id).closed:
            raise E2BError(502, f"The sandbox {sandbox.id!r} was not found")
        return Response(status_code=204)

    @api.get("/files")
    async def read(request: Request, path: str = "") -> Response:
        sandbox = await sandbox_call(state, sandboxes, request)
        rel = workspace_path(path)
        # Held in memory until sent: booked against the server's result budget first, at
        # the most the workspace can hold, as execbox's own file reads are.
        room = getattr(state.sessions.get(sandbox.tenant, sandbox.id), "room_bytes", 0)
        reservation = state.results.reserve(room, sandbox.tenant.name)
        try:
            data: bytes = await files_call(state, sandbox, "read", rel)
        except BaseException:
            reservation.release()
            raise
        reservation.resize(len(data))

        def chunks() -> Iterator[bytes]:
            # Sent piece by piece as the client drains them: handed over whole, the body would
            # sit in the server's write buffer with its booking already given back.
            view = memoryview(data)
            for at in range(0, len(data), DOWNLOAD_CHUNK):
                yield bytes(view[at : at + DOWNLOAD_CHUNK])

        return StreamingResponse(
            chunks(),
            media_type="application/octet-stream",
            headers={"content-length": str(len(data))},
            background=BackgroundTask(reservation.release),
        )

    @api.post("/files")
    async def write(request: Request, path: str = "") -> list[dict[str, str]]:
        sandbox = await sandbox_call(state, sandboxes, request)
        kind = request.headers.get("content-type", "")
        if request.headers.get("content-encoding", "identity") not in ("identity", ""):
            raise E2BError(400, "compressed uploads are not supported: send gzip=False")
        uploads: list[tuple[str, bytes]] = []
        if kind.startswith("multipart/form-data"):
            form = await request.form(max_files=1000, max_fields=1000)
            try:
                for name, value in form.multi_items():
                    if isinstance(value, str):
                        continue
                    target = path if path and len(form) == 1 else (value.filename or name)
                    uploads.append((target, await value.read()))
            finally:
                await form.close()
        else:
            uploads.append((path, await request.body()))
        written = []
        for target, data in uploads:
            rel = workspace_path(target)
            if not rel:
                raise E2BError(400, f"{target!r} is a directory")
            await files_call(state, sandbox, "write", rel, data)
            written.append({"name": posixpath.basename(rel), "type": "file", "path": e2b_path(rel)})
        return written

    return api
