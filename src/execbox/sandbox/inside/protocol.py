"""Framing on the control socket between the host side and a run supervisor.

A frame is a 4-byte kind, an 8-byte big-endian length and the payload. Kinds:
  host -> supervisor: REQ (JSON request), FILE (one input file's bytes, in REQ order), RUN
  (JSON: the host is writing the code to the program itself, see below; the spec and when it
  started), KILL (reason), NEXT (the host has read a result and wants the slot again)
  supervisor -> host: PID (supervisor pid, JSON), RDY (the slot is staged: carries the host's
  ends of the run's stdin, stdout and stderr as SCM_RIGHTS), PRK (the staged program waits for
  its code and the run's baselines are taken; JSON: the run's token and the limits the slot
  has; carries the write end of the program's go pipe), RES (JSON result), ART (one artifact's
  bytes, in RES order), ERR (JSON sandbox error), LOST (instead of RES: the staged program was
  gone before it took its code, killed from outside, so nothing of the request ran and it may
  be sent again; the host closes the slot)

The short way: a request whose limits are those PRK named and that has no input files, sent
after PRK came, has its code (a REQ frame) written by the host straight into the program's go
pipe, just after a RUN that starts the supervisor's clocks at the time the code started on its
way; the supervisor is not on the way to the program. Any other request goes as REQ to the
supervisor, which applies it and writes the code. RDY does not wait for PRK: a slot is ready as
soon as it is staged, and a request that comes before its program is ready takes the long way.

Standard library only: both the executor and the zygote import this.
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
from collections.abc import Callable
from typing import Any, BinaryIO

HEADER = struct.Struct("!4sQ")

REQ, FILE, RUN, KILL, NEXT = b"REQ ", b"FILE", b"RUN ", b"KILL", b"NEXT"
PID, RDY, PRK, RES, ART, ERR, LOST = (b"PID ", b"RDY ", b"PRK ", b"RES ", b"ART ", b"ERR ", b"LOST")

MAX_JSON = 64 * 1024 * 1024

# What a staged program writes on its exit-report pipe once it waits for its code: it has run
# nothing of a request yet, so the supervisor can take the run's baselines (CPU, OOM kills,
# peak memory) before any code runs, whoever sends the code.
PARKED = b"P"

# The kinds of run slot (the host names one when it asks for a slot: "<cgroup> <kind>"): which
# program zygote forks the slot's programs, and whether they copy all its warm pages or only
# the base (see `program.learn_warm_pages`; the heavy zygote's other warm pages are pandas').
# Fixed for a slot's life: no run's code decides what a later run's program copies, which the
# later run could read back from its own memory and CPU time.
# "full": the full zygote, in an environment whose tree has more than the data stack (it
# preloads those modules too); its programs copy the base, as a numpy run's do.
# "javascript": a zygote of its own whose programs exec Node as they are staged and wait for
# their code in it (see `staged`); no warm pages. "bash": the same for bash, whose request is
# not JSON (`go_frame`).
SLOT_KINDS = {
    "light": ("light", True),
    "heavy": ("heavy", False),
    "pandas": ("heavy", True),
    "full": ("full", False),
    "javascript": ("javascript", False),
    "bash": ("bash", False),
}


def frame(kind: bytes, payload: bytes) -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


def go_frame(program_kind: str, code: str, spec: dict[str, Any], token: str) -> bytes:
    """What a program of `program_kind` reads from its go pipe for a run: a REQ frame of JSON,
    or for a staged bash, which reads no JSON, NUL-ended fields (the token, the number of
    environment variables, each as NAME=value, the code's size in bytes) then the code. A
    NUL cannot be in a variable (exec's environment) nor in code a bash slot takes
    (`routing.interpreter_kind`)."""
    if program_kind != "bash":
        return frame(REQ, json.dumps({"code": code, "spec": spec, "token": token}).encode())
    env: dict[str, str] = spec.get("env") or {}
    data = code.encode("utf-8", "surrogatepass")
    fields = [token, str(len(env)), *(f"{k}={v}" for k, v in env.items()), str(len(data))]
    return b"".join(f.encode("utf-8", "surrogatepass") + b"\0" for f in fields) + data


def json_frame(kind: bytes, obj: Any) -> bytes:
    return frame(kind, json.dumps(obj, separators=(",", ":")).encode())


def send_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


# Plain ints: or-ing the socket module's flag enums runs Python (enum's Flag.__or__), and the
# host's staging thread receives with them at every run.
DONTWAIT = int(socket.MSG_DONTWAIT)
_CMSG_CLOEXEC = int(socket.MSG_CMSG_CLOEXEC)


def recv_fds(
    sock: socket.socket, bufsize: int, max_fds: int, flags: int = 0
) -> tuple[bytes, list[int]]:
    """Data and the descriptors passed with it, close-on-exec from the start: the host
    application's children must never inherit a run's pipes (3.11's socket.recv_fds drops its
    flags, so not that). `flags`: plain ints (`DONTWAIT`)."""
    data, ancdata, _flags, _addr = sock.recvmsg(
        bufsize, socket.CMSG_SPACE(max_fds * 4), flags | _CMSG_CLOEXEC
    )
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, fds.tolist()


def drain(fd: int) -> None:
    """Read a non-blocking descriptor until it is empty (a wake-up pipe)."""
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("control socket closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, max_len: int = MAX_JSON) -> tuple[bytes, bytes]:
    """Blocking read of one frame (used by the supervisor)."""
    kind, length = HEADER.unpack(_read_exact(fd, HEADER.size))
    if length > max_len:
        raise ValueError(f"frame {kind!r} too large: {length} bytes")
    return kind, _read_exact(fd, length)


class FrameReader:
    """Incremental parser for a non-blocking reader (used by the host side).

    With `spill`, a frame whose kind `spill(kind)` returns a file for has its payload written
    to that file as it arrives, never held whole in memory; the frame is then returned with an
    empty payload once all of it is written (the caller closes the file)."""

    def __init__(
        self, max_len: int = MAX_JSON, spill: Callable[[bytes], BinaryIO | None] | None = None
    ) -> None:
        self._buf = bytearray()
        self._max = max_len
        self._spill = spill
        self._into: BinaryIO | None = None  # where the payload of the frame being read goes
        self._kind = b""
        self._left = 0

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        frames: list[tuple[bytes, bytes]] = []
        if self._into is not None:
            data = self._pour(data, frames)
        self._buf += data
        while len(self._buf) >= HEADER.size:
            kind, length = HEADER.unpack_from(self._buf)
            if length > self._max:
                raise ValueError(f"frame {kind!r} too large: {length} bytes")
            into = self._spill(bytes(kind)) if self._spill is not None else None
            if into is not None:
                rest = bytes(self._buf[HEADER.size :])
                self._buf.clear()
                self._into, self._kind, self._left = into, bytes(kind), length
                self._buf += self._pour(rest, frames)
                continue
            end = HEADER.size + length
            if len(self._buf) < end:
                break
            frames.append((bytes(kind), bytes(self._buf[HEADER.size : end])))
            del self._buf[:end]
        return frames

    def _pour(self, data: bytes, frames: list[tuple[bytes, bytes]]) -> bytes:
        """Write what of `data` belongs to the spilled frame; return the rest."""
        assert self._into is not None
        n = min(self._left, len(data))
        if n:
            self._into.write(memoryview(data)[:n])
            self._left -= n
        if not self._left:
            self._into = None
            frames.append((self._kind, b""))
        return data[n:]
