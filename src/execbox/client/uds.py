"""A run on a local `execbox serve`'s Unix socket in the standard library only: the CLI's fast
path. Starting Python is most of what a CLI run through a server costs, and httpx and pydantic
would add twice that again, so the request goes out as JSON that the server validates (as it
validates every request) and the answer is read as plain HTTP/1.1 here.

The server on the other end is execbox's own, on a socket only this user can reach, and it
answers with a body of known length or chunks; nothing else of HTTP is needed. Whatever it
refuses as invalid (422) comes back as `Invalid`, with nothing run: the caller builds the request
the full way for the same message it would have given without a server.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from ..errors import SandboxUnavailable
from .answer import Events, error_for, stream_error

# The most bytes of a status line, a header line or a chunk's size line.
MAX_LINE = 65536


class Invalid(Exception):
    """The server refused the request as invalid before running anything."""


class NotSent(Exception):
    """The connection failed before the request was sent: nothing ran."""


class Response:
    """An HTTP/1.1 response read from a connection: status, headers, then the body."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        parts = self._line().split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ConnectionError(f"not an HTTP answer: {parts!r}")
        self.status = int(parts[1])
        self.headers: dict[str, str] = {}
        while line := self._line():
            name, _, value = line.decode("latin-1").partition(":")
            self.headers[name.strip().lower()] = value.strip()
        self.chunked = self.headers.get("transfer-encoding", "").lower() == "chunked"

    def _line(self) -> bytes:
        line = self._stream.readline(MAX_LINE)
        if not line.endswith(b"\n"):
            raise ConnectionError("the server closed the connection mid-answer")
        return line.rstrip(b"\r\n")

    def _exactly(self, size: int) -> bytes:
        data = self._stream.read(size)
        if len(data) != size:
            raise ConnectionError("the server closed the connection mid-answer")
        return data

    def chunks(self) -> Iterator[bytes]:
        """The body, piece by piece as it arrives."""
        if not self.chunked:
            yield self._exactly(int(self.headers.get("content-length", "0")))
            return
        while size := int(self._line().split(b";")[0], 16):
            yield self._exactly(size)
            self._line()
        while self._line():  # trailers, up to the blank line
            pass

    def read(self) -> bytes:
        return b"".join(self.chunks())

    def lines(self) -> Iterator[str]:
        """The body's lines (as server-sent events has them), each as it completes."""
        held = b""
        for chunk in self.chunks():
            *done, held = (held + chunk).split(b"\n")
            for line in done:
                yield line.removesuffix(b"\r").decode()
        if held:
            yield held.decode()


class Connection:
    """One keep-alive connection to the server's socket."""

    def __init__(self, path: Path, timeout_s: float) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            self._sock.connect(str(path))
        except OSError as exc:
            self._sock.close()
            raise NotSent(str(exc)) from exc
        self._stream = self._sock.makefile("rb")

    def request(self, method: str, target: str, body: bytes | None = None) -> Response:
        head = f"{method} {target} HTTP/1.1\r\nHost: execbox\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self._sock.sendall(head.encode() + b"\r\n" + (body or b""))
        return Response(self._stream)

    def close(self) -> None:
        self._stream.close()
        self._sock.close()


def run(
    path: Path,
    body: dict[str, Any],
    *,
    timeout_s: float,
    on_stdout: Callable[[bytes], None] | None,
    on_stderr: Callable[[bytes], None] | None,
    artifacts: bool,
) -> tuple[bytes, dict[str, Any], dict[str, bytes | None]]:
    """Run `body` (a RunRequest's JSON, with cache and secrets) on the server at `path`: the
    result's JSON as the server sent it, parsed, and (`artifacts`) each artifact's bytes (None
    for one the server did not keep). With an output callback the output streams to it.

    Raises NotSent or Invalid when nothing ran, the ExecboxError of the server's answer, or
    SandboxUnavailable when the server was lost mid-run."""
    conn = Connection(path, timeout_s)
    try:
        try:
            raw = _run(conn, json.dumps(body).encode(), on_stdout, on_stderr)
            result: dict[str, Any] = json.loads(raw)
            data = (
                {
                    a["path"]: _artifact(conn, result["run_id"], a["path"])
                    for a in result["artifacts"]
                }
                if artifacts
                else {}
            )
        except (OSError, ValueError) as exc:  # socket errors, timeouts, a garbled answer
            raise SandboxUnavailable(f"lost the execbox server mid-run: {exc}") from exc
    finally:
        conn.close()
    return raw, result, data


def _run(
    conn: Connection,
    body: bytes,
    on_stdout: Callable[[bytes], None] | None,
    on_stderr: Callable[[bytes], None] | None,
) -> bytes:
    streaming = on_stdout is not None or on_stderr is not None
    response = conn.request("POST", "/v1/runs/stream" if streaming else "/v1/runs", body)
    if response.status == 422:
        response.read()
        raise Invalid()
    if response.status >= 400:
        raise error_for(response.status, response.read(), response.headers.get("retry-after"))
    if not streaming:
        return response.read()
    events, result = Events(), None
    for line in response.lines():
        event = events.feed(line)
        if event is None:
            continue
        name, data = event
        if name == "result":
            result = data.encode()
        elif name == "error":
            raise stream_error(data)
        elif name in ("stdout", "stderr"):
            callback = on_stdout if name == "stdout" else on_stderr
            if callback is not None:
                callback(json.loads(data)["text"].encode())
    if result is None:
        raise ConnectionError("the server ended the stream without a result")
    return result


def _artifact(conn: Connection, run_id: str, path: str) -> bytes | None:
    from urllib.parse import quote

    response = conn.request(
        "GET", f"/v1/runs/{quote(run_id, safe='')}/artifacts/{quote(path, safe='/')}"
    )
    data = response.read()
    if response.status < 400:
        return data
    error = error_for(response.status, data)
    if "artifact_not_found" in str(error):
        return None
    raise error
