"""The host's end of a session: a staged run slot turned into a long-lived interpreter.

The supervisor hands over the write end of the interpreter's cell pipe when the session is
ready: a cell's code is written to the interpreter directly, without a hop through the
supervisor, then announced to the supervisor (CELL, which starts its clocks). A cell's output
streams through the same pipes for the whole session; the program ends each cell's output
with a marker the host chose for that cell, so the host knows where one cell's
output stops. Output caps apply per cell: past the cap, bytes are read and dropped and the cell
is interrupted. Calls on one channel must not overlap (the `Session` above holds a lock).
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ..inside import cells, protocol
from .errors import HostError, RunNotStarted
from .pump import CHUNK, STDERR, STDOUT, CappedOutput, OutputCallback, RawRun
from .slot import Slot

START_TIMEOUT_S = 60.0
MARKER_DRAIN_S = 2.0  # after the result, how long to wait for the end-of-cell markers
FILE_OP_TIMEOUT_S = 120.0
CLOSE_WAIT_S = 5.0


class SessionEnded(Exception):
    """The session's interpreter is gone; `meta` says why (a contract status and error)."""

    def __init__(self, meta: dict[str, Any]) -> None:
        super().__init__((meta.get("error") or {}).get("message", "the session has ended"))
        self.meta = meta


class SessionChannel:
    def __init__(self, slot: Slot, release: Callable[[Slot], None]) -> None:
        self.slot = slot
        self._release = release
        self._reader = protocol.FrameReader(protocol.MAX_JSON + (1 << 34))
        self._carry = {slot.stdout_r: b"", slot.stderr_r: b""}
        self._pending: list[tuple[bytes, bytes]] = []
        self.cells_w = -1  # the interpreter's cell pipe, from SRDY
        self.ended: dict[str, Any] | None = None
        self.closed = False
        # Interrupts from other threads: one that comes while a cell is starting is sent as
        # soon as the supervisor has the cell (before it, the supervisor would drop it).
        self._int_lock = threading.Lock()
        self._cell_state = "idle"  # "starting", "running"
        self._int_pending: str | None = None

    # ---- start and stop -----------------------------------------------------------------------

    def start(self, session_id: str, spec: dict[str, Any], files: list[tuple[str, bytes]]) -> None:
        """Send the session request; return when the interpreter is ready."""
        request = {
            "code": "",
            "run_id": session_id,
            "spec": spec,
            "session": True,
            "files": [{"name": n, "size": len(d)} for n, d in files],
        }
        self.slot.close_go()  # the supervisor starts the interpreter, then hands over its pipe
        try:
            self.slot.ctrl.sendall(protocol.json_frame(protocol.REQ, request))
            for _name, data in files:
                self.slot.ctrl.sendall(protocol.frame(protocol.FILE, data))
        except OSError as exc:  # gone before it had the request: it started nothing
            self.close()
            raise RunNotStarted(f"the session supervisor did not take the request: {exc}") from exc
        self.slot.close_stdin()  # a session has no stdin: input comes as cells and files
        for fd in (self.slot.stdout_r, self.slot.stderr_r):
            os.set_blocking(fd, False)
        self.slot.ctrl.setblocking(False)
        try:
            kind, payload = self._next_frame(time.monotonic() + START_TIMEOUT_S)
            if kind == protocol.LOST:
                raise RunNotStarted(
                    "the session slot's program was gone before it took the session's request"
                )
            if kind == cells.END:
                raise HostError(
                    "the session's interpreter exited while starting: "
                    + str((json.loads(payload).get("error") or {}).get("message"))
                )
            if kind != cells.SESSION_READY or self.cells_w < 0:
                raise HostError(
                    f"protocol: expected the session to be ready with its cell pipe, got {kind!r}"
                )
            os.set_blocking(self.cells_w, False)
        except BaseException:
            self.close()
            raise

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """End the session: the supervisor kills the interpreter and removes its cgroup. Returns
        when that is done (the supervisor has exited), so nothing of the session outlives it."""
        if self.closed:
            return
        self.closed = True
        if self.cells_w >= 0:
            os.close(self.cells_w)
            self.cells_w = -1
        self.slot.ctrl.close()  # end of file: the supervisor tears the session down
        if not self.slot.wait_gone(wait_s):
            self.slot.kill()
        self._release(self.slot)

    def kill(self) -> None:
        """For a stuck supervisor, or a session that must end mid-cell: kill the supervisor
        outright (its init, and every process of the session, die with it). Safe from any
        thread: it only signals."""
        self.slot.kill()

    # ---- control frames -----------------------------------------------------------------------

    def _next_frame(self, deadline: float) -> tuple[bytes, bytes]:
        with selectors.DefaultSelector() as sel:
            sel.register(self.slot.ctrl, selectors.EVENT_READ)
            while True:
                frames = self._poll_ctrl()
                if frames:
                    kind, payload = frames[0]
                    self._pending = frames[1:]
                    return kind, payload
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill()
                    raise HostError("the session supervisor did not answer in time")
                sel.select(min(left, 1.0))

    def _poll_ctrl(self) -> list[tuple[bytes, bytes]]:
        """Frames available now; HostError when the supervisor is gone or failed."""
        frames, self._pending = list(self._pending), []
        if frames:
            return frames
        passed = -1
        try:
            if self.cells_w < 0 and not self.closed:  # SRDY brings a descriptor
                data, passed = _recv_with_fd(self.slot.ctrl)
            else:
                data = self.slot.ctrl.recv(1 << 20)
        except BlockingIOError:
            return []
        except OSError:
            data = b""
        try:
            if not data:
                raise HostError("the session supervisor exited")
            frames = self._reader.feed(data)
        except BaseException:
            if passed >= 0:
                os.close(passed)
            raise
        if any(kind == protocol.PRK for kind, _ in frames):
            # The slot offered a run the short way before its supervisor read our request: the
            # descriptor that came with it is not the cell pipe (a read ends with the first
            # message that passes any).
            if passed >= 0:
                os.close(passed)
                passed = -1
            frames = [(kind, payload) for kind, payload in frames if kind != protocol.PRK]
        if passed >= 0:
            self.cells_w = passed
        for kind, payload in frames:
            if kind == protocol.ERR:
                raise HostError("sandbox: " + json.loads(payload)["message"])
        return frames

    # ---- cells --------------------------------------------------------------------------------

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
        """Run one cell; the result's meta carries `outputs`, and `ended` when the session
        ended with it. Raises SessionEnded when it had ended before."""
        self._check_ended()
        with self._int_lock:
            self._cell_state, self._int_pending = "starting", None
        try:
            marker = f"\x00execbox-cell-end-{os.urandom(12).hex()}\x00"
            cell_id = os.urandom(12).hex()  # its report must echo it: no other cell's fits
            # The code goes to the interpreter first, so it starts at once; never blocking on
            # it (it may not be reading, if an earlier cell stopped its loop): what the pipe
            # does not take now is fed as it does. Then CELL starts the supervisor's clocks.
            pump = _CellPump(
                self,
                marker.encode(),
                output_bytes,
                on_stdout,
                on_stderr,
                protocol.json_frame(cells.CELL, {"code": code, "marker": marker, "cell": cell_id}),
            )
            pump.feed()
            try:
                self._send(
                    protocol.json_frame(
                        cells.CELL, {"timeout_s": timeout_s, "cpu_s": cpu_s, "cell": cell_id}
                    )
                )
            except OSError as exc:
                # The code went first: a cell that ends the program at once (`exit`) can end
                # the session before the supervisor reads CELL. Its END, sent before it left,
                # is then this cell's result; without one the supervisor failed.
                try:
                    raw = pump.run(time.monotonic() + backstop_s)
                except HostError:
                    raise HostError(f"the session supervisor did not take the cell: {exc}") from exc
                if not raw.meta.get("ended"):
                    raise HostError(f"the session supervisor did not take the cell: {exc}") from exc
                self.ended = raw.meta
                return raw
            with self._int_lock:
                self._cell_state = "running"
                if self._int_pending is not None:
                    self._send_int(self._int_pending)
            raw = pump.run(time.monotonic() + backstop_s)
            if raw.meta.get("ended"):
                self.ended = raw.meta
            return raw
        finally:
            with self._int_lock:
                self._cell_state, self._int_pending = "idle", None

    def _send(self, data: bytes) -> None:
        """All of `data` on the (non-blocking) control socket: a small frame goes in one call;
        a large one waits for room."""
        sock = self.slot.ctrl
        try:
            sent = sock.send(data)
        except BlockingIOError:
            sent = 0
        if sent < len(data):
            sock.setblocking(True)
            try:
                sock.sendall(memoryview(data)[sent:])
            finally:
                sock.setblocking(False)

    def _check_ended(self) -> None:
        if self.ended is None:
            try:
                for kind, payload in self._poll_ctrl():
                    if kind == cells.END:
                        self.ended = json.loads(payload)
            except HostError as exc:
                self.ended = {"status": "sandbox_error", "error": {"message": str(exc)}}
        if self.ended is not None:
            raise SessionEnded(self.ended)

    def interrupt(self, reason: str) -> bool:
        """Interrupt the running cell (safe from any thread); False when none runs."""
        with self._int_lock:
            if self._cell_state == "running":
                self._send_int(reason)
            elif self._cell_state == "starting":
                self._int_pending = reason
            else:
                return False
            return True

    def cut_output(self) -> None:
        """The cell's output went past its cap: interrupt it."""
        self.interrupt("output_limit")

    def _send_int(self, reason: str) -> None:
        try:
            self.slot.ctrl.send(protocol.frame(cells.INT, reason.encode()))
        except OSError:
            pass

    # ---- files --------------------------------------------------------------------------------

    def file_op(
        self, op: str, path: str = "", data: bytes | None = None
    ) -> tuple[dict[str, Any], bytes]:
        """One files API call; returns (answer, bytes read)."""
        self._check_ended()
        try:
            self._send(protocol.json_frame(cells.FOP, {"op": op, "path": path}))
            if data is not None:
                self._send(protocol.frame(protocol.FILE, data))
        except OSError as exc:
            raise HostError(f"the session supervisor did not take the call: {exc}") from exc
        deadline = time.monotonic() + FILE_OP_TIMEOUT_S
        while True:
            kind, payload = self._next_frame(deadline)
            if kind == cells.END:
                self.ended = json.loads(payload)
                raise SessionEnded(self.ended)
            if kind == cells.FILE_RESULT:
                answer = json.loads(payload)
                blob = b""
                if answer.get("ok") and op == "read":
                    kind, blob = self._next_frame(deadline)
                    if kind != protocol.FILE:
                        raise HostError(f"protocol: expected file data, got {kind!r}")
                return answer, blob


def _recv_with_fd(sock: socket.socket) -> tuple[bytes, int]:
    """Data and at most one passed descriptor (-1 if none), close-on-exec."""
    data, fds = protocol.recv_fds(sock, 1 << 20, 1)
    for extra in fds[1:]:
        os.close(extra)
    return data, fds[0] if fds else -1


class _CellPump:
    """Moves one cell's output and result from the session's pipes to the caller."""

    def __init__(
        self,
        channel: SessionChannel,
        marker: bytes,
        cap: int,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        cell: bytes,
    ) -> None:
        self.ch = channel
        self.cell = memoryview(cell)  # what the interpreter has not taken yet
        slot = channel.slot
        self.marker = marker
        self.fds = (slot.stdout_r, slot.stderr_r)
        self.stream = {slot.stdout_r: STDOUT, slot.stderr_r: STDERR}
        self.output = CappedOutput(cap, on_stdout, on_stderr, channel.cut_output)
        self.hold = {fd: b"" for fd in self.fds}  # may hold the start of a split marker
        self.done = {fd: False for fd in self.fds}
        self.meta: dict[str, Any] | None = None
        self.arts: list[bytes] = []
        self.sel: selectors.BaseSelector | None = None

    # Complex on purpose: one event loop over the cell's descriptors and its deadline.
    def run(self, backstop: float) -> RawRun:  # noqa: C901
        ch = self.ch
        sel = self.sel = selectors.DefaultSelector()
        try:
            sel.register(ch.slot.ctrl, selectors.EVENT_READ)
            for fd in self.fds:
                sel.register(fd, selectors.EVENT_READ)
                carry, ch._carry[fd] = ch._carry[fd], b""
                if carry:
                    self._take(fd, carry)
            drain_until: float | None = None
            if self.cell:
                sel.register(ch.cells_w, selectors.EVENT_WRITE)
            self._ctrl()  # frames that arrived with an earlier read
            watching_ctrl = True
            while True:
                if self._complete():
                    if watching_ctrl:
                        # The result is whole: nothing more of this cell comes that way, and a
                        # supervisor whose session ended may exit before our output pipes reach
                        # their end. That end of file is not a failure of the cell.
                        sel.unregister(ch.slot.ctrl)
                        watching_ctrl = False
                    if all(self.done.values()):
                        break
                    if drain_until is None:
                        drain_until = time.monotonic() + MARKER_DRAIN_S
                    elif time.monotonic() >= drain_until:
                        break  # a marker that never comes (the code redirected fd 1, say)
                now = time.monotonic()
                if now >= backstop:
                    ch.kill()
                    raise HostError("the session supervisor did not finish the cell in time")
                wait = min(backstop, drain_until or backstop) - now
                for key, _ in sel.select(timeout=min(max(wait, 0.001), 1.0)):
                    if key.fileobj is ch.slot.ctrl:
                        self._ctrl()
                    elif key.fd == ch.cells_w:
                        if not self.feed():
                            sel.unregister(ch.cells_w)
                    else:
                        self._read(sel, key.fd)
        finally:
            sel.close()
        assert self.meta is not None
        if self.cell and not self.meta.get("ended"):
            # It answered without taking the whole cell (the cell's id makes that all but
            # impossible): what is left would be read as the start of the next one. The code
            # did it, so it is the session's end, not a sandbox error.
            ch.kill()
            self.meta = {
                "status": "error",
                "exit_code": None,
                "signal": "SIGKILL",
                "error": {
                    "type": "SessionError",
                    "line": None,
                    "column": None,
                    "traceback": None,
                    "message": (
                        "the interpreter answered before taking the whole "
                        "cell; the session was ended"
                    ),
                },
                "ended": True,
                "artifacts": [],
                "outputs": [],
                "metrics": {"wall_ms": 0, "cpu_ms": 0, "memory_peak_bytes": 0},
            }
            self.arts = []
        for fd in self.fds:  # what a marker that never came was holding back
            self._emit(fd, self.hold[fd])
            self.hold[fd] = b""
        return self.output.result(self.meta, self.arts)

    def feed(self) -> bool:
        """Write what the pipe takes of the cell; True while some is left."""
        try:
            while self.cell:
                self.cell = self.cell[os.write(self.ch.cells_w, self.cell) :]
        except BlockingIOError:
            pass
        except BrokenPipeError:
            self.cell = memoryview(b"")  # the interpreter is gone: the supervisor says so next
        return bool(self.cell)

    def _complete(self) -> bool:
        if self.meta is None or len(self.arts) < len(self.meta.get("artifacts", [])):
            return False
        markers = self.meta.get("markers") or {}
        if not self.meta.get("ended"):  # an ended session's pipes reach their end soon
            for fd, name in zip(self.fds, ("stdout", "stderr"), strict=True):
                if not markers.get(name) and not self.done[fd]:  # no marker will come
                    self._emit(fd, self.hold[fd])
                    self.hold[fd] = b""
                    self.done[fd] = True
        return True

    def _ctrl(self) -> None:
        for kind, payload in self.ch._poll_ctrl():
            if kind == cells.CELL_RESULT:
                self.meta = json.loads(payload)
            elif kind == protocol.ART:
                self.arts.append(payload)
            elif kind == cells.END:
                self.meta = dict(
                    json.loads(payload),
                    ended=True,
                    artifacts=[],
                    outputs=[],
                    metrics={"wall_ms": 0, "cpu_ms": 0, "memory_peak_bytes": 0},
                )

    def _read(self, sel: selectors.BaseSelector, fd: int) -> None:
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        if not data:
            sel.unregister(fd)
            self._emit(fd, self.hold[fd])
            self.hold[fd] = b""
            self.done[fd] = True
            return
        self._take(fd, data)

    def _take(self, fd: int, data: bytes) -> None:
        window = self.hold[fd] + data
        at = window.find(self.marker)
        if at >= 0:
            self._emit(fd, window[:at])
            self.hold[fd] = b""
            self.done[fd] = True
            # What came after the marker belongs to the next cell: at most one read's worth is
            # kept, and the stream is not read again this cell, so a writer flooding past a
            # (forged) marker is held back by the pipe, not buffered here.
            self.ch._carry[fd] = window[at + len(self.marker) :]
            if self.sel is not None and fd in self.sel.get_map():
                self.sel.unregister(fd)
            return
        # Hold back only a tail that could be the start of a split marker (the marker starts
        # with a NUL byte): everything else goes to the caller as it arrives.
        keep = 0
        start = window.rfind(self.marker[:1], max(0, len(window) - len(self.marker) + 1))
        if start >= 0 and self.marker.startswith(window[start:]):
            keep = len(window) - start
        self._emit(fd, window[: len(window) - keep])
        self.hold[fd] = window[len(window) - keep :]

    def _emit(self, fd: int, data: bytes) -> None:
        if data:
            self.output.add(self.stream[fd], data)
