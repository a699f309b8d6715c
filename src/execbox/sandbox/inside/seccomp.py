"""The syscall filter, compiled once with libseccomp and loaded as raw BPF.

Policy: an allow list (`ALLOWED`: what Python, numpy, pandas, matplotlib, scipy, subprocesses,
threads, multiprocessing and loopback sockets call, and the runner and contain steps); every
other call fails with ENOSYS, as on a kernel without it, so libraries fall back. Some calls are
named with another verdict (`REFUSED`):
- Kill the process (status `forbidden`): tracing and reading other processes' memory, BPF, kernel
  modules and kexec, the kernel keyring, userfaultfd, perf events, io_uring, handle-based opens,
  and host administration (reboot, swap, clock setting, quotas, accounting).
- Fail with EPERM (the program sees PermissionError and can go on): mount and the new mount API,
  unshare, setns, chroot, pivot_root, sethostname.
- Fail with ENOSYS, named for the record: `clone3` (glibc falls back to `clone`, whose flags we
  can read), and what only observes the host through the shared kernel (inotify on the shared
  read-only tree, mincore and cachestat on the shared page cache).
A few allowed calls depend on an argument (`ARGUMENT_RULES`), always its low 32 bits, which is
all the kernel reads of an `int`: socket families other than AF_UNIX, AF_INET and AF_INET6
fail with EAFNOSUPPORT, raw and packet sockets with EPERM; clone with namespace flags, and
TIOCSTI, with EPERM; preadv2 and pwritev2 with RWF_NOWAIT (a page-cache probe) with EOPNOTSUPP.
`verdict` reads these tables as the kernel should; the tests check the compiled BPF against it
for every call number.

Loaded in two parts (`compile_split`), whose conjunction is the whole filter: a program
zygote installs the zygote part once, before it serves, and every program it forks inherits
it; each program adds the program part as its last contain step. The zygote part is the policy
less the calls the zygote's fork server and a program's contain steps still make (`setns`);
the program part refuses those. A program installing the whole filter cost it ~50-100 us of
CPU per run (the kernel converts, compiles and caches a filter at each install).

Standard library only (ctypes): the zygote imports this inside the runtime image.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from . import linux

ACT_KILL_PROCESS = 0x80000000
ACT_ALLOW = 0x7FFF0000
_ACT_ERRNO = 0x00050000
_FLTATR_ACT_BADARCH = 2  # SCMP_FLTATR_ACT_BADARCH
_FLTATR_CTL_NNP = 3
_FLTATR_CTL_OPTIMIZE = 8  # 2: dispatch the call number through a binary tree (libseccomp 2.5)
_CMP_MASKED_EQ = 7
_LOW_32 = 0xFFFFFFFF


def act_errno(code: int) -> int:
    return _ACT_ERRNO | (code & 0xFFFF)


KILL = ACT_KILL_PROCESS
EPERM = act_errno(errno.EPERM)
ENOSYS = act_errno(errno.ENOSYS)
DEFAULT = ENOSYS  # every call not named below

ALLOWED = frozenset(
    (
        # descriptors, files and directories
        "read",
        "write",
        "readv",
        "writev",
        "pread64",
        "pwrite64",
        "preadv",
        "pwritev",
        "open",
        "openat",
        "openat2",
        "creat",
        "close",
        "close_range",
        "dup",
        "dup2",
        "dup3",
        "lseek",
        "fcntl",
        "flock",
        "fsync",
        "fdatasync",
        "ftruncate",
        "truncate",
        "fallocate",
        "fadvise64",
        "sendfile",
        "copy_file_range",
        "splice",
        "tee",
        "stat",
        "fstat",
        "lstat",
        "newfstatat",
        "statx",
        "statfs",
        "fstatfs",
        "access",
        "faccessat",
        "faccessat2",
        "readlink",
        "readlinkat",
        "getdents",
        "getdents64",
        "getcwd",
        "chdir",
        "fchdir",
        "mkdir",
        "mkdirat",
        "rmdir",
        "unlink",
        "unlinkat",
        "rename",
        "renameat",
        "renameat2",
        "link",
        "linkat",
        "symlink",
        "symlinkat",
        "chmod",
        "fchmod",
        "fchmodat",
        "chown",
        "fchown",
        "lchown",
        "fchownat",
        "utime",
        "utimes",
        "utimensat",
        "futimesat",
        "mknod",
        "mknodat",
        "umask",
        "getxattr",
        "lgetxattr",
        "fgetxattr",
        "setxattr",
        "lsetxattr",
        "fsetxattr",
        "listxattr",
        "llistxattr",
        "flistxattr",
        "removexattr",
        "lremovexattr",
        "fremovexattr",
        "pipe",
        "pipe2",
        "ioctl",
        # memory
        "brk",
        "mmap",
        "munmap",
        "mremap",
        "mprotect",
        "madvise",
        "msync",
        "memfd_create",
        "mbind",
        "get_mempolicy",
        "set_mempolicy",
        # processes and threads
        "clone",
        "fork",
        "vfork",
        "execve",
        "execveat",
        "exit",
        "exit_group",
        "wait4",
        "waitid",
        "kill",
        "tkill",
        "tgkill",
        "pidfd_open",
        "pidfd_send_signal",
        "getpid",
        "getppid",
        "gettid",
        "getpgid",
        "getpgrp",
        "setpgid",
        "getsid",
        "setsid",
        "set_tid_address",
        "set_robust_list",
        "rseq",
        "futex",
        "arch_prctl",
        "prctl",
        "sched_yield",
        "sched_getaffinity",
        "sched_setaffinity",
        "sched_getparam",
        "sched_setparam",
        "sched_getscheduler",
        "sched_setscheduler",
        "sched_getattr",
        "sched_setattr",
        "sched_get_priority_max",
        "sched_get_priority_min",
        "sched_rr_get_interval",
        "getpriority",
        "setpriority",
        "ioprio_get",
        "ioprio_set",
        "getcpu",
        "getrlimit",
        "setrlimit",
        "prlimit64",
        "getrusage",
        "times",
        "uname",
        "sysinfo",
        # credentials: the contain steps drop them; without capabilities a change is refused
        "capget",
        "capset",
        "getuid",
        "geteuid",
        "getgid",
        "getegid",
        "getresuid",
        "getresgid",
        "getgroups",
        "setuid",
        "setgid",
        "setreuid",
        "setregid",
        "setresuid",
        "setresgid",
        "setgroups",
        "setfsuid",
        "setfsgid",
        # signals and time
        "rt_sigaction",
        "rt_sigprocmask",
        "rt_sigreturn",
        "rt_sigsuspend",
        "rt_sigpending",
        "rt_sigtimedwait",
        "rt_sigqueueinfo",
        "rt_tgsigqueueinfo",
        "sigaltstack",
        "pause",
        "alarm",
        "getitimer",
        "setitimer",
        "signalfd",
        "signalfd4",
        "restart_syscall",
        "clock_gettime",
        "clock_getres",
        "clock_nanosleep",
        "nanosleep",
        "gettimeofday",
        "time",
        "timer_create",
        "timer_settime",
        "timer_gettime",
        "timer_getoverrun",
        "timer_delete",
        "timerfd_create",
        "timerfd_settime",
        "timerfd_gettime",
        # waiting for events
        "poll",
        "ppoll",
        "select",
        "pselect6",
        "epoll_create",
        "epoll_create1",
        "epoll_ctl",
        "epoll_wait",
        "epoll_pwait",
        "epoll_pwait2",
        "eventfd",
        "eventfd2",
        # sockets (families and types: `ARGUMENT_RULES`) and System V IPC (the slot's own)
        "socket",
        "socketpair",
        "bind",
        "listen",
        "accept",
        "accept4",
        "connect",
        "shutdown",
        "getsockname",
        "getpeername",
        "setsockopt",
        "getsockopt",
        "sendto",
        "recvfrom",
        "sendmsg",
        "recvmsg",
        "sendmmsg",
        "recvmmsg",
        "shmget",
        "shmat",
        "shmdt",
        "shmctl",
        "semget",
        "semop",
        "semtimedop",
        "semctl",
        "msgget",
        "msgsnd",
        "msgrcv",
        "msgctl",
        "getrandom",
        "preadv2",
        "pwritev2",
    )
)

REFUSED: dict[str, int] = {
    **dict.fromkeys(
        (
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "kcmp",
            "pidfd_getfd",
            "bpf",
            "perf_event_open",
            "userfaultfd",
            "init_module",
            "finit_module",
            "delete_module",
            "kexec_load",
            "kexec_file_load",
            "keyctl",
            "add_key",
            "request_key",
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "open_by_handle_at",
            "name_to_handle_at",
            "reboot",
            "swapon",
            "swapoff",
            "acct",
            "quotactl",
            "quotactl_fd",
            "syslog",
            "settimeofday",
            "clock_settime",
            "clock_adjtime",
            "adjtimex",
            "iopl",
            "ioperm",
            "uselib",
            "lookup_dcookie",
            "vhangup",
            "fanotify_init",
        ),
        KILL,
    ),
    **dict.fromkeys(
        (
            "mount",
            "umount2",
            "pivot_root",
            "chroot",
            "unshare",
            "setns",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "move_mount",
            "open_tree",
            "mount_setattr",
            "sethostname",
            "setdomainname",
        ),
        EPERM,
    ),
    "clone3": ENOSYS,
    # They observe the host: the read-only tree shares its inodes and page cache with it.
    **dict.fromkeys(
        (
            "inotify_init",
            "inotify_init1",
            "inotify_add_watch",
            "inotify_rm_watch",
            "mincore",
            "cachestat",
        ),
        ENOSYS,
    ),
}
# What a program zygote's fork server (into each slot's pid namespace) and a program's contain
# steps (into its slot's namespaces) call after the zygote part is installed: refused by the
# program part instead.
CONTAIN_CALLS = ("setns",)


@dataclass(frozen=True)
class Arg:
    """A verdict read from one argument's bits `mask` (within its low 32: the kernel reads
    an `int`, whatever the register's high half holds): `cases` maps a value of those bits
    to a verdict, `otherwise` gives the rest theirs. A verdict is an action or, to read a
    second argument, another `Arg`."""

    index: int
    mask: int
    cases: dict[int, int | Arg]
    otherwise: int | Arg


_AF_UNIX, _AF_INET, _AF_INET6 = 1, 2, 10
_SOCK_TYPE_MASK = 0xF  # the rest of `type` is SOCK_NONBLOCK and SOCK_CLOEXEC
_SOCK_RAW, _SOCK_PACKET = 3, 10
_TIOCSTI = 0x5412
_RWF_NOWAIT = 0x8

_SOCKET_TYPE = Arg(1, _SOCK_TYPE_MASK, dict.fromkeys((_SOCK_RAW, _SOCK_PACKET), EPERM), ACT_ALLOW)
_NOT_NOWAIT = Arg(5, _RWF_NOWAIT, {_RWF_NOWAIT: act_errno(errno.EOPNOTSUPP)}, ACT_ALLOW)
ARGUMENT_RULES: dict[str, Arg] = {
    "socket": Arg(
        0,
        _LOW_32,
        dict.fromkeys((_AF_UNIX, _AF_INET, _AF_INET6), _SOCKET_TYPE),
        act_errno(errno.EAFNOSUPPORT),
    ),
    "socketpair": Arg(0, _LOW_32, {_AF_UNIX: ACT_ALLOW}, act_errno(errno.EAFNOSUPPORT)),
    "clone": Arg(0, linux.NAMESPACE_FLAGS, {0: ACT_ALLOW}, EPERM),
    "ioctl": Arg(1, _LOW_32, {_TIOCSTI: EPERM}, ACT_ALLOW),
    "preadv2": _NOT_NOWAIT,
    "pwritev2": _NOT_NOWAIT,
}


def _rule(name: str, leave_out: tuple[str, ...]) -> int | Arg:
    if name in leave_out:
        return ACT_ALLOW
    if name in REFUSED:
        return REFUSED[name]
    if name in ALLOWED:
        return ARGUMENT_RULES.get(name, ACT_ALLOW)
    return DEFAULT


def verdict(name: str, args: Sequence[int] = (), leave_out: tuple[str, ...] = ()) -> int:
    """The action the policy gives call `name` with these arguments (missing ones are 0); the
    calls in `leave_out` are allowed."""
    rule = _rule(name, leave_out)
    while isinstance(rule, Arg):
        value = (args[rule.index] if rule.index < len(args) else 0) & rule.mask
        rule = rule.cases.get(value, rule.otherwise)
    return rule


_Cmp = tuple[int, int, int, int]  # (argument, SCMP_CMP_*, mask, value), as libseccomp takes it


def _other_values(mask: int, values: Sequence[int]) -> Iterator[tuple[int, int]]:
    """Disjoint (mask, value) patterns that together match every value of the bits `mask`
    except `values`: walking the bits from the highest, each branch that holds none of
    `values` becomes one pattern."""
    bits = [1 << b for b in range(31, -1, -1) if mask & (1 << b)]

    def walk(depth: int, prefix_mask: int, prefix: int) -> Iterator[tuple[int, int]]:
        inside = [v for v in values if v & prefix_mask == prefix]
        if not inside:
            yield prefix_mask, prefix
        elif depth < len(bits):
            for bit_value in (0, bits[depth]):
                yield from walk(depth + 1, prefix_mask | bits[depth], prefix | bit_value)

    yield from walk(0, 0, 0)


def _chains(rule: int | Arg, cmps: tuple[_Cmp, ...] = ()) -> Iterator[tuple[int, tuple[_Cmp, ...]]]:
    """The rule as disjoint (action, comparisons) chains, each comparison on the low 32 bits."""
    if not isinstance(rule, Arg):
        yield rule, cmps
        return
    if any(cmp[0] == rule.index for cmp in cmps):
        raise ValueError(f"seccomp: argument {rule.index} read twice in one rule")
    for value, then in rule.cases.items():
        yield from _chains(then, (*cmps, (rule.index, _CMP_MASKED_EQ, rule.mask, value)))
    for mask, value in _other_values(rule.mask, list(rule.cases)):
        yield from _chains(rule.otherwise, (*cmps, (rule.index, _CMP_MASKED_EQ, mask, value)))


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _lib() -> ctypes.CDLL:
    try:  # its soname since 2.0 (see `linux`: no `ctypes.util` in a zygote)
        lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError as exc:
        raise OSError(0, f"libseccomp not found ({exc}); install libseccomp2") from exc
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


_Rule = Callable[..., None]  # rule(action, syscall name, *argument comparisons)


def _compile(add_rules: Callable[[_Rule], None], default: int) -> bytes:
    """A filter whose action is `default` but for the rules `add_rules` adds through the `rule`
    it is given, exported by libseccomp as a classic BPF program. A call from another
    architecture's ABI kills the process."""
    lib = _lib()
    ctx = lib.seccomp_init(default)
    if not ctx:
        raise OSError(0, "seccomp_init failed")
    try:

        def check(rc: int, what: str) -> None:
            if rc < 0:
                raise OSError(-rc, f"seccomp: {what}: {os.strerror(-rc)}")

        def rule(action: int, name: str, *cmps: _Cmp) -> None:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0 or action == default:  # not on this architecture, or nothing to add
                return
            arr = (_ArgCmp * max(len(cmps), 1))(*[_ArgCmp(*c) for c in cmps])
            check(lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr), f"rule {name}")

        check(lib.seccomp_attr_set(ctx, _FLTATR_ACT_BADARCH, ACT_KILL_PROCESS), "badarch")
        check(lib.seccomp_attr_set(ctx, _FLTATR_CTL_NNP, 0), "nnp")
        check(
            lib.seccomp_attr_set(ctx, _FLTATR_CTL_OPTIMIZE, 2),
            "binary tree (libseccomp 2.5 or newer)",
        )
        add_rules(rule)
        fd = os.memfd_create("execbox-seccomp")
        try:
            check(lib.seccomp_export_bpf(ctx, fd), "export")
            size = os.lseek(fd, 0, os.SEEK_END)
            return os.pread(fd, size, 0)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)


def compile_filter(leave_out: tuple[str, ...] = ()) -> bytes:
    """Build the filter with libseccomp and return it as a classic BPF program; the calls in
    `leave_out` are allowed."""
    if ALLOWED & REFUSED.keys() or not ARGUMENT_RULES.keys() <= ALLOWED:
        raise ValueError("seccomp: a call both allowed and refused, or a rule on a refused call")

    def policy(rule: _Rule) -> None:
        for name in sorted(ALLOWED | REFUSED.keys()):
            for action, cmps in _chains(_rule(name, leave_out)):
                rule(action, name, *cmps)

    return _compile(policy, DEFAULT)


def compile_split() -> tuple[bytes, bytes]:
    """The filter in two parts (see the module's docstring): (the zygote part, the program
    part). Installed both, they refuse exactly what `compile_filter()` refuses, each call with
    the same action: the program part refuses only calls the zygote part allows."""
    if any(REFUSED.get(name) != EPERM for name in CONTAIN_CALLS):
        raise OSError(0, "seccomp: the program part may only refuse calls the policy refuses")

    def contain_calls(rule: _Rule) -> None:
        for name in CONTAIN_CALLS:
            rule(REFUSED[name], name)

    return compile_filter(leave_out=CONTAIN_CALLS), _compile(contain_calls, ACT_ALLOW)
