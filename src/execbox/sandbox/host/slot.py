"""The host's handle on one run slot, and how a run's request reaches it: the short way (the
code straight to the staged program, see `protocol`) when the slot offers it, else the long way
over the control socket."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import time
from typing import Any

from ..inside import protocol
from .errors import HostError, RunNotStarted


class Slot:
    """The host's handle on one run slot: the control socket to its supervisor (for the slot's
    life) and the current run's stdio (new for every run). Each descriptor is closed exactly
    once: a second close could hit a number another thread has just been given."""

    def __init__(self, name: str, kind: str, ctrl: socket.socket) -> None:
        self.name = name  # of the slot's cgroup
        self.kind = kind
        self.ctrl = ctrl
        self.stdin_w = -1
        self.stdout_r = -1
        self.stderr_r = -1
        # The short way's offer (PRK, see `protocol`): the staged program's go pipe, the
        # run's token for the code sent down it, the limits the slot has.
        self.go_w = -1
        self.token = ""
        self.staged: dict[str, Any] = {}
        self.sup_pid = 0
        # A pidfd, not the pid: the zygote reaps supervisors at once, so a number could name
        # another process by the time we signal it.
        self.sup_pidfd = -1
        self.killed = False
        self.reusable = False  # set when a run's result came back whole
        self.staging_since = 0.0
        self.staged_at = 0.0  # when it was last staged (unused since, while in the ready queue)
        self._reader = protocol.FrameReader(protocol.MAX_JSON)
        self._fds: list[int] = []

    def read_staging(self) -> bool:
        """Read what the supervisor says while it stages (the socket is readable): True once
        the slot is staged (RDY, with the run's stdio). Raises HostError when staging failed."""
        try:
            data, fds = protocol.recv_fds(self.ctrl, 65536, 8, protocol.DONTWAIT)
        except BlockingIOError:
            return False
        except OSError as exc:
            raise HostError(f"staging a run slot failed: {exc}") from exc
        self._fds += fds
        if not data:
            raise HostError("the run supervisor exited while staging")
        for kind, payload in self._reader.feed(data):
            if kind == protocol.PID:
                self.watch(json.loads(payload)["pid"])
            elif kind == protocol.ERR:
                raise HostError("sandbox: " + json.loads(payload)["message"])
            elif kind == protocol.RDY:
                fds, self._fds = self._fds, []
                if len(fds) != 3:
                    for fd in fds:
                        os.close(fd)
                    raise HostError(f"protocol: a staged slot sent {len(fds)} descriptors, not 3")
                self.stdin_w, self.stdout_r, self.stderr_r = fds
                self.reusable = False
                # The last run's pump left it non-blocking: a request (input files of any size)
                # is sent with a blocking sendall.
                self.ctrl.setblocking(True)
                return True
            else:
                raise HostError(f"protocol: unexpected {kind!r} while staging")
        return False

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
            except OSError:  # gone already, or its descriptor closed by the caller just now
                pass

    def wait_gone(self, timeout_s: float) -> bool:
        """Wait until the supervisor has exited; False if it is still there."""
        if self.sup_pidfd < 0:
            return True
        return readable(self.sup_pidfd, timeout_s)

    def take_offer(self) -> bool:
        """Whether the short way is open for this run: PRK has come (read now if it is there,
        never waited for). Raises HostError when the supervisor failed or is gone."""
        if self.go_w >= 0:
            return True
        try:
            data, fds = protocol.recv_fds(self.ctrl, 65536, 1, protocol.DONTWAIT)
        except BlockingIOError:
            return False
        except OSError as exc:
            raise HostError(f"the run supervisor is gone: {exc}") from exc
        try:
            if not data:
                raise HostError("the run supervisor exited")
            for kind, payload in self._reader.feed(data):
                if kind == protocol.PRK and fds:
                    offer = json.loads(payload)
                    self.token = str(offer.pop("token"))
                    self.go_w, self.staged = fds.pop(), offer
                elif kind == protocol.ERR:
                    raise HostError("sandbox: " + str(json.loads(payload).get("message")))
                else:
                    raise HostError(f"protocol: unexpected {kind!r} from a staged slot")
        except (ValueError, KeyError, AttributeError, TypeError) as exc:  # unreadable
            raise HostError(f"protocol: a staged slot's offer: {exc!r}") from exc
        finally:
            for fd in fds:
                os.close(fd)
        return self.go_w >= 0

    def staged_for(self, spec: dict[str, Any]) -> bool:
        """Whether a run with `spec` (and no input files) may take the short way: its limits
        are those the slot is staged with."""
        staged = self.staged
        return (
            spec["memory_bytes"] == staged.get("memory_bytes")
            and spec["pids"] == staged.get("pids")
            and spec["disk_bytes"] == staged.get("disk_bytes")
            and not spec.get("input_bytes")
            and not spec.get("input_count")
        )

    def send_request(
        self, request: dict[str, Any], files: list[tuple[str, bytes]]
    ) -> tuple[bytes, bool]:
        """Send a run's request, the short way when the slot offers it and the run fits it.
        Returns the code still to be written to the go pipe (by the pump) and whether the
        program was gone before it took any; RunNotStarted when the supervisor did not take
        the request (none of the code ran)."""
        spec = request["spec"]
        try:
            if not files and self.take_offer() and self.staged_for(spec):
                program_kind = protocol.SLOT_KINDS[self.kind][0]
                go = protocol.go_frame(program_kind, request["code"], spec, self.token)
                # The run's clocks start now. RUN goes first, the code (what fits the pipe;
                # the pump writes the rest) last: writing it wakes the program, which the
                # scheduler often runs on this CPU at once, and a RUN still unsent waited for
                # the program to run and tear down before the supervisor heard of the run.
                sent = time.monotonic()
                self.ctrl.sendall(protocol.json_frame(protocol.RUN, {"spec": spec, "sent": sent}))
                written = self.write_go(go)
                if written < 0:
                    return b"", True
                return go[written:], False
            self.close_go()
            request = dict(request, files=[{"name": n, "size": len(d)} for n, d in files])
            self.ctrl.sendall(protocol.json_frame(protocol.REQ, request))
            for _name, data in files:
                self.ctrl.sendall(protocol.frame(protocol.FILE, data))
            return b"", False
        except (OSError, HostError) as exc:
            # Nothing here fails once the code is in the go pipe, and on the long way the
            # supervisor writes the code only once it has the whole request: a supervisor gone
            # before that (killed while its slot waited, its init and program with it) ran none.
            raise RunNotStarted(f"the run supervisor did not take the request: {exc}") from exc

    def end_run(self, reason: str) -> None:
        """Ask the supervisor to end the run in flight (KILL with `reason`); quiet when it is
        gone: the run is over then anyway."""
        try:
            self.ctrl.send(protocol.frame(protocol.KILL, reason.encode()))
        except OSError:
            pass

    def write_go(self, data: bytes) -> int:
        """Write what fits of `data` into the offered go pipe without waiting; how much, or -1
        when the program is gone."""
        os.set_blocking(self.go_w, False)
        return write_some(self.go_w, data)

    def close_stdin(self) -> None:
        if self.stdin_w >= 0:
            os.close(self.stdin_w)
            self.stdin_w = -1

    def close_go(self) -> None:
        if self.go_w >= 0:
            os.close(self.go_w)
            self.go_w = -1
        self.token, self.staged = "", {}

    def close_run(self) -> None:
        """Close the last run's stdio and go pipe (the slot stays)."""
        self.close_stdin()
        self.close_go()
        for name in ("stdout_r", "stderr_r"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)

    def close(self) -> None:
        """Release the slot; its supervisor tears it down."""
        if self.ctrl.fileno() >= 0:
            self.ctrl.close()
        self.close_run()
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        if self.sup_pidfd >= 0:
            os.close(self.sup_pidfd)
            self.sup_pidfd = -1


def readable(fd: int, timeout_s: float) -> bool:
    """Whether `fd` is readable (a pidfd: its process has exited) within `timeout_s`. poll, not
    select: a caller holding a thousand descriptors (a busy server) has numbers past select's."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))


def write_some(fd: int, data: bytes | memoryview) -> int:
    """Write what fits of `data` into the non-blocking pipe `fd`: bytes written, 0 when it is
    full, -1 when its reader is gone."""
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0
    except OSError:
        return -1
