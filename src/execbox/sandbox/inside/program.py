"""The program process: how a program zygote forks it into a staged run slot, and the steps that
contain it there.

Only the program needs the pre-imported interpreter, so only the program is a fork of a program
zygote, the light one (standard library) or the heavy one (numpy, pandas, ...): the supervisor
is a fork of the supervisors' zygote and init a small C program (see `supervisor`). Once a
supervisor has staged a run (cgroup, namespaces, root, init: `native/stage.c`), it sends one
SPAWN message to its program zygote over a SOCK_SEQPACKET socket that every supervisor shares (one message is
one request: requests never interleave). The message is "<namespaces> <cgroups> <warm>", the
number of each and whether the program copies all its warm pages (1) or only those every
program writes (0; see `learn_warm_pages`), and carries these descriptors:

    status_w, a pidfd of init (the one "namespace": the program joins init's
    `jail.PROGRAM_NAMESPACES` through it), cgroup.procs of each controller, the program's
    stdin, stdout, stderr, then go_r, err_w, setup_w, done_w (`ProgramFds`)

A program zygote's loop is C (`native/contain.c`, system calls only: a Python step copies every
page it touches, in a fresh fork and in the zygote after each fork alike). It points the pid
namespace of its next child at the slot's (setns with CLONE_NEWPID changes only where children
go), forks, and returns to its own pid namespace. The child contains itself in C too: it joins
the cgroup and the slot's other namespaces (with the mount namespace, its root and working
directory become the jail's), puts its stdio on 0-2 and closes all else, enters /workspace,
drops every privilege and installs the seccomp filter's program part (the zygote runs under
the rest: see `seccomp.compile_split`), then copies its warm pages (see
`learn_warm_pages`). Only then does it return to Python: reseeded randomness and the runner
readied (the environment is empty already: its zygote cleared it once); and it waits for its
code.

The program is its zygote's child, not init's: the zygote reaps it and writes its
wait status to its status pipe, as JSON `{"status": wstatus}` (or `{"error": ...}` when it could
not be forked). Killing init still ends it: it lives in init's pid namespace.
A program zygote never sees a request's code and never runs user code.
Standard library only.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
from dataclasses import asdict, dataclass, replace
from typing import Any, NoReturn

from . import interpreters, jail, kernel, linux, protocol, runner, staged

SESSION_CPU_S = 24 * 3600.0  # a session's per-process CPU rlimit (cells are timed one by one)


@dataclass
class ProgramFds:
    go_r: int  # the code and its settings arrive here
    err_w: int  # structured error of the code
    setup_w: int  # set-up failures (closed before the code starts)
    done_w: int  # the exit status, reported before the process tears down


# ---- the program zygote's side --------------------------------------------------------------


def start(
    cfg: jail.JailConfig, src_paths: list[str], kind: str
) -> tuple[linux.ContainLibrary, dict[str, Any]]:
    """A program zygote's fork server, its warm pages learned (see `learn_warm_pages`), and
    what to tell the host of them: {"warm_pages": all, "warm_base_pages": base}, or
    {"warm_error": why} when training failed (programs then run all the same, each copying
    its pages as it writes them)."""
    # Dispositions as a fresh interpreter has them, set once here for every program
    # (whatever the host started us with); a fork changes none of them.
    jail.reset_signals()
    server = linux.ContainLibrary(cfg.contain_library, [jail.PROGRAM_NAMESPACES])
    base_codes, more_codes = TRAINING.get(kind, ([], []))
    try:
        base = learn_warm_pages(server, src_paths, base_codes)
        more = learn_warm_pages(server, src_paths, more_codes) - base
    except (OSError, jail.JailError) as exc:
        return server, {"warm_error": str(exc)}
    server.set_warm(_ranges(base), _ranges(more))
    return server, {"warm_pages": len(base) + len(more), "warm_base_pages": len(base)}


def serve(
    cfg: jail.JailConfig,
    server: linux.ContainLibrary,
    src_paths: list[str],
    host: socket.socket,
    spawn: socket.socket,
    language: str = "python",
) -> None:
    """A program zygote's loop: fork programs into the slots supervisors ask for, reap them and
    report how they ended, until the host closes its socket (or every supervisor's socket is
    gone). Single-threaded; it blocks on nothing a supervisor controls. Returns in the
    zygote only; each forked child becomes its program here: a Python program, or for
    another `language` its staged interpreter (see `staged`)."""
    # The fork skips CPython's after-fork work, sound only with no other thread: `zygote.main`
    # checks the process is single-threaded before it says ready.
    own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    zygote_pid = os.getpid()
    try:
        kept = server.serve_programs(
            host.fileno(),
            spawn.fileno(),
            own_pid_ns,
            jail.program_uids(),
            cfg.seccomp,
        )
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
        if language != "python":
            with jail.step(f"start the staged {language} interpreter"):
                staged.exec_staged(language, fds.go_r, fds.err_w, fds.setup_w, fds.done_w)
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
    _write_quiet(fds.done_w, protocol.PARKED)
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
    if spec.language in interpreters.EXEC_LANGUAGES and not session:
        _exec_interpreter(spec, go["code"], fds)
    os.close(fds.setup_w)
    if session:
        os.close(fds.done_w)
        kernel.serve(fds.go_r, fds.err_w, src_paths, go["spec"])
    os.close(fds.go_r)
    runner.run(go["code"], fds.err_w, src_paths, fds.done_w, go["token"].encode())


def _exec_interpreter(spec: jail.RunSpec, code: str, fds: ProgramFds) -> NoReturn:
    """Become Node or bash running `code`, contained as the program is (see `interpreters`).
    Its exit status comes from the zygote's report (done_w closed: the interpreter writes no
    report of its own); set-up closes on the exec, or says why the exec failed."""
    for fd in (fds.go_r, fds.done_w):
        os.close(fd)
    os.set_inheritable(fds.setup_w, False)
    try:
        interpreters.exec_code(spec.language, code, spec.env, fds.err_w, spec.memory_bytes)
    except BaseException as exc:  # noqa: BLE001
        _write_quiet(fds.setup_w, f"program set-up: start {spec.language}: {exc}".encode())
    os._exit(127)


# ---- the pages programs write first ------------------------------------------------------
#
# A program is a fresh fork of its zygote: the first write to each page it shares with the
# zygote copies that page in a page fault, and many
# of those pages are the same in every run: the runner's steps, the interpreter's common
# objects and, in the heavy zygote, what pandas touches whenever it is used. So a program
# zygote learns them once, at start: it forks training programs that take the real program
# path (after-fork work, runner, request, code, shutdown) on fixed snippets, and each reports
# from /proc/self/pagemap which of the zygote's pages it wrote. The pages any snippet wrote are
# the warm set: each forked program copies them at once, contained (MADV_POPULATE_WRITE, in C:
# `contain.c`), while it is staged and waits for its code, so its request path is left with
# the faults particular to that code. The price is paid off the request path but paid by every
# program, so each zygote has two sets: the pages its every program writes (the base), and
# those a pandas program writes besides (~1,700 pages, 7 MB, in the heavy zygote), which only
# the programs of "pandas" slots copy (`protocol.SLOT_KINDS`; code that imports pandas runs
# there): a numpy run does not pay for pandas' pages.

TRAINING = {  # kind: (the base set's snippets, the other snippets)
    "light": (
        [
            "print(1)\n",
            "import json\nprint(json.dumps({'total': sum(range(10))}))\n",
        ],
        [],
    ),
    "heavy": (
        [
            "import numpy as np\nprint(np.arange(12.0).reshape(3, 4).sum(axis=0))\n",
        ],
        [
            "import pandas as pd\n"
            "frame = pd.DataFrame({'a': range(100), 'b': [i % 3 for i in range(100)]})\n"
            "print(frame.groupby('b').a.sum())\n",
            "import numpy as np\nimport pandas as pd\n"
            "frame = pd.DataFrame(np.arange(60.0).reshape(20, 3), columns=list('xyz'))\n"
            "print(frame.describe())\n",
        ],
    ),
}
_TRAINING_SPEC = jail.RunSpec(
    timeout_s=10.0,
    cpu_s=10.0,
    memory_bytes=512 << 20,
    pids=64,
    disk_bytes=64 << 20,
    output_bytes=1 << 20,
    artifact_bytes=1 << 20,
    artifact_files=10,
)
TRAINING_WAIT_S = 30.0
PAGE = os.sysconf("SC_PAGESIZE")


def learn_warm_pages(
    server: linux.ContainLibrary, src_paths: list[str], codes: list[str]
) -> set[int]:
    """The pages (their addresses) a training program wrote for any of `codes`."""
    written: set[int] = set()
    for code in codes:
        written |= _written_by(server, src_paths, code)
    return written


def _ranges(pages: set[int]) -> list[tuple[int, int]]:
    """Address ranges [start, end) of `pages`, contiguous pages merged."""
    ranges: list[tuple[int, int]] = []
    for page in sorted(pages):
        if ranges and ranges[-1][1] == page:
            ranges[-1] = (ranges[-1][0], page + PAGE)
        else:
            ranges.append((page, page + PAGE))
    return ranges


def _written_by(server: linux.ContainLibrary, src_paths: list[str], code: str) -> set[int]:
    """The zygote's pages that a program running `code` writes: a training fork takes the
    program path (not contained: it runs only our own snippet, stdio on /dev/null) and reports
    them just before it exits."""
    ranges = _private_writable()
    wanted = server.warm_array(ranges)
    with jail.step("train the warm pages"):
        result_r, result_w = os.pipe()
        go_r, go_w = os.pipe()
        err_r, err_w = os.pipe()
        setup_r, setup_w = os.pipe()
        done_r, done_w = os.pipe()
        go = {"code": code, "spec": asdict(_TRAINING_SPEC), "token": "00" * 16}
        protocol.send_all(go_w, protocol.frame(protocol.REQ, json.dumps(go).encode()))
        os.close(go_w)
        pid = server.fork()
        if pid == 0:
            try:
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                # Run by the shutdown the program path ends with, just before it exits.
                atexit.register(server.report_written, wanted, result_w)
                runner.after_fork()
                runner.prepare()
                _program(src_paths, ProgramFds(go_r, err_w, setup_w, done_w))
            finally:
                os._exit(127)
        for fd in (result_w, go_r, err_w, setup_w, done_w):
            os.close(fd)
        try:
            data = b""
            while select.select([result_r], [], [], TRAINING_WAIT_S)[0]:
                chunk = os.read(result_r, 1 << 16)
                if not chunk:
                    break
                data += chunk
            else:
                os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            report = os.read(setup_r, 4096) + os.read(err_r, 4096)
        finally:
            for fd in (result_r, err_r, setup_r, done_r):
                os.close(fd)
        if status != 0 or len(data) % 16:
            raise jail.JailError(
                f"a training program ended with status {status}: "
                + report.decode("utf-8", "replace")[:300]
            )
    pairs = memoryview(data).cast("Q")
    return {page for i in range(0, len(pairs), 2) for page in range(pairs[i], pairs[i + 1], PAGE)}


def _private_writable() -> list[tuple[int, int]]:
    """This process's private writable mappings."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, perms = line.split(None, 2)[:2]
            if perms[1] == "w" and perms[3] == "p":
                start, end = span.split("-")
                ranges.append((int(start, 16), int(end, 16)))
    return ranges


def _write_quiet(fd: int, data: bytes) -> None:
    try:
        os.write(fd, data)
    except OSError:
        pass


def main(
    cfg: jail.JailConfig,
    server: linux.ContainLibrary,
    src_paths: list[str],
    host: socket.socket,
    options: dict[str, Any],
) -> None:
    """A program zygote after start-up: serve spawn requests until the host is gone."""
    spawn = socket.socket(fileno=int(options["spawn_fd"]))
    kind = options.get("kind", "")
    serve(cfg, server, src_paths, host, spawn, kind if kind in staged.LANGUAGES else "python")
