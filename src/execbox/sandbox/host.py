"""The host side of the boundary: start the zygote, hand it one run at a time, stream the run's
stdin, stdout and stderr with caps, and read the supervisor's result.

Output caps are enforced while streaming: past the cap the bytes are read and dropped, and the
supervisor is told to end the run, so the host never buffers more than the cap.
"""

from __future__ import annotations

import itertools
import json
import os
import selectors
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import protocol
from .cgroup import Hierarchy

# The options arrive on the socket, not in argv: a run can read /proc/self/cmdline, and host
# paths are none of its business.
_BOOT = (
    "import json, socket, sys; sock = socket.socket(fileno=int(sys.argv[1])); "
    "opts = json.loads(sock.recv(1 << 20)); sys.path.insert(0, opts['src_paths'][0]); "
    "from execbox.sandbox.zygote import main; main(sock, opts)"
)
_CHUNK = 65536

OutputCallback = Callable[[bytes], None]


class HostError(Exception):
    """The zygote or a supervisor failed; the message says where."""


@dataclass
class RawRun:
    meta: dict[str, Any]
    artifact_data: list[bytes] = field(default_factory=list)
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False


class ZygoteProcess:
    """A running fork server in the runtime image's interpreter."""

    def __init__(self, python: Path, env: dict[str, str], ro_paths: list[str],
                 preload: list[str], ready_timeout_s: float = 60.0) -> None:
        import execbox

        src = str(Path(execbox.__file__).resolve().parent.parent)
        self._sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        options = {"preload": preload, "ro_paths": ro_paths, "src_paths": [src]}
        self._proc = subprocess.Popen(
            # Not -I: its -E would drop PYTHONMALLOC. The environment is ours alone (`env`),
            # -s skips user site-packages and -P keeps the working directory off sys.path.
            [str(python), "-s", "-P", "-B", "-c", _BOOT, str(child.fileno())],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            pass_fds=[child.fileno()], cwd="/", start_new_session=True,
        )
        child.close()
        self._sock.send(json.dumps(options).encode())
        self._sock.settimeout(ready_timeout_s)
        try:
            hello = self._sock.recv(65536)
        except OSError as exc:
            self.close()
            raise HostError(f"the zygote did not start within {ready_timeout_s:g} s") from exc
        self._sock.settimeout(None)
        info = json.loads(hello) if hello else {"ready": False, "error": "exited at start"}
        if not info.get("ready"):
            self.close()
            raise HostError(f"the zygote failed to start: {info.get('error')}")
        self.info: dict[str, Any] = info
        self._prefix = f"x{os.getpid()}-{info['pid']}-"
        try:
            Hierarchy.discover().sweep_orphans()
        except OSError:
            pass
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.poll() is None

    def execute(self, request: dict[str, Any], files: list[tuple[str, bytes]], stdin: bytes,
                output_bytes: int, backstop_s: float,
                on_stdout: OutputCallback | None = None,
                on_stderr: OutputCallback | None = None) -> RawRun:
        """Run one request; raises HostError for failures of the sandbox itself."""
        if self._closed:
            raise HostError("the sandbox host is closed")
        request = dict(request, cgroup=f"{self._prefix}{next(self._counter)}")
        request["files"] = [{"name": n, "size": len(d)} for n, d in files]
        ctrl, ctrl_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        child_fds = [ctrl_child.fileno(), stdin_r, stdout_w, stderr_w]
        pump: _Pump | None = None
        try:
            try:
                socket.send_fds(self._sock, [b"R"], child_fds)
            except OSError as exc:
                raise HostError(f"the zygote is gone: {exc}") from exc
        finally:
            ctrl_child.close()
            for fd in child_fds[1:]:
                os.close(fd)
        try:
            try:
                ctrl.sendall(protocol.json_frame(protocol.REQ, request))
                for _name, data in files:
                    ctrl.sendall(protocol.frame(protocol.FILE, data))
            except OSError as exc:
                raise HostError(f"the run supervisor did not take the request: {exc}") from exc
            pump = _Pump(ctrl, stdin_w, stdout_r, stderr_r, stdin, output_bytes,
                         on_stdout, on_stderr,
                         max_frame=protocol.MAX_JSON + int(request["spec"]["artifact_bytes"]))
            stdin_w = -1  # the pump owns it now and may close it early
            return pump.run(time.monotonic() + backstop_s)
        finally:
            # Close each descriptor exactly once: a second close could hit a number another
            # thread has just been given.
            ctrl.close()
            if pump is not None:
                pump.close_stdin()
            for fd in (stdin_w, stdout_r, stderr_r):
                if fd >= 0:
                    os.close(fd)

    def close(self) -> None:
        """Stop the zygote; runs in flight are ended by their supervisors."""
        self._closed = True
        try:
            self._sock.close()
        finally:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        prefix = getattr(self, "_prefix", None)
        if prefix:
            try:
                Hierarchy.discover().sweep(prefix)
            except OSError:
                pass


class _Pump:
    """Moves bytes between the host and one run until the supervisor reports."""

    def __init__(self, ctrl: socket.socket, stdin_w: int, stdout_r: int, stderr_r: int,
                 stdin: bytes, cap: int, on_stdout: OutputCallback | None,
                 on_stderr: OutputCallback | None, max_frame: int) -> None:
        self.ctrl = ctrl
        self.stdin = memoryview(stdin)
        self.stdin_w = stdin_w
        self.cap = cap
        self.out = {stdout_r: bytearray(), stderr_r: bytearray()}
        self.truncated = {stdout_r: False, stderr_r: False}
        self.callbacks = {stdout_r: on_stdout, stderr_r: on_stderr}
        self.stdout_r, self.stderr_r = stdout_r, stderr_r
        self.reader = protocol.FrameReader(max_frame)
        self.meta: dict[str, Any] | None = None
        self.error: str | None = None
        self.arts: list[bytes] = []
        self.sup_pid = 0
        self.kill_sent = False

    def run(self, backstop: float) -> RawRun:
        sel = selectors.DefaultSelector()
        for fd in (self.stdout_r, self.stderr_r, self.stdin_w):
            os.set_blocking(fd, False)
        self.ctrl.setblocking(False)
        sel.register(self.stdout_r, selectors.EVENT_READ)
        sel.register(self.stderr_r, selectors.EVENT_READ)
        sel.register(self.ctrl, selectors.EVENT_READ)
        if self.stdin:
            sel.register(self.stdin_w, selectors.EVENT_WRITE)
        else:
            self.close_stdin()
        try:
            while sel.get_map():
                left = backstop - time.monotonic()
                if left <= 0:
                    self._kill_supervisor()
                    raise HostError("the run supervisor did not finish in time")
                for key, _ in sel.select(timeout=min(left, 1.0)):
                    fd = key.fd
                    if fd == self.stdin_w:
                        self._feed(sel)
                    elif key.fileobj is self.ctrl:
                        self._read_ctrl(sel)
                    else:
                        self._read_output(sel, fd)
        finally:
            sel.close()
        if self.error is not None:
            raise HostError(self.error)
        if self.meta is None:
            raise HostError("the run supervisor exited without a result")
        n = len(self.meta.get("artifacts", []))
        if len(self.arts) != n:
            raise HostError(f"the run supervisor sent {len(self.arts)} of {n} artifacts")
        return RawRun(self.meta, self.arts, bytes(self.out[self.stdout_r]),
                      bytes(self.out[self.stderr_r]), self.truncated[self.stdout_r],
                      self.truncated[self.stderr_r])

    def close_stdin(self) -> None:
        if self.stdin_w >= 0:
            os.close(self.stdin_w)
            self.stdin_w = -1

    def _feed(self, sel: selectors.BaseSelector) -> None:
        try:
            n = os.write(self.stdin_w, self.stdin[:_CHUNK * 4])
            self.stdin = self.stdin[n:]
        except BlockingIOError:
            return
        except OSError:  # the program closed stdin or exited: the rest is not wanted
            self.stdin = self.stdin[:0]
        if not self.stdin:
            sel.unregister(self.stdin_w)
            self.close_stdin()

    def _read_output(self, sel: selectors.BaseSelector, fd: int) -> None:
        try:
            data = os.read(fd, _CHUNK)
        except BlockingIOError:
            return
        if not data:
            sel.unregister(fd)
            return
        buf = self.out[fd]
        room = self.cap - len(buf)
        if room > 0:
            keep = data[:room]
            buf += keep
            callback = self.callbacks[fd]
            if callback is not None:
                callback(keep)
        if len(data) > room:
            self.truncated[fd] = True
            if not self.kill_sent:
                self.kill_sent = True
                try:
                    self.ctrl.send(protocol.frame(protocol.KILL, b"output_limit"))
                except OSError:
                    pass

    def _read_ctrl(self, sel: selectors.BaseSelector) -> None:
        try:
            data = self.ctrl.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            sel.unregister(self.ctrl)
            if self.stdin_w >= 0:
                if self.stdin_w in sel.get_map():
                    sel.unregister(self.stdin_w)
                self.close_stdin()
            return
        for kind, payload in self.reader.feed(data):
            if kind == protocol.PID:
                self.sup_pid = json.loads(payload)["pid"]
            elif kind == protocol.RES:
                self.meta = json.loads(payload)
            elif kind == protocol.ART:
                self.arts.append(payload)
            elif kind == protocol.ERR:
                self.error = "sandbox: " + json.loads(payload)["message"]

    def _kill_supervisor(self) -> None:
        if self.sup_pid:
            try:
                os.kill(self.sup_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
