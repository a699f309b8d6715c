"""The host side of the boundary: start the zygotes, hand them one run at a time, stream the run's
stdin, stdout and stderr with caps, and read the supervisor's result.

Output caps are enforced while streaming: past the cap the bytes are read and dropped, and the
supervisor is told to end the run, so the host never buffers more than the cap.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import select
import selectors
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import protocol
from .cgroup import Hierarchy

if TYPE_CHECKING:
    from .channel import SessionChannel

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
    """The two running fork servers in the runtime image's interpreter (see `zygote`): a light
    one that forks supervisors and init, and a heavy one, with the runtime's modules imported,
    that forks only the programs."""

    def __init__(self, python: Path, env: dict[str, str], ro_paths: list[str],
                 preload: list[str], ready_timeout_s: float = 60.0, pool_size: int = 4) -> None:
        import execbox

        src = str(Path(execbox.__file__).resolve().parent.parent)
        # Supervisors ask the heavy zygote for their programs on this pair: one end is the
        # heavy zygote's, the other the light one's (and so every supervisor's).
        spawn_heavy, spawn_light = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        common = {"ro_paths": ro_paths, "src_paths": [src]}
        self._starting: list[_Starting] = []
        try:
            # Both start at once: the heavy one's imports are most of the wait.
            heavy = _Starting(python, env, dict(common, role="programs", preload=preload),
                              spawn_heavy)
            self._starting.append(heavy)
            light = _Starting(python, env, dict(common, role="supervisors", preload=[]),
                              spawn_light)
            self._starting.append(light)
        except BaseException:
            self.close()
            raise
        finally:
            spawn_heavy.close()
            spawn_light.close()
        infos = [z.ready(ready_timeout_s) for z in self._starting]
        failed = [info for info in infos if not info.get("ready")]
        if failed:
            self.close()
            raise HostError(f"the zygote ({failed[0].get('role', '?')}) failed to start: "
                            f"{failed[0].get('error')}")
        self._proc, self._sock = light.proc, light.sock
        self._heavy_proc = heavy.proc
        self.heavy_pid = heavy.proc.pid
        self.info: dict[str, Any] = dict(
            infos[1], preloaded=infos[0]["preloaded"],
            startup_ms=max(info["startup_ms"] for info in infos))
        self._prefix = f"x{os.getpid()}-{infos[1]['pid']}-"
        try:
            Hierarchy.discover().sweep_orphans()
        except OSError:
            pass
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        self._unused: set[str] = set()
        self.pool = SlotPool(self, pool_size)

    @property
    def pid(self) -> int:
        """The light zygote: the parent of every supervisor."""
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.poll() is None and self._heavy_proc.poll() is None

    def stage(self, timeout_s: float = 30.0) -> Slot:
        """Fork a supervisor and let it stage a run slot (cgroup, namespaces, root, init and a
        contained program waiting for its code). Raises HostError when staging fails."""
        if self._closed:
            raise HostError("the sandbox host is closed")
        name = f"{self._prefix}{next(self._counter)}"
        with self._lock:
            self._unused.add(name)
        ctrl, ctrl_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        child_fds = [ctrl_child.fileno(), stdin_r, stdout_w, stderr_w]
        slot = Slot(name, ctrl, stdin_w, stdout_r, stderr_r)
        try:
            try:
                socket.send_fds(self._sock, [name.encode()], child_fds)
            except OSError as exc:
                raise HostError(f"the zygote is gone: {exc}") from exc
            finally:
                ctrl_child.close()
                for fd in child_fds[1:]:
                    os.close(fd)
            ctrl.settimeout(timeout_s)
            reader = protocol.FrameReader()
            while True:
                try:
                    data = ctrl.recv(65536)
                except OSError as exc:
                    raise HostError(f"staging a run slot failed: {exc}") from exc
                if not data:
                    raise HostError("the run supervisor exited while staging")
                for kind, payload in reader.feed(data):
                    if kind == protocol.PID:
                        slot.watch(json.loads(payload)["pid"])
                    elif kind == protocol.ERR:
                        raise HostError("sandbox: " + json.loads(payload)["message"])
                    elif kind == protocol.RDY:
                        ctrl.settimeout(None)
                        return slot
        except BaseException:
            self._release(slot)
            raise

    def open_session(self, slot_wait_s: float) -> SessionChannel:
        """A staged slot, to be started as a session (see `channel`)."""
        from .channel import SessionChannel

        return SessionChannel(self.pool.take(slot_wait_s), self._release)

    def _release(self, slot: Slot) -> None:
        with self._lock:
            self._unused.discard(slot.name)
        if slot.killed:
            # A killed supervisor could not remove its cgroup: once it is gone, we do.
            slot.wait_gone(5.0)
            try:
                Hierarchy.discover().remove_named(slot.name)
            except OSError:
                pass
        slot.close()

    def unused_slot_names(self) -> set[str]:
        """Cgroup names of slots staged (or being staged) and not used yet."""
        with self._lock:
            return set(self._unused)

    def execute(self, slot: Slot, request: dict[str, Any], files: list[tuple[str, bytes]],
                stdin: bytes, output_bytes: int, backstop_s: float,
                on_stdout: OutputCallback | None = None,
                on_stderr: OutputCallback | None = None) -> RawRun:
        """Run one request in a staged slot (used once, closed here); raises HostError for
        failures of the sandbox itself."""
        request = dict(request, files=[{"name": n, "size": len(d)} for n, d in files])
        try:
            try:
                slot.ctrl.sendall(protocol.json_frame(protocol.REQ, request))
                for _name, data in files:
                    slot.ctrl.sendall(protocol.frame(protocol.FILE, data))
            except OSError as exc:
                raise HostError(f"the run supervisor did not take the request: {exc}") from exc
            pump = _Pump(slot, stdin, output_bytes, on_stdout, on_stderr,
                         max_frame=protocol.MAX_JSON + int(request["spec"]["artifact_bytes"]))
            return pump.run(time.monotonic() + backstop_s)
        finally:
            self._release(slot)

    def close(self) -> None:
        """Stop the zygotes; staged slots are released, runs in flight end with their caller."""
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.close()
        self._closed = True
        for z in getattr(self, "_starting", []):
            z.stop()
        prefix = getattr(self, "_prefix", None)
        if prefix:
            try:
                Hierarchy.discover().sweep(prefix)
            except OSError:
                pass


class _Starting:
    """One zygote process and the host's socket to it."""

    def __init__(self, python: Path, env: dict[str, str], options: dict[str, Any],
                 spawn: socket.socket) -> None:
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        options = dict(options, spawn_fd=spawn.fileno())
        try:
            self.proc = subprocess.Popen(
                # Not -I: its -E would drop PYTHONMALLOC. The environment is ours alone (`env`),
                # -s skips user site-packages and -P keeps the working directory off sys.path.
                [str(python), "-s", "-P", "-B", "-c", _BOOT, str(child.fileno())],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                pass_fds=[child.fileno(), spawn.fileno()], cwd="/", start_new_session=True,
            )
        except BaseException:
            self.sock.close()
            raise
        finally:
            child.close()
        self.sock.send(json.dumps(options).encode())

    def ready(self, timeout_s: float) -> dict[str, Any]:
        self.sock.settimeout(timeout_s)
        try:
            hello = self.sock.recv(65536)
        except OSError:
            return {"ready": False, "error": f"the zygote did not start within {timeout_s:g} s"}
        self.sock.settimeout(None)
        info: dict[str, Any] = (json.loads(hello) if hello
                                else {"ready": False, "error": "exited at start"})
        return info

    def stop(self) -> None:
        try:
            self.sock.close()
        finally:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class SlotPool:
    """Keeps `size` run slots staged in the background, so a request never pays for forks,
    namespaces, mounts or the cgroup. Each slot serves one run and is then gone."""

    def __init__(self, zygote: ZygoteProcess, size: int) -> None:
        self._zygote = zygote
        self._ready: queue.Queue[Slot] = queue.Queue()
        self._space = threading.Semaphore(size)
        self._closed = threading.Event()
        self._error: str | None = None
        self._threads = [threading.Thread(target=self._fill, name=f"execbox-stage-{i}",
                                          daemon=True) for i in range(min(size, 2))]
        for thread in self._threads:
            thread.start()

    def _fill(self) -> None:
        while not self._closed.is_set():
            if not self._space.acquire(timeout=0.2):
                continue
            if self._closed.is_set():
                self._space.release()
                return
            try:
                slot = self._zygote.stage()
            except HostError as exc:
                self._error = str(exc)
                self._space.release()
                self._closed.wait(0.2)  # do not spin on a broken host
                continue
            self._error = None
            self._ready.put(slot)

    def take(self, timeout_s: float) -> Slot:
        """A staged slot; HostError when staging keeps failing or none is ready in time."""
        started = time.monotonic()
        deadline = started + timeout_s
        while True:
            try:
                slot = self._ready.get(timeout=0.1)
            except queue.Empty:
                if self._closed.is_set():
                    raise HostError("the sandbox host is closed") from None
                if self._error and time.monotonic() > started + 1.0:  # failing for a second
                    raise HostError(f"cannot stage a run slot: {self._error}") from None
                if time.monotonic() > deadline:
                    raise HostError(f"no run slot was ready within {timeout_s:g} s") from None
                continue
            self._space.release()
            return slot

    def close(self) -> None:
        self._closed.set()
        for thread in self._threads:
            thread.join(timeout=5)
        while True:
            try:
                self._zygote._release(self._ready.get_nowait())
            except queue.Empty:
                return


class Slot:
    """The host's ends of one staged run slot. Each descriptor is closed exactly once: a second
    close could hit a number another thread has just been given."""

    def __init__(self, name: str, ctrl: socket.socket, stdin_w: int, stdout_r: int,
                 stderr_r: int) -> None:
        self.name = name  # of the slot's cgroup
        self.ctrl = ctrl
        self.stdin_w = stdin_w
        self.stdout_r = stdout_r
        self.stderr_r = stderr_r
        self.sup_pid = 0
        # A pidfd, not the pid: the zygote reaps supervisors at once, so a number could name
        # another process by the time we signal it.
        self.sup_pidfd = -1
        self.killed = False

    def watch(self, pid: int) -> None:
        """Hold the supervisor by a pidfd (it is alive: it has just reported)."""
        self.sup_pid = pid
        if self.sup_pidfd < 0:
            try:
                self.sup_pidfd = os.pidfd_open(pid)
            except OSError:
                pass

    def kill(self) -> None:
        """SIGKILL the supervisor (its init and the whole run die with it)."""
        if self.sup_pidfd >= 0:
            try:
                signal.pidfd_send_signal(self.sup_pidfd, signal.SIGKILL)
                self.killed = True
            except ProcessLookupError:
                pass

    def wait_gone(self, timeout_s: float) -> bool:
        """Wait until the supervisor has exited; False if it is still there."""
        if self.sup_pidfd < 0:
            return True
        ready, _, _ = select.select([self.sup_pidfd], [], [], timeout_s)
        return bool(ready)

    def close_stdin(self) -> None:
        if self.stdin_w >= 0:
            os.close(self.stdin_w)
            self.stdin_w = -1

    def close(self) -> None:
        """Release the slot; an unused one is torn down by its supervisor."""
        if self.ctrl.fileno() >= 0:
            self.ctrl.close()
        self.close_stdin()
        for name in ("stdout_r", "stderr_r", "sup_pidfd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)


class _Pump:
    """Moves bytes between the host and one run until the supervisor reports."""

    def __init__(self, slot: Slot, stdin: bytes, cap: int, on_stdout: OutputCallback | None,
                 on_stderr: OutputCallback | None, max_frame: int) -> None:
        self.slot = slot
        ctrl, stdout_r, stderr_r = slot.ctrl, slot.stdout_r, slot.stderr_r
        self.ctrl = ctrl
        self.stdin = memoryview(stdin)
        self.stdin_w = slot.stdin_w
        self.cap = cap
        self.out = {stdout_r: bytearray(), stderr_r: bytearray()}
        self.truncated = {stdout_r: False, stderr_r: False}
        self.callbacks = {stdout_r: on_stdout, stderr_r: on_stderr}
        self.stdout_r, self.stderr_r = stdout_r, stderr_r
        self.reader = protocol.FrameReader(max_frame)
        self.meta: dict[str, Any] | None = None
        self.error: str | None = None
        self.arts: list[bytes] = []
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
        outputs = {self.stdout_r, self.stderr_r}
        try:
            while sel.get_map():
                if self._complete() and not outputs & set(sel.get_map()):
                    break  # the result is in and output has ended: teardown is not our wait
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

    def _complete(self) -> bool:
        if self.error is not None:
            return True
        return self.meta is not None and len(self.arts) >= len(self.meta.get("artifacts", []))

    def close_stdin(self) -> None:
        self.slot.close_stdin()
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
                self.slot.watch(json.loads(payload)["pid"])
            elif kind == protocol.RES:
                self.meta = json.loads(payload)
            elif kind == protocol.ART:
                self.arts.append(payload)
            elif kind == protocol.ERR:
                self.error = "sandbox: " + json.loads(payload)["message"]

    def _kill_supervisor(self) -> None:
        self.slot.kill()
