"""The supervisor's side of a session: one long-lived program in the same jail as a run, fed one
cell at a time.

The slot is staged exactly as for a run (cgroup, namespaces, root, init, contained program);
the request says `session`, and the program starts IPython (see `kernel`) instead of running
code once. Then, until the host closes the control socket:
  CELL  forwarded to the program; its wall and CPU time are watched: past either, the cell is
        interrupted (SIGINT, KeyboardInterrupt in the cell); if it has not answered within
        GRACE_S, the whole session is killed. INT (from the host: output cap) does the same.
  FOP   a files API call, done here with `wsfiles` (the program is not involved).
Each cell answers with CRES (the program's report, checked, plus metrics and the files the
cell created or changed). When the program dies (OOM, a forbidden syscall, os._exit), the
cell's result says so with `ended`, or END says so between cells, and the supervisor exits.
Memory and pids limits are the session's; the session's cgroup holds every cell.
Standard library only.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from . import artifacts, jail, kernel, protocol, wsfiles

if TYPE_CHECKING:
    from .supervisor import Supervisor

GRACE_S = 2.0  # how long an interrupted cell has to stop before the session is killed
HELLO_TIMEOUT_S = 60.0
CELL, INT, FOP = b"CELL", b"INT ", b"FOP "
SESSION_READY, CELL_RESULT, FILE_RESULT, END = b"SRDY", b"CRES", b"FRES", b"END "
MAX_REPORT = protocol.MAX_JSON


@dataclass
class _Cell:
    started: float
    deadline: float
    cpu_base: int
    cpu_limit_ns: float
    oom_base: int
    next_cpu_check: float
    reason: str | None = None  # why it was interrupted
    interrupted_at: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class SessionSupervisor:
    def __init__(self, sup: Supervisor, spec: jail.RunSpec, files: list[tuple[str, bytes]]) -> None:
        assert sup.cg is not None
        self.sup = sup
        self.cg = sup.cg
        self.spec = spec
        self.files = files
        self.ctrl = sup.ctrl
        self.reader = protocol.FrameReader(MAX_REPORT)
        self.seen: dict[str, artifacts.FileState] = {}
        self.inputs: set[tuple[int, int]] = set()
        self.cell: _Cell | None = None
        self.program_fd = -1
        self.ncpu = max(1, len(os.sched_getaffinity(0)))

    # ---- set-up -------------------------------------------------------------------------------

    def serve(self) -> None:
        with jail.step("apply limits"):
            self.cg.set_limits(self.spec.memory_bytes, self.spec.pids)
        jail.size_scratch(self.spec)
        self.inputs = jail.place_inputs(self.files)
        self.files = []
        self.cg.reset_memory_peak()
        go = json.dumps({"mode": "session", "spec": asdict(self.spec),
                         "token": os.urandom(16).hex()}).encode()
        try:
            protocol.send_all(self.sup.go_w, protocol.frame(protocol.REQ, go))
        except BrokenPipeError:
            pass  # the program died in set-up: its status says why
        os.set_blocking(self.sup.err_r, False)
        # The heavy zygote writes the program's wait status here when it ends (or closes it,
        # should the zygote itself die): readable means the program is gone.
        self.ended_fd = self.sup.status_r
        try:
            if not self._wait_hello():
                return
            protocol.send_all(self.ctrl, protocol.json_frame(SESSION_READY, {}))
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
                if fd == self.ended_fd:
                    self._program_ended()
                    return False
                for kind, payload in self._read_reports():
                    if kind == kernel.FAILED:
                        raise jail.JailError("session interpreter failed to start: "
                                             + str(json.loads(payload).get("message"))[:2000])
                    if kind == kernel.HELLO:
                        pid = json.loads(payload)["pid"]
                        # /proc here is the session's own pid namespace: this descriptor names
                        # the program for pidfd_send_signal, and never another process.
                        self.program_fd = os.open(f"/proc/{int(pid)}", os.O_RDONLY
                                                  | os.O_DIRECTORY | os.O_CLOEXEC)
                        return True
        raise jail.JailError(f"session interpreter did not start within {HELLO_TIMEOUT_S:g} s")

    def _read_reports(self) -> list[tuple[bytes, bytes]]:
        try:
            data = os.read(self.sup.err_r, 1 << 20)
        except BlockingIOError:
            return []
        if not data:
            return []
        return self.reader.feed(data)

    # ---- the loop -----------------------------------------------------------------------------

    def _loop(self) -> None:
        poller = select.poll()
        for fd in (self.ctrl, self.sup.err_r, self.ended_fd):
            poller.register(fd, select.POLLIN)
        err_open = True
        while True:
            timeout_ms = -1
            if self.cell is not None:
                timeout_ms = max(1, int((self._next_timer() - time.monotonic()) * 1000) + 1)
            for fd, _ in poller.poll(timeout_ms):
                if fd == self.ended_fd:
                    self._program_ended()
                    return
                if fd == self.sup.err_r and err_open:
                    try:
                        frames = self._read_reports()
                    except ValueError:  # the code wrote garbage into the report channel
                        frames = []
                        poller.unregister(fd)
                        err_open = False
                        self._interrupt("corrupt")
                    for kind, payload in frames:
                        if kind == kernel.CELL_REPORT and self.cell is not None:
                            self._finish_cell(payload)
                elif fd == self.ctrl:
                    try:
                        kind, payload = protocol.read_frame(self.ctrl)
                    except EOFError:
                        return  # the host closed the session
                    self._command(kind, payload)
            if self.cell is not None:
                self._check_timers()

    def _next_timer(self) -> float:
        cell = self.cell
        assert cell is not None
        if cell.reason is not None:
            return cell.interrupted_at + GRACE_S
        return min(cell.deadline, cell.next_cpu_check)

    def _check_timers(self) -> None:
        cell = self.cell
        assert cell is not None
        now = time.monotonic()
        if cell.reason is not None:
            if now >= cell.interrupted_at + GRACE_S:
                self._kill_unresponsive()
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
            now = time.monotonic()
            timeout_s, cpu_s = float(req["timeout_s"]), float(req["cpu_s"])
            self.cg.reset_memory_peak()
            self.cell = _Cell(started=now, deadline=now + timeout_s, cpu_base=self.cg.cpu_ns(),
                              cpu_limit_ns=cpu_s * 1e9, oom_base=self.cg.oom_kills(),
                              next_cpu_check=now + cpu_s / self.ncpu,
                              extra={"timeout_s": timeout_s, "cpu_s": cpu_s})
            cell = json.dumps({"code": req["code"], "marker": req["marker"]}).encode()
            try:
                protocol.send_all(self.sup.go_w, protocol.frame(CELL, cell))
            except BrokenPipeError:
                pass  # the program is gone: its status reports that next
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
        try:
            signal.pidfd_send_signal(self.program_fd, signal.SIGINT)
        except ProcessLookupError:
            pass

    # ---- results ------------------------------------------------------------------------------

    def _metrics(self, cell: _Cell) -> dict[str, Any]:
        return {"wall_ms": round((time.monotonic() - cell.started) * 1000, 3),
                "cpu_ms": round((self.cg.cpu_ns() - cell.cpu_base) / 1e6, 3),
                "memory_peak_bytes": self.cg.memory_peak()}

    def _cell_spec(self, cell: _Cell) -> jail.RunSpec:
        return jail.RunSpec(**{**asdict(self.spec), "timeout_s": cell.extra["timeout_s"],
                               "cpu_s": cell.extra["cpu_s"]})

    def _finish_cell(self, payload: bytes) -> None:
        cell = self.cell
        assert cell is not None
        metrics = self._metrics(cell)
        try:
            report = json.loads(payload)
            if not isinstance(report, dict):
                raise ValueError("not an object")
        except ValueError:
            report = {"status": "error", "error": {
                "type": "SessionError", "message": "the cell's report was unreadable"}}
        from .supervisor import _clean_error, _is_full, classify

        error = _clean_error(report.get("error") if isinstance(report.get("error"), dict)
                             else None)
        meta: dict[str, Any]
        if error is None and report.get("status") == "ok":
            meta = {"status": "ok", "exit_code": None, "signal": None, "error": None}
        else:
            meta = {"status": "error", "exit_code": None, "signal": None,
                    "error": error or {"type": "SessionError", "line": None, "column": None,
                                       "traceback": None,
                                       "message": "the cell failed without an error record"}}
        interrupted = error is not None and error["type"] == "KeyboardInterrupt"
        if cell.reason in ("timeout", "cpu_limit", "output_limit") and interrupted:
            limited = classify(self._cell_spec(cell), cell.reason, None, error, 0, 0.0, [])
            meta.update(status=limited["status"], error=limited["error"])
            meta["error"]["message"] += "; the cell was interrupted and the session goes on"
        elif error is not None and any(text in error["message"] for text in (
                "No space left on device", "File too large")):  # ENOSPC; EFBIG: RLIMIT_FSIZE
            full = [path for path, _ in jail.SCRATCH if _is_full(path)]
            meta.update(status="disk_limit", error=dict(error, type="DiskLimitExceeded", message=(
                f"disk limit of {self.spec.disk_bytes >> 20} MiB reached in "
                f"{', '.join(full) or 'the workspace'}; raise limits.disk_mib "
                f"({error['type']}: {error['message']})")))
        elif meta["status"] == "error" and self.cg.oom_kills() > cell.oom_base:
            meta.update(status="memory_limit", error={
                "type": "MemoryLimitExceeded", "line": None, "column": None,
                "traceback": error.get("traceback") if error else None,
                "message": f"memory limit of {self.spec.memory_bytes >> 20} MiB exceeded in "
                           "the session (a process was killed); raise limits.memory_mib"})
        self._send_cell_result(cell, meta, metrics, report)

    def _send_cell_result(self, cell: _Cell, meta: dict[str, Any], metrics: dict[str, Any],
                          report: dict[str, Any], ended: bool = False) -> None:
        collected, art_truncated = artifacts.collect(
            "/workspace", self.inputs, self.spec.artifact_files, self.spec.artifact_bytes,
            seen=self.seen)
        markers = report.get("markers")
        meta.update(
            metrics=metrics, outputs=_clean_outputs(report.get("outputs")),
            outputs_truncated=bool(report.get("outputs_truncated")),
            markers={k: bool(markers.get(k)) for k in ("stdout", "stderr")}
            if isinstance(markers, dict) else {"stdout": False, "stderr": False},
            artifacts=[{k: v for k, v in asdict(a).items() if k != "data"} for a in collected],
            artifacts_truncated=art_truncated, ended=ended,
        )
        protocol.send_all(self.ctrl, protocol.json_frame(CELL_RESULT, meta))
        for art in collected:
            protocol.send_all(self.ctrl, protocol.frame(protocol.ART, art.data))
        self.cell = None

    def _kill_unresponsive(self) -> None:
        cell = self.cell
        assert cell is not None
        from .supervisor import classify

        self.sup.end_init()
        metrics = self._metrics(cell)
        reason = cell.reason if cell.reason in ("timeout", "cpu_limit", "output_limit") \
            else "timeout"
        meta = classify(self._cell_spec(cell), reason, None, None, 0, 0.0, [])
        meta["error"]["message"] += (f"; the cell did not stop within {GRACE_S:g} s of the "
                                     "interrupt, so the session was ended")
        self._send_cell_result(cell, meta, metrics, {}, ended=True)
        raise _Ended

    def _program_ended(self) -> None:
        """The program is gone, and with it the session: end the rest of it (init and whatever
        the program left running) and say how it ended."""
        from .supervisor import _read_status, classify

        wait_status, init_error = _read_status(self.sup.status_r)
        self.sup.end_init()
        if init_error:
            raise jail.JailError(init_error)
        cell = self.cell
        spec = self._cell_spec(cell) if cell else self.spec
        cpu_ms = (self.cg.cpu_ns() - cell.cpu_base) / 1e6 if cell else 0.0
        oom = self.cg.oom_kills() - (cell.oom_base if cell else 0)
        meta = classify(spec, None, wait_status, None, oom, cpu_ms, [])
        if meta["status"] == "ok" or meta["error"] is None:
            meta["status"] = "error" if meta["status"] == "ok" else meta["status"]
            meta["error"] = {"type": "SessionEnded", "line": None, "column": None,
                             "traceback": None, "message": "the session's interpreter exited"}
        meta["error"]["message"] += "; the session has ended"
        if cell is not None:
            self._send_cell_result(cell, meta, self._metrics(cell), {}, ended=True)
        else:
            protocol.send_all(self.ctrl, protocol.json_frame(END, meta))

    # ---- files ----------------------------------------------------------------------------------

    def _file_op(self, req: dict[str, Any]) -> None:
        op, path = req.get("op"), req.get("path", "")
        data = b""
        try:
            if op == "write":
                kind, blob = protocol.read_frame(self.ctrl, max_len=1 << 34)
                if kind != protocol.FILE:
                    raise jail.JailError("protocol: a write without its data")
                info = wsfiles.write(path, blob)
                # The caller put it there: it is not something a cell made.
                self.seen[path] = (info["inode"], info["size"], info["mtime_ns"])
                answer: dict[str, Any] = {"ok": True, "size": info["size"]}
            elif op == "read":
                data = wsfiles.read(path, self.spec.disk_bytes + self.spec.input_bytes)
                answer = {"ok": True, "size": len(data)}
            elif op == "remove":
                wsfiles.remove(path)
                self.seen.pop(path, None)
                answer = {"ok": True}
            elif op == "list":
                entries, truncated = wsfiles.listing(100_000, 1 << 40)
                answer = {"ok": True, "entries": entries, "truncated": truncated}
            else:
                answer = {"ok": False, "error": f"unknown file operation {op!r}"}
        except wsfiles.FileOpError as exc:
            answer = {"ok": False, "error": str(exc)}
        protocol.send_all(self.ctrl, protocol.json_frame(FILE_RESULT, answer))
        if answer.get("ok") and op == "read":
            protocol.send_all(self.ctrl, protocol.frame(protocol.FILE, data))


class _Ended(Exception):
    """The session was killed; the supervisor cleans up and exits."""


def _clean_outputs(items: Any) -> list[dict[str, str]]:
    if not isinstance(items, list):
        return []
    clean = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("mime_type"), str) \
                and isinstance(item.get("data"), str):
            clean.append({"mime_type": item["mime_type"][:200], "data": item["data"]})
    return clean


def serve(sup: Supervisor, spec: jail.RunSpec, files: list[tuple[str, bytes]]) -> None:
    """Run the session until the host closes it or the program dies."""
    try:
        SessionSupervisor(sup, spec, files).serve()
    except _Ended:
        pass
