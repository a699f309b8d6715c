"""The program process: how a program zygote forks it into a staged run slot, and the steps that
contain it there.

Only the program needs the pre-imported interpreter, so only the program is a fork of a program
zygote, the light one (standard library) or the heavy one (numpy, pandas, ...): the supervisor
is a fork of the supervisors' zygote and init a small C program (see `supervisor`). Once a
supervisor has staged a run (cgroup, namespaces, root, init), it sends one SPAWN message to
its program zygote over a SOCK_SEQPACKET socket that every supervisor shares (one message is
one request: requests never interleave). The message is "<namespaces> <cgroups>", the number
of each, and carries these descriptors:

    status_w, init's namespaces (PROGRAM_NAMESPACES order), cgroup.procs of each controller,
    the program's stdin, stdout, stderr, then go_r, err_w, setup_w, done_w (`ProgramFds`)

A program zygote's loop is C (`native/contain.c`, system calls only: a Python step copies every
page it touches, in a fresh fork and in the zygote after each fork alike). It points the pid
namespace of its next child at the slot's (setns with CLONE_NEWPID changes only where children
go), forks, and returns to its own pid namespace. The child contains itself in C too: it joins
the cgroup and the slot's other namespaces (the mount namespace last: its root and working
directory become the jail's), puts its stdio on 0-2 and closes all else, enters /workspace,
drops every privilege and installs the seccomp filter. Only then does it return to Python:
reseeded randomness and the runner readied (the environment is empty already: its zygote
cleared it once); and it waits for its code.

The program is its zygote's child, not init's: the zygote reaps it and writes its
wait status to its status pipe, as JSON `{"status": wstatus}` (or `{"error": ...}` when it could
not be forked). Killing init still ends it: it lives in init's pid namespace.
A program zygote never sees a request's code and never runs user code.
Standard library only.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import astuple, dataclass, replace
from typing import Any

from . import _linux, jail, kernel, protocol, runner

SESSION_CPU_S = 24 * 3600.0  # a session's per-process CPU rlimit (cells are timed one by one)


@dataclass
class ProgramFds:
    go_r: int  # the code and its settings arrive here
    err_w: int  # structured error of the code
    setup_w: int  # set-up failures (closed before the code starts)
    done_w: int  # the exit status, reported before the process tears down


# ---- the supervisor's side ------------------------------------------------------------------


def request(spawn: socket.socket, status_w: int, namespaces: list[int], cgroup_procs: list[int],
            stdio: tuple[int, int, int], fds: ProgramFds) -> None:
    """Ask the program zygote to fork the program into this slot (the caller keeps and closes
    its own copies of the descriptors)."""
    with jail.step("ask the zygote for the program"):
        socket.send_fds(spawn, [f"{len(namespaces)} {len(cgroup_procs)}".encode()],
                        [status_w, *namespaces, *cgroup_procs, *stdio, *astuple(fds)])


# ---- the program zygote's side --------------------------------------------------------------


def serve(cfg: jail.JailConfig, src_paths: list[str], host: socket.socket,
          spawn: socket.socket) -> None:
    """A program zygote's loop: fork programs into the slots supervisors ask for, reap them and
    report how they ended, until the host closes its socket (or every supervisor's socket is
    gone). Single-threaded; it blocks on nothing a supervisor controls. Returns in the
    zygote only; each forked child becomes its program here."""
    # Dispositions as a fresh interpreter has them, set once here for every program
    # (whatever the host started us with); a fork changes none of them.
    jail.reset_signals()
    # The fork skips CPython's after-fork work, sound only with no other thread: `zygote.main`
    # checks the process is single-threaded before it says ready.
    server = _linux.ContainLibrary(cfg.contain_library,
                                   [flag for _name, flag in jail.PROGRAM_NAMESPACES])
    own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    zygote_pid = os.getpid()
    try:
        kept = server.serve_programs(host.fileno(), spawn.fileno(), own_pid_ns,
                                     jail.SANDBOX_UID, cfg.seccomp)
    except BaseException:
        if os.getpid() == zygote_pid:
            raise
        os._exit(127)  # a child, whatever went wrong: never the zygote's shutdown
    if kept is None:
        return
    fds = ProgramFds(*kept)
    try:
        # Closed in C already: their finalizers must never close a number the program reuses.
        host.detach()
        spawn.detach()
        if os.environ:
            raise jail.JailError("the program zygote's environment is not empty")
        # CPython's own after-fork hooks did not run (the fork was C's).
        with jail.step("redo what a program would miss of CPython's after-fork work"):
            runner.after_fork()
        with jail.step("prepare the runner"):
            runner.prepare()
    except BaseException as exc:  # noqa: BLE001
        _write_quiet(fds.setup_w, f"program set-up: {exc}".encode())
        os._exit(127)
    _program(src_paths, fds)


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
    serve(cfg, src_paths, host, spawn)
