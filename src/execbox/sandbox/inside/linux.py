"""Thin ctypes wrappers over the Linux calls the jail needs and Python 3.11 lacks.

Standard library only: this module is imported by the zygote, which runs in the runtime image.
Every wrapper raises OSError with the errno and a message naming the call.
"""

from __future__ import annotations

import ctypes
import os
import struct

# The C library the interpreter itself runs on (dlopen of the program's own global symbols).
# Not `ctypes.util.find_library`: it imports subprocess, shutil, tempfile and more, ~1.5 MB
# that every light program's fork and exit would carry for nothing.
_libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACE_FLAGS = (
    CLONE_NEWNS
    | CLONE_NEWCGROUP
    | CLONE_NEWUTS
    | CLONE_NEWIPC
    | CLONE_NEWUSER
    | CLONE_NEWPID
    | CLONE_NEWNET
)

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

PR_CAPBSET_DROP = 24

_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}


def _check(result: int, call: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{call}: {os.strerror(err)}")
    return result


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def setns(fd: int, nstype: int) -> None:
    """Join the namespace `fd` names (for CLONE_NEWPID: the namespace of the caller's next
    children; the caller itself stays where it is)."""
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), f"setns({nstype:#x})")


def mount(
    source: str, target: str, fstype: str | None, flags: int = 0, data: str | None = None
) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount({source!r} on {target!r}, {fstype or 'bind'})",
    )


def umount2(target: str, flags: int) -> None:
    _check(_libc.umount2(target.encode(), ctypes.c_int(flags)), f"umount2({target!r})")


def pivot_root(new_root: str, put_old: str) -> None:
    machine = os.uname().machine
    nr = _SYS_PIVOT_ROOT.get(machine)
    if nr is None:
        raise OSError(0, f"pivot_root: unsupported architecture {machine}")
    _check(
        _libc.syscall(ctypes.c_long(nr), new_root.encode(), put_old.encode()),
        f"pivot_root({new_root!r})",
    )


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
    return _check(
        _libc.prctl(
            ctypes.c_int(option),
            ctypes.c_ulong(arg2),
            ctypes.c_ulong(arg3),
            ctypes.c_ulong(arg4),
            ctypes.c_ulong(arg5),
        ),
        f"prctl({option})",
    )


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class SeccompLoader:
    """A classic BPF seccomp program, laid out in memory once (a program installs it as the
    last of its contain steps, see `ContainLibrary`)."""

    def __init__(self, program: bytes) -> None:
        if not program or len(program) % 8:
            raise OSError(0, "seccomp: malformed BPF program")
        self._buf = ctypes.create_string_buffer(program, len(program))
        self._prog = _SockFprog(len(program) // 8, ctypes.cast(self._buf, ctypes.c_void_p))
        self._addr = ctypes.addressof(self._prog)

    @property
    def address(self) -> int:
        """Of the `struct sock_fprog`."""
        return self._addr


PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2


def install_seccomp(loader: SeccompLoader) -> None:
    """Install the filter in this (single-threaded) process; its forks inherit it."""
    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, loader.address)


class ContainLibrary:
    """A program zygote's fork server and a program's contain steps, in C
    (`native/contain.c`), loaded once by a program zygote."""

    def __init__(self, path: str, namespace_types: list[int]) -> None:
        library = ctypes.CDLL(path, use_errno=True)
        contain = library.execbox_contain
        contain.restype = ctypes.c_int
        contain.argtypes = [
            ctypes.POINTER(ctypes.c_int),
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_int),
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_size_t,
        ]
        # PyDLL: the GIL stays held across each fork, as os.fork holds it.
        serve = ctypes.PyDLL(path, use_errno=True).execbox_serve_programs
        serve.restype = ctypes.c_int
        serve.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_int),
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.c_size_t,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_int),
            ctypes.c_char_p,
            ctypes.c_size_t,
        ]
        written = library.execbox_written_pages
        written.restype = ctypes.c_int
        written.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.c_int]
        # libc's fork, as the server's own: none of CPython's after-fork work in the child.
        fork = ctypes.PyDLL(None, use_errno=True).fork
        fork.restype = ctypes.c_int
        fork.argtypes = []
        self._contain, self._serve, self._written, self._fork = contain, serve, written, fork
        self.warm = self.warm_array([])  # see `set_warm`
        self.n_base = 0
        self._types = (ctypes.c_int * len(namespace_types))(*namespace_types)
        self._n_ns = len(namespace_types)
        self._error = ctypes.create_string_buffer(512)

    def contain(self, fds: list[int], n_cgroups: int, uid: int, seccomp: SeccompLoader) -> None:
        """The contain steps in this process. `fds`: the namespaces (in `namespace_types`
        order), the cgroup.procs files, stdin, stdout, stderr and the four descriptors the
        program keeps (see contain.c)."""
        array = (ctypes.c_int * len(fds))(*fds)
        if self._contain(
            array,
            self._n_ns,
            self._types,
            n_cgroups,
            uid,
            seccomp.address,
            self._error,
            len(self._error),
        ):
            raise OSError(ctypes.get_errno(), self._error.value.decode("utf-8", "replace"))

    def serve_programs(
        self, host: int, spawn: int, own_pid_ns: int, uids: range, seccomp: SeccompLoader
    ) -> tuple[int, int, int, int] | None:
        """Serve spawn requests until the host is gone (None); each names its program's uid,
        which must lie in `uids`. Returns in each forked child,
        contained, with the four descriptors it keeps. None of CPython's after-fork work runs
        in the child: the caller must be single-threaded, and redoes what a program could
        tell apart itself. Raises OSError when the zygote cannot go on."""
        kept = (ctypes.c_int * 4)()
        while True:
            rc = self._serve(
                host,
                spawn,
                own_pid_ns,
                self._n_ns,
                self._types,
                uids.start,
                len(uids),
                seccomp.address,
                self.warm,
                self.n_base,
                len(self.warm) // 2,
                kept,
                self._error,
                len(self._error),
            )
            if rc != 2:
                break
            # A signal arrived: its Python handler runs here, between two calls (and may
            # raise, ending the zygote as it would any Python process), never in a child.
        if rc == 1:
            return kept[0], kept[1], kept[2], kept[3]
        if rc == 0:
            return None
        raise OSError(ctypes.get_errno(), self._error.value.decode("utf-8", "replace"))

    def set_warm(self, base: list[tuple[int, int]], more: list[tuple[int, int]]) -> None:
        """The [start, end) address ranges each forked program copies at once, contained,
        before it returns (see `program.learn_warm_pages`): `base` always, `more` too when
        its request asks for all its warm pages."""
        self.warm = self.warm_array(base + more)
        self.n_base = len(base)

    @staticmethod
    def warm_array(ranges: list[tuple[int, int]]) -> ctypes.Array[ctypes.c_uint64]:
        return (ctypes.c_uint64 * (2 * len(ranges)))(*(a for r in ranges for a in r))

    def fork(self) -> int:
        """libc's fork with the GIL held, like the server's: CPython's after-fork work does
        not run in the child (the caller must be single-threaded)."""
        pid = self._fork()
        if pid < 0:
            raise OSError(ctypes.get_errno(), "fork")
        return int(pid)

    def report_written(self, ranges: ctypes.Array[ctypes.c_uint64], out: int) -> None:
        """Write to `out` which pages of `ranges` this process has written (see
        `execbox_written_pages`)."""
        if self._written(ranges, len(ranges) // 2, out):
            raise OSError(ctypes.get_errno(), "read /proc/self/pagemap")


# Which of its zygote's warm pages a staged program copies (`native/contain.c`).
WARM_BASE = 0  # the pages every program of its zygote writes
WARM_ALL = 1  # those and the rest (a "pandas" slot's: see `protocol.SLOT_KINDS`)
WARM_NONE = 2  # none: its slot is in demand (see `supervisor`)


class _StageArgs(ctypes.Structure):
    _fields_ = [
        ("first", ctypes.c_int),
        ("n_scratch", ctypes.c_int),
        ("scratch", ctypes.POINTER(ctypes.c_char_p)),
        ("options", ctypes.POINTER(ctypes.c_char_p)),
        ("flags", ctypes.POINTER(ctypes.c_ulong)),
        ("own_pid_ns", ctypes.c_int),
        ("n_cgroups", ctypes.c_int),
        ("cgroup_procs", ctypes.POINTER(ctypes.c_int)),
        ("init", ctypes.c_char_p),
        ("init_uid", ctypes.c_char_p),
        ("spawn", ctypes.c_int),
        ("warm", ctypes.c_int),
        ("uid", ctypes.c_uint),
        ("net_dir", ctypes.c_int),
    ]


class StagedRun(ctypes.Structure):
    """What `Stager.stage` opened: init's pid, the host's ends of stdin, stdout and stderr,
    the supervisor's ends of the program's error, set-up, exit status, code and exit-report
    pipes; and whether the run got a new network namespace (`fresh_net`)."""

    _fields_ = [
        (name, ctypes.c_int)
        for name in (
            "init_pid",
            "stdin_w",
            "stdout_r",
            "stderr_r",
            "err_r",
            "setup_r",
            "status_r",
            "go_w",
            "done_r",
            "fresh_net",
        )
    ]


def _strings(values: list[str]) -> ctypes.Array[ctypes.c_char_p]:
    return (ctypes.c_char_p * len(values))(*(v.encode() for v in values))


class Stager:
    """A slot's staging of each run, in C (`native/stage.c`): the arguments, fixed for the
    slot's life, are laid out once."""

    def __init__(
        self,
        path: str,
        *,
        scratch: list[tuple[str, str, int]],
        own_pid_ns: int,
        cgroup_procs: list[int],
        init: str,
        init_uid: int,
        spawn: int,
        uid: int,
        net_dir: int,
    ) -> None:
        stage = ctypes.CDLL(path, use_errno=True).execbox_stage_run
        stage.restype = ctypes.c_int
        stage.argtypes = [
            ctypes.POINTER(_StageArgs),
            ctypes.POINTER(StagedRun),
            ctypes.c_char_p,
            ctypes.c_size_t,
        ]
        self._stage = stage
        # Kept here: the structure points into these.
        self._arrays = (
            _strings([p for p, _, _ in scratch]),
            _strings([o for _, o, _ in scratch]),
            (ctypes.c_ulong * len(scratch))(*(f for _, _, f in scratch)),
            (ctypes.c_int * len(cgroup_procs))(*cgroup_procs),
            init.encode(),
            str(init_uid).encode(),
        )
        paths, options, flags, procs, init_b, uid_b = self._arrays
        self._args = _StageArgs(
            1,
            len(scratch),
            paths,
            options,
            flags,
            own_pid_ns,
            len(cgroup_procs),
            procs,
            init_b,
            uid_b,
            spawn,
            WARM_BASE,
            uid,
            net_dir,
        )
        self._error = ctypes.create_string_buffer(1024)

    def stage(self, first: bool, warm: int) -> tuple[StagedRun, str | None]:
        """Stage one run, its program copying the `warm` pages (WARM_*); returns what was
        opened and, when a step failed, why (everything but init is then closed again: a
        started init is the caller's to kill)."""
        self._args.first = int(first)
        self._args.warm = warm
        out = StagedRun()
        if self._stage(ctypes.byref(self._args), ctypes.byref(out), self._error, len(self._error)):
            return out, self._error.value.decode("utf-8", "replace")
        return out, None


class _Counters(ctypes.Structure):
    _fields_ = [
        ("cpu_fd", ctypes.c_int),
        ("cpu_v2", ctypes.c_int),
        ("oom_fd", ctypes.c_int),
        ("peak_fd", ctypes.c_int),
        ("peak_resets", ctypes.c_int),
        ("stat_fd", ctypes.c_int),
        ("file_keys", ctypes.c_char_p * 2),
        ("file_base", ctypes.c_longlong),
    ]


class Baselines(ctypes.Structure):
    """A staged run's baselines, taken once its program waits for its code: when (on
    CLOCK_MONOTONIC, as `time.monotonic`), the cgroup's CPU and OOM kills, and the run's
    token."""

    _fields_ = [
        ("parked", ctypes.c_int),
        ("parked_at", ctypes.c_double),
        ("cpu_ns", ctypes.c_longlong),
        ("oom_kills", ctypes.c_longlong),
        ("token", ctypes.c_char * 33),
    ]


class _Watch(ctypes.Structure):
    _fields_ = [
        ("done_r", ctypes.c_int),
        ("status_r", ctypes.c_int),
        ("ctrl", ctypes.c_int),
        ("deadline", ctypes.c_double),
        ("next_cpu_check", ctypes.c_double),
        ("cpu_s", ctypes.c_double),
        ("cpu_base", ctypes.c_longlong),
        ("token", ctypes.c_char_p),
        ("tail", ctypes.c_char * 32),
        ("tail_len", ctypes.c_int),
        ("junk", ctypes.c_longlong),
        ("status", ctypes.c_int),
    ]


class _Collected(ctypes.Structure):
    _fields_ = [
        ("cpu_ns", ctypes.c_longlong),
        ("oom_kills", ctypes.c_longlong),
        ("memory_peak", ctypes.c_longlong),
        ("err_len", ctypes.c_size_t),
        ("setup_len", ctypes.c_size_t),
        ("workspace_inodes", ctypes.c_longlong),
    ]


# How `SlotSteps.watch` saw a run end (`native/supervise.c`).
WATCH_REPORTED, WATCH_ENDED, WATCH_HOST, WATCH_TIMEOUT, WATCH_CPU = 1, 2, 3, 4, 5


class Collected:
    """What a run left to read once it ended: its error and set-up pipes' bytes, the
    cgroup's counters, and the inodes in use on /workspace (-1: unknown)."""

    __slots__ = ("error", "setup", "cpu_ns", "oom_kills", "memory_peak", "workspace_inodes")

    def __init__(
        self,
        error: bytes,
        setup: bytes,
        cpu_ns: int,
        oom_kills: int,
        memory_peak: int | None,
        workspace_inodes: int,
    ) -> None:
        self.error, self.setup = error, setup
        self.cpu_ns, self.oom_kills, self.memory_peak = cpu_ns, oom_kills, memory_peak
        self.workspace_inodes = workspace_inodes


class SlotSteps:
    """A supervisor's per-run steps that are mostly system calls, in C (`native/supervise.c`):
    the hand-over of a staged run (RDY, PRK and the baselines), the wait for its end, what it
    left and the teardown. `counters`: the cgroup's counter files (`RunCgroup.counter_files`);
    `cgroup_dirs`: its directories, one per controller."""

    ERROR_READ = 128 * 1024  # of a run's structured error: the most the supervisor parses
    SETUP_READ = 64 * 1024

    def __init__(
        self,
        path: str,
        counters: tuple[int, bool, int, int, bool, int, tuple[str, str]],
        cgroup_dirs: list[int],
        failure: type[Exception],
    ) -> None:
        self._failure = failure  # raised with "<step>: <error>" when a step fails
        lib = ctypes.CDLL(path, use_errno=True)
        err_t, size_t, int_p = ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)
        self._hand_over = lib.execbox_hand_over
        self._hand_over.argtypes = [ctypes.c_int, ctypes.c_int, int_p, ctypes.c_int, err_t, size_t]
        self._await = lib.execbox_await_request
        self._await.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(_Counters),
            ctypes.c_char_p,
            ctypes.POINTER(Baselines),
            err_t,
            size_t,
        ]
        self._await_parked = lib.execbox_await_parked
        self._await_parked.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.POINTER(_Counters),
            ctypes.POINTER(Baselines),
            err_t,
            size_t,
        ]
        self._reset_peak = lib.execbox_reset_peak
        self._reset_peak.restype = None
        self._reset_peak.argtypes = [ctypes.POINTER(_Counters)]
        self._watch = lib.execbox_watch
        self._watch.argtypes = [ctypes.POINTER(_Watch), ctypes.POINTER(_Counters), err_t, size_t]
        self._collect = lib.execbox_collect
        self._collect.argtypes = [
            ctypes.POINTER(_Counters),
            ctypes.c_int,
            ctypes.c_void_p,
            size_t,
            ctypes.c_int,
            ctypes.c_void_p,
            size_t,
            ctypes.POINTER(_Collected),
            err_t,
            size_t,
        ]
        self._end_init = lib.execbox_end_init
        self._end_init.restype = None
        self._end_init.argtypes = [ctypes.c_int, ctypes.c_int]
        self._has_processes = lib.execbox_cgroup_has_processes
        self._has_processes.argtypes = [int_p, ctypes.c_int, err_t, size_t]
        self._end_run = lib.execbox_end_run
        self._end_run.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            int_p,
            ctypes.c_int,
            int_p,
            ctypes.c_int,
            err_t,
            size_t,
        ]
        cpu, v2, oom, peak, resets, stat, keys = counters
        self._keys = (ctypes.c_char_p * 2)(*(k.encode() for k in keys))
        self._counters = _Counters(cpu, int(v2), oom, peak, int(resets), stat, self._keys, 0)
        self._dirs = (ctypes.c_int * len(cgroup_dirs))(*cgroup_dirs)
        self.baselines = Baselines()
        self._watching = _Watch()
        self._collected = _Collected()
        self._err_buf = ctypes.create_string_buffer(self.ERROR_READ)
        self._setup_buf = ctypes.create_string_buffer(self.SETUP_READ)
        self._error = ctypes.create_string_buffer(1024)

    def _failed(self) -> Exception:
        return self._failure(self._error.value.decode("utf-8", "replace"))

    def hand_over(self, ctrl: int, wait_next: bool, host_fds: list[int]) -> bool:
        """RDY with `host_fds` (closed here), after the host's NEXT when `wait_next`; False
        when the host closed the slot first."""
        fds = (ctypes.c_int * len(host_fds))(*host_fds)
        rc = self._hand_over(
            ctrl, int(wait_next), fds, len(host_fds), self._error, len(self._error)
        )
        if rc < 0:
            raise self._failed()
        return bool(rc)

    def new_run(self) -> None:
        """A run is staged: no baselines yet."""
        self.baselines.parked = 0

    def await_request(self, ctrl: int, done_r: int, go_w: int, offer: bytes) -> bool:
        """Wait until the host's next frame can be read (True), meanwhile taking the run's
        baselines and offering the short way once its program waits for its code; False when
        the host closed the slot as the program got ready."""
        rc = self._await(
            ctrl,
            done_r,
            go_w,
            ctypes.byref(self._counters),
            offer,
            ctypes.byref(self.baselines),
            self._error,
            len(self._error),
        )
        if rc < 0:
            raise self._failed()
        return bool(rc)

    def await_parked(self, done_r: int, wait_s: float) -> bool | None:
        """For a request that came the long way: wait at most `wait_s` for the program to
        say it waits for its code (True, its baselines then taken); False when it ended in
        set-up instead, None when it said nothing in time."""
        rc = self._await_parked(
            done_r,
            int(wait_s * 1000) + 1,
            ctypes.byref(self._counters),
            ctypes.byref(self.baselines),
            self._error,
            len(self._error),
        )
        if rc == -1:
            raise self._failed()
        return None if rc == -2 else bool(rc)

    def reset_peak(self) -> None:
        """Start the run's memory peak over (see `RunCgroup.reset_memory_peak`)."""
        self._reset_peak(ctypes.byref(self._counters))

    def start_watch(
        self,
        done_r: int,
        status_r: int,
        ctrl: int,
        deadline: float,
        first_cpu_check: float,
        cpu_s: float,
    ) -> None:
        w = self._watching
        w.done_r, w.status_r, w.ctrl = done_r, status_r, ctrl
        w.deadline, w.next_cpu_check, w.cpu_s = deadline, first_cpu_check, cpu_s
        w.cpu_base, w.token = self.baselines.cpu_ns, self.baselines.token
        w.tail_len, w.junk, w.status = 0, 0, 0

    def watch(self) -> tuple[int, int]:
        """Wait for the watched run's end (WATCH_*) and its reported wait status."""
        rc = self._watch(
            ctypes.byref(self._watching),
            ctypes.byref(self._counters),
            self._error,
            len(self._error),
        )
        if rc < 0:
            raise self._failed()
        return rc, self._watching.status

    def collect(self, err_r: int, setup_r: int) -> Collected:
        out = self._collected
        if self._collect(
            ctypes.byref(self._counters),
            err_r,
            self._err_buf,
            self.ERROR_READ,
            setup_r,
            self._setup_buf,
            self.SETUP_READ,
            ctypes.byref(out),
            self._error,
            len(self._error),
        ):
            raise self._failed()
        return Collected(
            ctypes.string_at(self._err_buf, out.err_len),
            ctypes.string_at(self._setup_buf, out.setup_len),
            out.cpu_ns,
            out.oom_kills,
            None if out.memory_peak < 0 else out.memory_peak,  # the kernel keeps none
            out.workspace_inodes,
        )

    def end_init(self, pid: int, wait_s: float) -> None:
        """Kill init (everything of its pid namespace dies with it) and reap it, waiting at
        most `wait_s`."""
        self._end_init(pid, int(wait_s * 1000))

    def has_processes(self) -> bool:
        """Whether any process is in the slot's cgroup (in any controller's directory): the
        check `end_run` makes."""
        rc = self._has_processes(self._dirs, len(self._dirs), self._error, len(self._error))
        if rc < 0:
            raise self._failed()
        return bool(rc)

    def end_run(self, init_pid: int, wait_s: float, fds: list[int]) -> bool:
        """Init ended (see `end_init`), `fds` closed, /proc unmounted; whether processes of
        the run survived in its cgroup."""
        array = (ctypes.c_int * len(fds))(*fds)
        rc = self._end_run(
            init_pid,
            int(wait_s * 1000),
            array,
            len(fds),
            self._dirs,
            len(self._dirs),
            self._error,
            len(self._error),
        )
        if rc < 0:
            raise self._failed()
        return bool(rc)


def loopback_up() -> None:
    """Bring `lo` up in the current network namespace (so code can talk to itself)."""
    import fcntl
    import socket

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock.fileno(), siocgifflags, req))[1]
        fcntl.ioctl(sock.fileno(), siocsifflags, struct.pack("16sH14x", b"lo", flags | iff_up))


def cap_last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as fh:
            return int(fh.read())
    except OSError:
        return 40
