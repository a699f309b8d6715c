"""The supervisor's side of a session: one long-lived program in the same jail as a run, fed one
cell at a time.

The slot is staged exactly as for a run (cgroup, namespaces, root, init, contained program);
the request says `session`, and the program starts IPython (see `kernel`) instead of running
code once. Once it is ready, the supervisor hands the host the write end of the program's
cell pipe (with SRDY) and closes its own: the host sends each cell's code to the program
directly, one process hop less per cell. Then, until the host closes the control socket:
  CELL  a cell has started (the host sends this right after the code, with the cell's id that
        its report must echo): its wall and CPU time are watched from here (CPU used before
        it counts as between cells): past either, the cell is interrupted (SIGINT,
        KeyboardInterrupt in the cell); if it has not answered within GRACE_S, the whole
        session is killed. INT (from the host: the output cap, or a caller's interrupt, sent
        again every RESEND_S until the cell stops) does the same.
  FOP   a files API call, done here with `wsfiles` (the program is not involved); a write
        or rename is followed by a FILE frame with its data (a rename's: the target path).
Each cell answers with CRES (the program's report, checked, plus metrics and the files the
cell created or changed). When the program dies (OOM, a forbidden syscall, os._exit), the
cell's result says so with `ended`, or END says so between cells, and the supervisor exits.

The program runs the user's code in its own process, so everything it sends is forged until
proven otherwise: reports are size-capped before they are parsed, outputs are counted here
against the cell's budget, and anything off-protocol (bytes between cells, unknown frames, a
closed report pipe) ends the session. CPU used between cells (a thread a cell left spinning)
is watched too: more than one cell's `cpu_s` ends the session. Memory and pids limits are the
session's; its cgroup holds every cell. Standard library only.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from . import artifacts, jail, kernel, outcome, protocol, wsfiles

if TYPE_CHECKING:
    from .supervisor import Supervisor

GRACE_S = 2.0  # how long an interrupted cell has to stop before the session is killed
RESEND_S = 0.1  # how often a caller's interrupt is sent again until the cell stops
STATUS_WAIT_S = 5.0  # for a program's wait status once its pipes have closed
HELLO_TIMEOUT_S = 60.0
IDLE_CHECK_S = 1.0  # how often CPU used between cells is looked at
CELL_WAIT_S = 1.0  # a report before its cell's CELL: how long CELL may take to follow
REPORT_EOF_GRACE_S = 1.0  # a closed report pipe with the interpreter still alive is sabotage
MAX_REPORT_JSON = 256 * 1024  # a cell's report without its outputs
MAX_REPORT_FRAMES = 2 * kernel.MAX_OUTPUTS + 16  # outputs past the cap are dropped in-jail
CELL, INT, FOP = b"CELL", b"INT ", b"FOP "
SESSION_READY, CELL_RESULT, FILE_RESULT, END = b"SRDY", b"CRES", b"FRES", b"END "
LIMIT_STATUSES = ("timeout", "cpu_limit", "output_limit")


@dataclass
class _Cell:
    nonce: str  # the host's id of the cell: its report must carry it
    started: float
    deadline: float
    cpu_base: int
    cpu_limit_ns: float
    oom_base: int
    next_cpu_check: float
    timeout_s: float
    cpu_s: float
    reason: str | None = None  # why it was interrupted
    interrupted_at: float = 0.0
    resend_at: float = 0.0  # when to send the interrupt again (0: never)
    outputs: list[dict[str, str]] = field(default_factory=list)
    outputs_bytes: int = 0
    outputs_truncated: bool = False
    report_frames: int = 0


class _Ended(Exception):
    """The session is over; the supervisor cleans up and exits."""


class SessionSupervisor:
    def __init__(self, sup: Supervisor, spec: jail.RunSpec, files: list[tuple[str, bytes]]) -> None:
        assert sup.cg is not None
        self.sup = sup
        self.cg = sup.cg
        self.spec = spec
        self.files = files
        self.ctrl = sup.ctrl
        self.outputs_cap = kernel.outputs_cap(spec.artifact_bytes)
        self.reader = protocol.FrameReader(self.outputs_cap + MAX_REPORT_JSON)
        self.seen: dict[bytes, artifacts.FileState] = {}
        self.inputs: dict[str, tuple[int, int]] = {}
        self.cell: _Cell | None = None
        self.program_fd = -1
        self.delivered = True  # whether the session's request went into the program's pipe
        self.ncpu = max(1, len(os.sched_getaffinity(0)))
        self.idle_cpu_base = 0
        self.report_closed_at = 0.0
        self.poller = select.poll()

    # ---- set-up -------------------------------------------------------------------------------

    def serve(self) -> None:
        with jail.step("apply limits"):
            self.cg.set_limits(self.spec.memory_bytes, self.spec.pids)
        jail.size_scratch(self.spec)
        self.inputs = jail.place_inputs(self.files)
        self.files = []
        self.cg.reset_memory_peak()
        go = json.dumps(
            {"mode": "session", "spec": asdict(self.spec), "token": os.urandom(16).hex()}
        ).encode()
        try:
            protocol.send_all(self.sup.go_w, protocol.frame(protocol.REQ, go))
        except BrokenPipeError:
            self.delivered = False  # the program is gone: its status says how
        os.set_blocking(self.sup.err_r, False)
        # The heavy zygote writes the program's wait status here when it ends (or closes it,
        # should the zygote itself die): readable means the program is gone.
        self.ended_fd = self.sup.status_r
        try:
            if not self._wait_hello():
                return
            self._hand_over_cells()
            self.idle_cpu_base = self.cg.cpu_ns()
            self._loop()
        finally:
            if self.program_fd >= 0:
                os.close(self.program_fd)

    def _wait_hello(self) -> bool:
        deadline = time.monotonic() + HELLO_TIMEOUT_S
        poller = select.poll()
        poller.register(self.sup.err_r, select.POLLIN)
        poller.register(self.ended_fd, select.POLLIN)
        while time.monotonic() < deadline:
            for fd, _ in poller.poll(1000):
                if fd == self.sup.err_r:
                    try:
                        reports = self._read_reports()
                    except EOFError:  # the program is gone: its status follows
                        select.select([self.ended_fd], [], [], STATUS_WAIT_S)
                    else:
                        if self._hello(reports):
                            return True
                        continue
                self._ended_before_hello()
                return False
        raise jail.JailError(f"session interpreter did not start within {HELLO_TIMEOUT_S:g} s")

    def _hello(self, reports: list[tuple[bytes, bytes]]) -> bool:
        """Whether the program said it is ready (HELLO); raises when it could not start."""
        for kind, payload in reports:
            if kind == kernel.FAILED:
                raise jail.JailError(
                    "session interpreter failed to start: "
                    + str(json.loads(payload).get("message"))[:2000]
                )
            if kind == kernel.HELLO:
                pid = json.loads(payload)["pid"]
                # /proc here is the session's own pid namespace: this descriptor names the
                # program for pidfd_send_signal, and never another process.
                self.program_fd = os.open(
                    f"/proc/{int(pid)}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
                )
                return True
        return False

    def _ended_before_hello(self) -> None:
        if not self.sup.request_untaken(self.delivered):
            self._program_ended()
            return
        # Killed before it took the session's request: nothing of it ran, and the host may
        # start the session in another slot.
        self.sup.end_init()
        protocol.send_all(self.ctrl, protocol.frame(protocol.LOST, b""))

    def _hand_over_cells(self) -> None:
        """SRDY, carrying the cell pipe's write end: from now on the host writes the cells."""
        socket.send_fds(
            self.sup.ctrl_sock, [protocol.json_frame(SESSION_READY, {})], [self.sup.go_w]
        )
        self.sup.close_go()

    def _read_reports(self) -> list[tuple[bytes, bytes]]:
        """Frames from the program; raises EOFError when it closed the report pipe and
        ValueError when it wrote a frame past the cap."""
        try:
            data = os.read(self.sup.err_r, 1 << 20)
        except BlockingIOError:
            return []
        if not data:
            raise EOFError("report pipe closed")
        return self.reader.feed(data)

    # ---- the loop -----------------------------------------------------------------------------

    def _loop(self) -> None:
        for fd in (self.ctrl, self.sup.err_r, self.ended_fd):
            self.poller.register(fd, select.POLLIN)
        while True:
            timeout_ms = max(1, int((self._next_timer() - time.monotonic()) * 1000) + 1)
            ready = dict(self.poller.poll(timeout_ms))
            if self.ended_fd in ready:
                self._program_ended()
                return
            if self.ctrl in ready and not self._take_command():
                return  # the host closed the session
            if self.sup.err_r in ready:
                self._reports()
            self._check_timers()

    def _take_command(self) -> bool:
        """One frame from the host; False when it closed the control socket."""
        try:
            kind, payload = protocol.read_frame(self.ctrl)
        except EOFError:
            return False
        self._command(kind, payload)
        return True

    def _reports(self) -> None:
        frames: list[tuple[bytes, bytes]] = []
        try:
            frames = self._read_reports()
        except EOFError:
            # Usually the interpreter died (its init exits next and says how); if it is still
            # alive a moment later, the code closed the channel itself.
            self.poller.unregister(self.sup.err_r)
            self.report_closed_at = time.monotonic()
        except ValueError:
            self._corrupt("the interpreter sent a report larger than the outputs budget")
        for kind, payload in frames:
            cell = self.cell
            if cell is None and select.select([self.ctrl], [], [], CELL_WAIT_S)[0]:
                # The host sends CELL right after the code: a quick cell can report first.
                if not self._take_command():
                    raise _Ended
                cell = self.cell
            if cell is None:
                self._corrupt("the interpreter reported while no cell was running")
                return
            cell.report_frames += 1
            if cell.report_frames > MAX_REPORT_FRAMES:
                self._corrupt("the interpreter sent more reports than a cell can have")
            if kind == kernel.OUTPUT:
                self._take_output(cell, payload)
            elif kind == kernel.CELL_REPORT:
                self._finish_cell(payload)
            else:
                self._corrupt(f"the interpreter sent an unknown report {kind!r}")

    def _take_output(self, cell: _Cell, payload: bytes) -> None:
        mime, sep, data = payload.partition(b"\0")
        if (
            not sep
            or len(cell.outputs) >= kernel.MAX_OUTPUTS
            or cell.outputs_bytes + len(data) > self.outputs_cap
        ):
            cell.outputs_truncated = True
            return
        cell.outputs_bytes += len(data)
        cell.outputs.append({"mime_type": _text(mime[:200]), "data": _text(data)})

    def _next_timer(self) -> float:
        cell = self.cell
        if self.report_closed_at:
            return self.report_closed_at + REPORT_EOF_GRACE_S
        if cell is None:
            return time.monotonic() + IDLE_CHECK_S
        if cell.reason is not None:
            return min(cell.interrupted_at + GRACE_S, cell.resend_at or float("inf"))
        return min(cell.deadline, cell.next_cpu_check)

    def _check_timers(self) -> None:
        cell = self.cell
        now = time.monotonic()
        if self.report_closed_at and now >= self.report_closed_at + REPORT_EOF_GRACE_S:
            self._corrupt("the interpreter closed its report channel")
        if cell is None:
            used = self.cg.cpu_ns() - self.idle_cpu_base
            if used >= self.spec.cpu_s * 1e9:
                self._end_between_cells(
                    "cpu_limit",
                    "CPULimitExceeded",
                    (
                        f"processes or threads left running by earlier cells used more than "
                        f"cpu_s={self.spec.cpu_s:g} s of CPU between cells; the session was ended"
                    ),
                )
            return
        if cell.reason is not None:
            if now >= cell.interrupted_at + GRACE_S:
                self._kill_unresponsive()
            elif cell.resend_at and now >= cell.resend_at:
                cell.resend_at = now + RESEND_S
                self._signal_program()
            return
        if now >= cell.deadline:
            self._interrupt("timeout")
        elif now >= cell.next_cpu_check:
            used = self.cg.cpu_ns() - cell.cpu_base
            if used >= cell.cpu_limit_ns:
                self._interrupt("cpu_limit")
            else:
                cell.next_cpu_check = now + max(0.01, (cell.cpu_limit_ns - used) / 1e9 / self.ncpu)

    def _command(self, kind: bytes, payload: bytes) -> None:
        if kind == CELL:
            if self.cell is not None:
                raise jail.JailError("protocol: a cell arrived while another one runs")
            req = json.loads(payload)
            timeout_s, cpu_s = float(req["timeout_s"]), float(req["cpu_s"])
            now = time.monotonic()
            # The host wrote the code just before this frame, so the program may be some
            # microseconds into the cell already: its limits are measured from here.
            oom_base = self.cg.oom_kills()
            self.cg.reset_memory_peak()
            self.cell = _Cell(
                nonce=str(req.get("cell")),
                started=now,
                deadline=now + timeout_s,
                cpu_base=self.cg.cpu_ns(),
                cpu_limit_ns=cpu_s * 1e9,
                oom_base=oom_base,
                next_cpu_check=now + cpu_s / self.ncpu,
                timeout_s=timeout_s,
                cpu_s=cpu_s,
            )
        elif kind == INT:
            if self.cell is not None and self.cell.reason is None:
                self._interrupt(payload.decode("ascii", "replace") or "interrupted")
        elif kind == FOP:
            self._file_op(json.loads(payload))
        else:
            raise jail.JailError(f"protocol: unexpected frame {kind!r} in a session")

    def _interrupt(self, reason: str) -> None:
        cell = self.cell
        if cell is None:
            return
        cell.reason = reason
        cell.interrupted_at = time.monotonic()
        if reason not in LIMIT_STATUSES:
            # Asked for by the caller, maybe as the cell began: a SIGINT that reaches the
            # interpreter before it has taken the cell is ignored, so it is sent again.
            cell.resend_at = cell.interrupted_at + RESEND_S
        self._signal_program()

    def _signal_program(self) -> None:
        try:
            signal.pidfd_send_signal(self.program_fd, signal.SIGINT)
        except ProcessLookupError:
            pass

    # ---- results ------------------------------------------------------------------------------

    def _metrics(self, cell: _Cell) -> dict[str, Any]:
        return {
            "wall_ms": round((time.monotonic() - cell.started) * 1000, 3),
            "cpu_ms": round((self.cg.cpu_ns() - cell.cpu_base) / 1e6, 3),
            "memory_peak_bytes": self.cg.memory_peak(),
        }

    def _cell_spec(self, cell: _Cell | None) -> jail.RunSpec:
        if cell is None:
            return self.spec
        return jail.RunSpec(
            **{**asdict(self.spec), "timeout_s": cell.timeout_s, "cpu_s": cell.cpu_s}
        )

    def _finish_cell(self, payload: bytes) -> None:
        cell = self.cell
        assert cell is not None

        metrics = self._metrics(cell)
        report: dict[str, Any] = {}
        if len(payload) <= MAX_REPORT_JSON:
            try:
                parsed = json.loads(payload)
                report = parsed if isinstance(parsed, dict) else {}
            except Exception:  # noqa: BLE001 - forged: deep nesting, bad JSON, anything
                report = {}
        if report.get("cell") != cell.nonce:
            # Not this cell's answer: one forged before the cell began (a thread an earlier
            # cell left), or a second one for an earlier cell (a forked copy of the loop).
            # Taking it would give this cell another's result, and every later cell too.
            self._corrupt("the interpreter sent a report that is not this cell's")
        raw_error = report.get("error")
        error = outcome.clean_error(raw_error if isinstance(raw_error, dict) else None)
        if error is not None:
            error = {k: _scrub(v) if isinstance(v, str) else v for k, v in error.items()}
        meta: dict[str, Any]
        if error is None and report.get("status") == "ok":
            meta = {"status": "ok", "exit_code": None, "signal": None, "error": None}
        else:
            meta = {
                "status": "error",
                "exit_code": None,
                "signal": None,
                "error": error
                or {
                    "type": "SessionError",
                    "line": None,
                    "column": None,
                    "traceback": None,
                    "message": "the cell failed without a readable report",
                },
            }
        if cell.reason in LIMIT_STATUSES:
            # Interrupted for a limit: that is how it ended, whatever the interpreter says
            # (a cell can catch KeyboardInterrupt and report success).
            limited = outcome.classify(self._cell_spec(cell), cell.reason, None, error, 0, 0.0, [])
            meta.update(status=limited["status"], error=limited["error"])
            meta["error"]["message"] += "; the cell was interrupted and the session goes on"
        elif error is not None and any(
            text in error["message"].lower()
            for text in ("no space left on device", "file too large")
        ):  # ENOSPC; EFBIG: RLIMIT_FSIZE (Python says "No space", Node "ENOSPC: no space")
            full = [path for path, _ in jail.SCRATCH if outcome.disk_full(path)]
            meta.update(
                status="disk_limit",
                error=dict(
                    error,
                    type="DiskLimitExceeded",
                    message=(
                        f"disk limit of {self.spec.disk_bytes >> 20} MiB reached in "
                        f"{', '.join(full) or 'the workspace'}; raise limits.disk_mib "
                        f"({error['type']}: {error['message']})"
                    ),
                ),
            )
        elif meta["status"] == "error" and self.cg.oom_kills() > cell.oom_base:
            meta.update(
                status="memory_limit",
                error={
                    "type": "MemoryLimitExceeded",
                    "line": None,
                    "column": None,
                    "traceback": error.get("traceback") if error else None,
                    "message": f"memory limit of {self.spec.memory_bytes >> 20} MiB exceeded in "
                    "the session (a process was killed); raise limits.memory_mib",
                },
            )
        markers = report.get("markers")
        meta["markers"] = (
            {k: markers.get(k) is True for k in ("stdout", "stderr")}
            if isinstance(markers, dict)
            else {"stdout": False, "stderr": False}
        )
        cell.outputs_truncated = cell.outputs_truncated or report.get("outputs_truncated") is True
        self._send_cell_result(cell, meta, metrics)

    def _send_cell_result(
        self, cell: _Cell, meta: dict[str, Any], metrics: dict[str, Any], ended: bool = False
    ) -> None:
        collected, art_truncated = artifacts.collect(
            "/workspace",
            set(self.inputs.values()),
            self.spec.artifact_files,
            self.spec.artifact_bytes,
            seen=self.seen,
        )
        meta.setdefault("markers", {"stdout": False, "stderr": False})
        meta.update(
            metrics=metrics,
            outputs=cell.outputs,
            outputs_truncated=cell.outputs_truncated,
            artifacts=[{k: v for k, v in asdict(a).items() if k != "data"} for a in collected],
            artifacts_truncated=art_truncated,
            ended=ended,
        )
        if self.inputs:
            meta["inputs_read"] = jail.inputs_read(self.inputs)
        if self.cg.unenforced():
            meta["unenforced_limits"] = self.cg.unenforced()
        protocol.send_all(self.ctrl, protocol.json_frame(CELL_RESULT, meta))
        for art in collected:
            protocol.send_all(self.ctrl, protocol.frame(protocol.ART, art.data))
        self.cell = None
        self.idle_cpu_base = self.cg.cpu_ns()

    def _kill_unresponsive(self) -> None:
        cell = self.cell
        assert cell is not None

        self.sup.end_init()
        metrics = self._metrics(cell)
        reason = cell.reason if cell.reason in LIMIT_STATUSES else "timeout"
        meta = outcome.classify(self._cell_spec(cell), reason, None, None, 0, 0.0, [])
        meta["error"]["message"] += (
            f"; the cell did not stop within {GRACE_S:g} s of the "
            "interrupt, so the session was ended"
        )
        self._send_cell_result(cell, meta, metrics, ended=True)
        raise _Ended

    def _corrupt(self, why: str) -> None:
        """The code broke the interpreter's side of the protocol: end the session."""
        self._end_between_cells("error", "SessionError", f"{why}; the session was ended")

    def _end_between_cells(self, status: str, kind: str, message: str) -> None:
        os.kill(self.sup.init_pid, signal.SIGKILL)
        meta = {
            "status": status,
            "exit_code": None,
            "signal": "SIGKILL",
            "error": {
                "type": kind,
                "message": message,
                "line": None,
                "column": None,
                "traceback": None,
            },
        }
        if self.cell is not None:
            self._send_cell_result(self.cell, meta, self._metrics(self.cell), ended=True)
        else:
            protocol.send_all(self.ctrl, protocol.json_frame(END, meta))
        raise _Ended

    def _program_ended(self) -> None:
        """The program is gone, and with it the session: end the rest of it (init and whatever
        the program left running) and say how it ended."""

        wait_status, init_error = outcome.read_status(self.sup.status_r)
        self.sup.end_init()
        if init_error:
            raise jail.JailError(init_error)
        cell = self.cell
        cpu_ms = (self.cg.cpu_ns() - cell.cpu_base) / 1e6 if cell else 0.0
        oom = self.cg.oom_kills() - (cell.oom_base if cell else 0)
        meta = outcome.classify(self._cell_spec(cell), None, wait_status, None, oom, cpu_ms, [])
        if meta["status"] == "ok" or meta["error"] is None:
            meta["status"] = "error" if meta["status"] == "ok" else meta["status"]
            meta["error"] = {
                "type": "SessionEnded",
                "line": None,
                "column": None,
                "traceback": None,
                "message": "the session's interpreter exited",
            }
        meta["error"]["message"] += "; the session has ended"
        if cell is not None:
            self._send_cell_result(cell, meta, self._metrics(cell), ended=True)
        else:
            protocol.send_all(self.ctrl, protocol.json_frame(END, meta))

    # ---- files ----------------------------------------------------------------------------------

    def _file_op(self, req: dict[str, Any]) -> None:
        op, path = req.get("op"), req.get("path", "")
        room = self.spec.disk_bytes + self.spec.input_bytes
        data = b""
        try:
            if op == "write":
                kind, blob = protocol.read_frame(self.ctrl, max_len=room + (1 << 20))
                if kind != protocol.FILE:
                    raise jail.JailError("protocol: a write without its data")
                info = wsfiles.write(path, blob, self.sup.uid)
                # The caller put it there: it is not something a cell made.
                self.seen[artifacts.state_key(path)] = (
                    info["inode"],
                    info["size"],
                    info["mtime_ns"],
                )
                answer: dict[str, Any] = {"ok": True, "size": info["size"]}
            elif op == "read":
                data = wsfiles.read(path, room)
                answer = {"ok": True, "size": len(data)}
            elif op == "remove":
                wsfiles.remove(path)
                answer = {"ok": True}
            elif op == "rmtree":
                wsfiles.remove_tree(path)
                answer = {"ok": True}
            elif op == "mkdir":
                answer = {"ok": True, "created": wsfiles.make_dir(path, self.sup.uid)}
            elif op == "rename":  # the target path comes as the call's data
                kind, blob = protocol.read_frame(self.ctrl, max_len=1 << 16)
                if kind != protocol.FILE:
                    raise jail.JailError("protocol: a rename without its target")
                for old, new in wsfiles.rename(path, blob.decode("utf-8", "replace"), self.sup.uid):
                    # Moved by the caller, not made by a cell: not an artifact of the next one.
                    state = self.seen.pop(artifacts.state_key(old), None)
                    if state is not None:
                        self.seen[artifacts.state_key(new)] = state
                answer = {"ok": True}
            elif op == "usage":
                disk = os.statvfs(wsfiles.ROOT)
                answer = {
                    "ok": True,
                    "cpu_ns": self.cg.cpu_ns(),
                    "memory_bytes": self.cg.memory_bytes(),
                    "memory_cache_bytes": self.cg.file_bytes(),
                    "disk_bytes": (disk.f_blocks - disk.f_bfree) * disk.f_frsize,
                    "disk_total_bytes": disk.f_blocks * disk.f_frsize,
                }
            elif op == "list":
                entries, dirs, truncated = wsfiles.listing(artifacts.MAX_ENTRIES, room)
                answer = {"ok": True, "entries": entries, "dirs": dirs, "truncated": truncated}
            else:
                answer = {"ok": False, "error": f"unknown file operation {op!r}"}
        except wsfiles.FileOpError as exc:
            answer = {"ok": False, "error": str(exc)}
        protocol.send_all(self.ctrl, protocol.json_frame(FILE_RESULT, answer))
        if answer.get("ok") and op == "read":
            protocol.send_all(self.ctrl, protocol.frame(protocol.FILE, data))


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _scrub(text: str) -> str:
    """Text that JSON can carry and every encoder accepts (no lone surrogates)."""
    return text.encode("utf-8", "replace").decode("utf-8")


def serve(sup: Supervisor, spec: jail.RunSpec, files: list[tuple[str, bytes]]) -> None:
    """Run the session until the host closes it or the program dies."""
    try:
        SessionSupervisor(sup, spec, files).serve()
    except _Ended:
        pass
