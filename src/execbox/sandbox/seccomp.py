"""The syscall filter, compiled once with libseccomp and loaded as raw BPF.

Policy: allow by default, and take away what data code never needs and exploits love.
- Kill the process (status `forbidden`): tracing and reading other processes' memory, BPF, kernel
  modules and kexec, the kernel keyring, userfaultfd, perf events, io_uring, handle-based opens,
  and host administration (reboot, swap, clock setting, quotas, accounting).
- Fail with EPERM (the program sees PermissionError and can go on): mount and the new mount API,
  unshare, setns, chroot, pivot_root, clone with namespace flags, sethostname, TIOCSTI.
- Fail with EAFNOSUPPORT / EPERM: netlink and packet sockets, raw sockets.
- `clone3` fails with ENOSYS so glibc falls back to `clone`, whose flags we can inspect.

Loaded in two parts (`compile_split`), whose conjunction is the whole filter: a program
zygote installs the zygote part once, before it serves, and every program it forks inherits
it; each program adds the program part as its last contain step. The zygote part is the policy
less the calls the zygote's fork server and a program's contain steps still make (`setns`);
the program part refuses those. A program installing the whole filter cost it ~50-100 us of
CPU per run (the kernel converts, compiles and caches a filter at each install; 109
instructions against 9).

Standard library only (ctypes): the zygote imports this inside the runtime image.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable

from . import _linux

ACT_KILL_PROCESS = 0x80000000
ACT_ALLOW = 0x7FFF0000
_ACT_ERRNO = 0x00050000
_FLTATR_ACT_BADARCH = 2  # SCMP_FLTATR_ACT_BADARCH
_FLTATR_CTL_NNP = 3
_CMP_EQ = 4
_CMP_MASKED_EQ = 7


def act_errno(code: int) -> int:
    return _ACT_ERRNO | (code & 0xFFFF)


KILLED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "bpf", "perf_event_open", "userfaultfd",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "keyctl", "add_key", "request_key",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "open_by_handle_at", "name_to_handle_at",
    "reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "iopl", "ioperm", "uselib", "lookup_dcookie", "vhangup", "fanotify_init",
)
DENIED_EPERM = (
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns",
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
    "sethostname", "setdomainname",
)
# What a program zygote's fork server (into each slot's pid namespace) and a program's contain
# steps (into its slot's namespaces) call after the zygote part is installed: refused by the
# program part instead.
CONTAIN_CALLS = ("setns",)

_AF_NETLINK = 16
_AF_PACKET = 17
_SOCK_RAW = 3
_SOCK_PACKET = 10
_TIOCSTI = 0x5412


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _lib() -> ctypes.CDLL:
    try:  # its soname since 2.0 (see `_linux`: no `ctypes.util` in a zygote)
        lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError as exc:
        raise OSError(0, f"libseccomp not found ({exc}); install libseccomp2") from exc
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_ArgCmp)
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


_Rule = Callable[..., None]  # rule(action, syscall name, *argument comparisons)


def _compile(add_rules: Callable[[_Rule], None]) -> bytes:
    """A filter that allows by default, with the rules `add_rules` adds through the `rule` it
    is given, exported by libseccomp as a classic BPF program. A call from another
    architecture's ABI kills the process."""
    lib = _lib()
    ctx = lib.seccomp_init(ACT_ALLOW)
    if not ctx:
        raise OSError(0, "seccomp_init failed")
    try:

        def check(rc: int, what: str) -> None:
            if rc < 0:
                raise OSError(-rc, f"seccomp: {what}: {os.strerror(-rc)}")

        def rule(action: int, name: str, *cmps: tuple[int, int, int, int]) -> None:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:  # not on this architecture
                return
            arr = (_ArgCmp * max(len(cmps), 1))(*[_ArgCmp(*c) for c in cmps])
            check(lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr), f"rule {name}")

        check(lib.seccomp_attr_set(ctx, _FLTATR_ACT_BADARCH, ACT_KILL_PROCESS), "badarch")
        check(lib.seccomp_attr_set(ctx, _FLTATR_CTL_NNP, 0), "nnp")
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

    def policy(rule: _Rule) -> None:
        for name in KILLED:
            rule(ACT_KILL_PROCESS, name)
        for name in DENIED_EPERM:
            if name not in leave_out:
                rule(act_errno(errno.EPERM), name)
        rule(act_errno(errno.ENOSYS), "clone3")
        for flag in (
            _linux.CLONE_NEWNS, _linux.CLONE_NEWCGROUP, _linux.CLONE_NEWUTS, _linux.CLONE_NEWIPC,
            _linux.CLONE_NEWUSER, _linux.CLONE_NEWPID, _linux.CLONE_NEWNET,
        ):
            rule(act_errno(errno.EPERM), "clone", (0, _CMP_MASKED_EQ, flag, flag))
        for family in (_AF_NETLINK, _AF_PACKET):
            rule(act_errno(errno.EAFNOSUPPORT), "socket", (0, _CMP_EQ, family, 0))
        for sock_type in (_SOCK_RAW, _SOCK_PACKET):
            rule(act_errno(errno.EPERM), "socket", (1, _CMP_MASKED_EQ, 0xF, sock_type))
        rule(act_errno(errno.EPERM), "ioctl", (1, _CMP_MASKED_EQ, 0xFFFFFFFF, _TIOCSTI))

    return _compile(policy)


def compile_split() -> tuple[bytes, bytes]:
    """The filter in two parts (see the module's docstring): (the zygote part, the program
    part). Installed both, they refuse exactly what `compile_filter()` refuses, each call with
    the same action: the program part refuses only calls the zygote part allows."""
    if not set(CONTAIN_CALLS) <= set(DENIED_EPERM):
        raise OSError(0, "seccomp: the program part may only refuse calls the policy refuses")

    def contain_calls(rule: _Rule) -> None:
        for name in CONTAIN_CALLS:
            rule(act_errno(errno.EPERM), name)

    return compile_filter(leave_out=CONTAIN_CALLS), _compile(contain_calls)
