"""Moving a run's bytes: the code and stdin in, stdout and stderr out (kept up to the cap and
handed to the caller as they arrive), the supervisor's result and artifacts back.

Output caps are enforced while streaming: past the cap the bytes are read and dropped, and the
supervisor is told to end the run (a session's cell: interrupted), so the host never buffers
more than the cap.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import select
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from ..inside import protocol
from .errors import HostError, RunNotStarted
from .slot import Slot, write_some

CHUNK = 65536  # what one read of an output pipe takes
STDOUT, STDERR = 0, 1

OutputCallback = Callable[[bytes], None]


@dataclass
class RawRun:
    meta: dict[str, Any]
    # None: the artifact's bytes were spooled to `<spool_dir>/<its index>` (see `execute`)
    artifact_data: Sequence[bytes | None] = field(default_factory=list)
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    # A run with a network allowlist: its proxy's log, and the limit it passed (if it did).
    network_log: list[dict[str, Any]] = field(default_factory=list)
    network_limit: str | None = None


class CappedOutput:
    """A run's or a cell's stdout and stderr, each kept up to `cap` bytes and handed to its
    callback as it arrives; past the cap the rest is dropped and `on_over` is called once (the
    pump ends the run, or interrupts the cell).

    The callbacks must not raise: the pipeline hands over the caller's behind its guard
    (`scrub.live_output`), which lets the run go on to its end and raises once it is recorded."""

    def __init__(
        self,
        cap: int,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        on_over: Callable[[], None],
    ) -> None:
        self.cap = cap
        self.kept = (bytearray(), bytearray())
        self.truncated = [False, False]
        self.callbacks = (on_stdout, on_stderr)
        self._on_over = on_over
        self._over = False

    def add(self, stream: int, data: bytes) -> None:
        """`data` read from `stream` (STDOUT or STDERR)."""
        buf = self.kept[stream]
        room = self.cap - len(buf)
        if room > 0:
            keep = data[:room]
            buf += keep
            callback = self.callbacks[stream]
            if callback is not None:
                callback(keep)
        if len(data) > room:
            self.truncated[stream] = True
            if not self._over:
                self._over = True
                self._on_over()

    def result(self, meta: dict[str, Any], artifact_data: Sequence[bytes | None]) -> RawRun:
        return RawRun(
            meta,
            artifact_data,
            bytes(self.kept[STDOUT]),
            bytes(self.kept[STDERR]),
            self.truncated[STDOUT],
            self.truncated[STDERR],
        )


class RunPump:
    """Moves bytes between the host and one run until the supervisor reports."""

    def __init__(
        self,
        slot: Slot,
        go: bytes,
        stdin: bytes,
        cap: int,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        max_frame: int,
        spool_dir: str | None = None,
        go_lost: bool = False,
    ) -> None:
        self.slot = slot
        ctrl, stdout_r, stderr_r = slot.ctrl, slot.stdout_r, slot.stderr_r
        self.ctrl = ctrl
        # What is still to be written: the code (on the short way) and stdin, each pipe
        # closed once written.
        self.writes = {
            fd: memoryview(data) for fd, data in ((slot.go_w, go), (slot.stdin_w, stdin)) if fd >= 0
        }
        self.output = CappedOutput(cap, on_stdout, on_stderr, lambda: slot.end_run("output_limit"))
        self.stream = {stdout_r: STDOUT, stderr_r: STDERR}
        self.stdout_r, self.stderr_r = stdout_r, stderr_r
        self.spool_dir = spool_dir
        # Spool files opened and not yet closed, in frame order (one feed may end several).
        self.spooling: collections.deque[BinaryIO] = collections.deque()
        self.spooled = 0  # artifacts spooled so far: the next one's file name
        self.reader = protocol.FrameReader(max_frame, self._spill if spool_dir else None)
        self.meta: dict[str, Any] | None = None
        self.error: str | None = None
        self.arts: list[bytes | None] = []
        # The program was gone before it took its code: the go pipe had no reader (seen when
        # the request was sent or here, on the short way), or the supervisor says so (LOST).
        self.go_lost = go_lost
        self.lost = False

    def run(self, backstop: float) -> RawRun:
        try:
            return self._run(backstop)
        finally:
            for file in self.spooling:  # the run ended in the middle of an artifact
                with contextlib.suppress(OSError):
                    file.close()

    def _spill(self, kind: bytes) -> BinaryIO | None:
        """An artifact's frame goes to the spool file named by its index."""
        if kind != protocol.ART or self.spool_dir is None:
            return None
        fd = os.open(
            os.path.join(self.spool_dir, str(self.spooled)),
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
        )
        self.spooled += 1
        file = open(fd, "wb")  # noqa: SIM115 - closed when its frame ends
        self.spooling.append(file)
        return file

    def _run(self, backstop: float) -> RawRun:
        sel = Poll()
        for fd in (self.stdout_r, self.stderr_r, *self.writes):
            os.set_blocking(fd, False)
        self.ctrl.setblocking(False)
        ctrl = self.ctrl.fileno()
        sel.register(self.stdout_r, select.POLLIN)
        sel.register(self.stderr_r, select.POLLIN)
        sel.register(ctrl, select.POLLIN)
        for fd in list(self.writes):
            sel.register(fd, select.POLLOUT)
            self._feed(sel, fd)  # the code and small input fit the pipe: no wait for them
        while sel.fds:
            if self._complete() and self.stdout_r not in sel.fds and self.stderr_r not in sel.fds:
                break  # the result is in and output has ended: teardown is not our wait
            left = backstop - time.monotonic()
            if left <= 0:
                self.slot.kill()
                raise HostError("the run supervisor did not finish in time")
            for fd, _events in sel.poll(min(left, 1.0)):
                if fd in self.writes:
                    self._feed(sel, fd)
                elif fd == ctrl:
                    self._read_ctrl(sel)
                else:
                    self._read_output(sel, fd)
        if self.error is not None:
            raise HostError(self.error)
        # The host saw the go pipe without a reader; the supervisor, which did not, reports
        # that program's end as a SIGKILL (a memory_limit when its own limit killed it).
        killed = self.meta is not None and (self.meta.get("status"), self.meta.get("signal")) == (
            "error",
            "SIGKILL",
        )
        if self.lost or (self.go_lost and killed):
            # The slot is closed: whatever killed its program may have broken more of it.
            raise RunNotStarted("the run slot's program was gone before it took the code")
        if self.meta is None:
            raise HostError("the run supervisor exited without a result")
        n = len(self.meta.get("artifacts", []))
        if len(self.arts) != n:
            raise HostError(f"the run supervisor sent {len(self.arts)} of {n} artifacts")
        self.slot.reusable = True
        return self.output.result(self.meta, self.arts)

    def _complete(self) -> bool:
        if self.error is not None or self.lost:
            return True
        return self.meta is not None and len(self.arts) >= len(self.meta.get("artifacts", []))

    def _feed(self, sel: Poll, fd: int) -> None:
        data = self.writes[fd]
        if data:
            written = write_some(fd, data[: CHUNK * 4])
            if not written:
                return
            # The program closed the pipe or exited: the rest is not wanted either. A program
            # closes its go pipe only once it has read its code whole: gone before that, it
            # ran none of it.
            if written < 0 and fd == self.slot.go_w:
                self.go_lost = True
            data = data[:0] if written < 0 else data[written:]
            self.writes[fd] = data
        if not data:
            self._end_write(sel, fd)

    def _end_write(self, sel: Poll, fd: int) -> None:
        del self.writes[fd]
        sel.unregister(fd)
        if fd == self.slot.stdin_w:
            self.slot.close_stdin()
        else:
            self.slot.close_go()

    def _read_output(self, sel: Poll, fd: int) -> None:
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        if not data:
            sel.unregister(fd)
            return
        self.output.add(self.stream[fd], data)

    def _read_ctrl(self, sel: Poll) -> None:
        try:
            # Not more at once: a buffer past malloc's mmap threshold (128 KiB) is mapped and
            # unmapped for every call.
            data = self.ctrl.recv(CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            sel.unregister(self.ctrl.fileno())
            for fd in list(self.writes):
                self._end_write(sel, fd)
            return
        try:
            frames = self.reader.feed(data)
        except OSError as exc:  # the spool: disk full, or its directory gone
            self.error = f"could not spool an artifact: {exc}"
            sel.unregister(self.ctrl.fileno())
            return
        for kind, payload in frames:
            if kind == protocol.PID:
                self.slot.watch(json.loads(payload)["pid"])
            elif kind == protocol.RES:
                self.meta = json.loads(payload)
            elif kind == protocol.ART and self.spool_dir is not None:
                self._spooled()
            elif kind == protocol.ART:
                self.arts.append(payload)
            elif kind == protocol.ERR:
                self.error = "sandbox: " + json.loads(payload)["message"]
            elif kind == protocol.LOST:
                self.lost = True

    def _spooled(self) -> None:
        """An artifact is whole in its spool file: nothing of it is held here."""
        try:
            self.spooling.popleft().close()
        except OSError as exc:
            self.error = f"could not spool an artifact: {exc}"
        self.arts.append(None)


class Poll:
    """select.poll and the descriptors registered with it (a run's pump watches at most four:
    poll is the cheapest way to wait on so few)."""

    def __init__(self) -> None:
        self._poll = select.poll()
        self.fds: set[int] = set()

    def register(self, fd: int, events: int) -> None:
        self._poll.register(fd, events)
        self.fds.add(fd)

    def unregister(self, fd: int) -> None:
        self._poll.unregister(fd)
        self.fds.discard(fd)

    def poll(self, timeout_s: float) -> list[tuple[int, int]]:
        return self._poll.poll(max(0, int(timeout_s * 1000) + 1))
