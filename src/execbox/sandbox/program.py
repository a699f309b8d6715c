"""The program process: how a program zygote forks it into a staged run slot, and the steps that
contain it there.

Only the program needs the pre-imported interpreter, so only the program is a fork of a program
zygote, the light one (standard library) or the heavy one (numpy, pandas, ...): the supervisor
is a fork of the supervisors' zygote and init a small C program (see `supervisor`). Once a
supervisor has staged a run (cgroup, namespaces, root, init), it sends one SPAWN message to
its program zygote over a SOCK_SEQPACKET socket that every supervisor shares (one message is
one request: requests never interleave). The message carries descriptors only:

    status_w, init's namespaces (PROGRAM_NAMESPACES order), cgroup.procs of each controller,
    the program's stdin, stdout, stderr, then go_r, err_w, setup_w, done_w (`ProgramFds`)

The program zygote points the pid namespace of its next child at the slot's (setns with
CLONE_NEWPID changes only where children go), forks, and returns to its own pid namespace. The
child contains itself with one call into C (`native/contain.c`, system calls only: a Python
step in a fresh fork copies every page it touches): it joins the cgroup and the slot's other
namespaces (the mount namespace last: its root and working directory become the jail's), puts
its stdio on 0-2 and closes all else, enters /workspace, drops every privilege and installs
the seccomp filter. Then, in Python: reseeded randomness and the runner readied (the
environment is empty already: its zygote cleared it once); and it waits for its code.

The program is its zygote's child, not init's: the zygote reaps it and writes its
wait status to its status pipe, as JSON `{"status": wstatus}` (or `{"error": ...}` when it could
not be forked). Killing init still ends it: it lives in init's pid namespace.
A program zygote never sees a request's code and never runs user code.
Standard library only.
"""

from __future__ import annotations

import json
import os
import select
import socket
from dataclasses import astuple, dataclass, replace
from typing import Any

from . import _linux, jail, kernel, protocol, runner

SESSION_CPU_S = 24 * 3600.0  # a session's per-process CPU rlimit (cells are timed one by one)
MAX_SPAWN_FDS = 64


@dataclass
class ProgramFds:
    go_r: int  # the code and its settings arrive here
    err_w: int  # structured error of the code
    setup_w: int  # set-up failures (closed before the code starts)
    done_w: int  # the exit status, reported before the process tears down


# ---- the supervisor's side ------------------------------------------------------------------


def request(spawn: socket.socket, status_w: int, namespaces: list[int], cgroup_procs: list[int],
            stdio: tuple[int, int, int], fds: ProgramFds) -> None:
    """Ask the heavy zygote to fork the program into this slot (the caller keeps and closes its
    own copies of the descriptors)."""
    with jail.step("ask the zygote for the program"):
        layout = {"namespaces": len(namespaces), "cgroups": len(cgroup_procs)}
        socket.send_fds(spawn, [json.dumps(layout).encode()],
                        [status_w, *namespaces, *cgroup_procs, *stdio, *astuple(fds)])


# ---- the heavy zygote's side ----------------------------------------------------------------


@dataclass
class _Spawn:
    """One SPAWN message, its descriptors by role."""

    status_w: int
    namespaces: list[int]
    cgroup_procs: list[int]
    stdio: tuple[int, int, int]
    fds: ProgramFds

    @classmethod
    def parse(cls, msg: bytes, fds: list[int]) -> _Spawn:
        layout = json.loads(msg)
        n_ns, n_cg = int(layout["namespaces"]), int(layout["cgroups"])
        if n_ns != len(jail.PROGRAM_NAMESPACES) or not 1 <= n_cg <= 8 \
                or len(fds) != 1 + n_ns + n_cg + 7:
            raise ValueError("malformed spawn request")
        ns_end = 1 + n_ns
        cg_end = ns_end + n_cg
        stdin, stdout, stderr, go_r, err_w, setup_w, done_w = fds[cg_end:]
        return cls(fds[0], fds[1:ns_end], fds[ns_end:cg_end], (stdin, stdout, stderr),
                   ProgramFds(go_r, err_w, setup_w, done_w))

    def all_fds(self) -> list[int]:
        return [self.status_w, *self.namespaces, *self.cgroup_procs, *self.stdio,
                *astuple(self.fds)]


class ProgramServer:
    """A program zygote's loop: fork programs into the slots supervisors ask for, reap them and
    report how they ended. Single-threaded; it blocks on nothing a supervisor controls."""

    def __init__(self, cfg: jail.JailConfig, src_paths: list[str], host: socket.socket,
                 spawn: socket.socket) -> None:
        self.cfg = cfg
        self.src_paths = src_paths
        self.host = host
        self.spawn = spawn
        self.own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        self.contain = _linux.ContainLibrary(cfg.contain_library,
                                             [flag for _name, flag in jail.PROGRAM_NAMESPACES])
        # Each living child is watched through a pidfd: its end makes the pidfd readable. (No
        # SIGCHLD handler and wake-up pipe, which every fork would have to undo in Python.)
        self.children: dict[int, tuple[int, int]] = {}  # pidfd -> (pid, its status pipe)
        self.poller = select.poll()

    def serve(self) -> None:
        """Until the host closes its socket (or every supervisor's socket is gone)."""
        # Dispositions as a fresh interpreter has them, set once here for every program
        # (whatever the host started us with); a fork changes none of them.
        jail.reset_signals()
        for fd in (self.host.fileno(), self.spawn.fileno()):
            self.poller.register(fd, select.POLLIN)
        while True:
            for fd, _ in self.poller.poll():
                if fd == self.spawn.fileno():
                    msg, fds, _flags, _addr = socket.recv_fds(self.spawn, 4096, MAX_SPAWN_FDS)
                    if not msg and not fds:
                        return
                    self._spawn(msg, fds)
                elif fd == self.host.fileno():
                    if not self.host.recv(4096):
                        return
                else:
                    self._reap(fd)

    def _spawn(self, msg: bytes, fds: list[int]) -> None:
        try:
            req = _Spawn.parse(msg, fds)
        except (ValueError, KeyError, TypeError):
            for fd in fds:
                os.close(fd)
            return
        os.set_blocking(req.status_w, False)  # a supervisor that never reads cannot stop us
        pid = -1
        try:
            _linux.setns(req.namespaces[0], _linux.CLONE_NEWPID)
        except OSError as exc:
            error: str | None = f"enter the slot's pid namespace: {exc}"
        else:
            try:
                pid = os.fork()
                error = None
            except OSError as exc:  # the slot's init is gone, or the host is out of pids
                error = f"fork the program: {exc}"
            if pid == 0:
                self._child(req)
            # Never fork anywhere else by mistake: if this fails, the zygote exits.
            _linux.setns(self.own_pid_ns, _linux.CLONE_NEWPID)
        for fd in req.all_fds():
            if fd != req.status_w:
                os.close(fd)
        if error is not None:
            _write_quiet(req.status_w, json.dumps({"error": f"program: {error}"}).encode())
            os.close(req.status_w)
            return
        # An unreaped child always has a pidfd; should the call fail all the same, the zygote
        # exits (the host restarts it) rather than lose track of a program.
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = (pid, req.status_w)
        self.poller.register(pidfd, select.POLLIN)

    def _reap(self, pidfd: int) -> None:
        """The child behind `pidfd` has ended: reap it and report its wait status."""
        self.poller.unregister(pidfd)
        pid, status_w = self.children.pop(pidfd)
        os.close(pidfd)
        _pid, status = os.waitpid(pid, 0)
        _write_quiet(status_w, json.dumps({"status": status}).encode())
        os.close(status_w)

    def _child(self, req: _Spawn) -> None:
        """In the fork: join the slot and contain the process, then become the program. Never
        returns."""
        try:
            # Their finalizers must never close a descriptor number the program reuses.
            self.host.detach()
            self.spawn.detach()
            # Join the cgroup and the slot's namespaces, stdio on 0-2 and nothing else open
            # but the program's four, /workspace, the sandbox uid without privileges, seccomp.
            with jail.step("contain the program"):
                self.contain.contain(req.all_fds()[1:], len(req.cgroup_procs), jail.SANDBOX_UID,
                                     self.cfg.seccomp)
            if os.environ:
                raise jail.JailError("the program zygote's environment is not empty")
            with jail.step("reseed random state"):
                runner.reseed()
            with jail.step("prepare the runner"):
                runner.prepare()
        except BaseException as exc:  # noqa: BLE001
            _write_quiet(req.fds.setup_w, f"program set-up: {exc}".encode())
            os._exit(127)
        _program(self.src_paths, req.fds)


def _program(src_paths: list[str], fds: ProgramFds) -> None:
    """The user's process, contained in the slot: wait for the code, run it. Never returns."""
    # Staged: from here on the process is fully contained and waits for its request.
    try:
        kind, payload = protocol.read_frame(fds.go_r)
    except (EOFError, OSError):
        os._exit(0)  # the slot was closed unused
    try:
        go = json.loads(payload)
        spec = jail.RunSpec(**go["spec"])
        session = go.get("mode") == "session"
        # A session's interpreter lives through many cells: CPU time is watched per cell by the
        # supervisor, and the per-process rlimit only bounds the whole session.
        jail.set_rlimits(replace(spec, cpu_s=SESSION_CPU_S) if session else spec)
        jail.set_environment(spec.env)
    except BaseException as exc:  # noqa: BLE001
        _write_quiet(fds.setup_w, f"program set-up: {exc}".encode())
        os._exit(127)
    os.close(fds.setup_w)
    if session:
        os.close(fds.done_w)
        kernel.serve(fds.go_r, fds.err_w, src_paths, go["spec"])
    os.close(fds.go_r)
    runner.run(go["code"], fds.err_w, src_paths, fds.done_w, go["token"].encode())


def _write_quiet(fd: int, data: bytes) -> None:
    try:
        os.write(fd, data)
    except OSError:
        pass


def main(cfg: jail.JailConfig, src_paths: list[str], host: socket.socket,
         options: dict[str, Any]) -> None:
    """A program zygote after start-up: serve spawn requests until the host is gone."""
    spawn = socket.socket(fileno=int(options["spawn_fd"]))
    ProgramServer(cfg, src_paths, host, spawn).serve()
