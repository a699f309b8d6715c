"""The loaded filter gives every system call number of the architecture the verdict of the policy
table (`seccomp.verdict`), and every argument rule reads only the low 32 bits of its argument,
as the kernel does for an `int`. Checked on the bytes that are loaded, both parts together, by
evaluating them (`seccomp_bpf`); nothing is installed here. The table's own choices are pinned
by literal expectations below; that real programs get them is attacked in test_seccomp_jail."""

from __future__ import annotations

import ctypes
import errno
import itertools
import random

import pytest

from execbox.sandbox.inside import seccomp
from tests.sandbox.seccomp_bpf import (
    AUDIT_ARCH_AARCH64,
    AUDIT_ARCH_I386,
    AUDIT_ARCH_X86_64,
    X32_BIT,
    combined,
)

ALLOW = seccomp.ACT_ALLOW
KILL = seccomp.ACT_KILL_PROCESS
HIGH_HALVES = (0, 1 << 32, 0xFFFFFFFF << 32, 0x8000_0000 << 32)
LAST_NUMBER = 1023  # past the last call of any kernel yet (~470), with room

_lib = ctypes.CDLL("libseccomp.so.2")
_lib.seccomp_syscall_resolve_num_arch.argtypes = [ctypes.c_uint32, ctypes.c_int]
_lib.seccomp_syscall_resolve_num_arch.restype = ctypes.c_void_p
_lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
_libc = ctypes.CDLL(None)
_libc.free.argtypes = [ctypes.c_void_p]


def name_of(nr: int) -> str | None:
    """The native architecture's name for call `nr`, as libseccomp knows it."""
    found = _lib.seccomp_syscall_resolve_num_arch(0, nr)
    if not found:
        return None
    try:
        return ctypes.string_at(found).decode()
    finally:
        _libc.free(found)


def nr_of(name: str) -> int:
    return int(_lib.seccomp_syscall_resolve_name(name.encode()))


NATIVE = AUDIT_ARCH_X86_64 if nr_of("setns") == 308 else AUDIT_ARCH_AARCH64
PARTS = seccomp.compile_split()


def loaded(name_or_nr: str | int, *args: int) -> int:
    """What a program gets for this call: the zygote part and the program part, together."""
    nr = nr_of(name_or_nr) if isinstance(name_or_nr, str) else name_or_nr
    assert nr >= 0, name_or_nr
    return combined(PARTS, nr, NATIVE, args)


def errno_action(name: str) -> int:
    return seccomp.act_errno(getattr(errno, name))


def test_every_call_number_gets_the_verdict_of_the_policy_table() -> None:
    verdicts = {}
    for nr in range(LAST_NUMBER + 1):
        name = name_of(nr)
        expected = seccomp.verdict(name) if name else seccomp.DEFAULT
        verdicts[nr] = loaded(nr)
        assert verdicts[nr] == expected, (nr, name, hex(verdicts[nr]), hex(expected))
    # The table is an allow list: most numbers are refused, the allowed ones are all named.
    allowed = {nr for nr, action in verdicts.items() if action == ALLOW}
    assert {name_of(nr) for nr in allowed} <= seccomp.ALLOWED
    assert 150 < len(allowed) < 300 < LAST_NUMBER + 1 - len(allowed)
    # Numbers no kernel has yet, and -1, get the default (ENOSYS), neither allowed nor killed.
    for nr in (LAST_NUMBER + 1, 4095, 0xFFFF, 0x3FFFFFFF, 0xFFFFFFFF):
        assert loaded(nr) == seccomp.DEFAULT, hex(nr)


def test_other_abis_kill_the_process() -> None:
    for nr in range(0, LAST_NUMBER + 1, 7):
        assert combined(PARTS, nr, AUDIT_ARCH_I386, ()) == KILL, nr
        if NATIVE == AUDIT_ARCH_X86_64:  # x32 numbers come with the native arch
            assert combined(PARTS, nr | X32_BIT, NATIVE, ()) == KILL, nr


def _values(rule: seccomp.Arg, thorough: bool = True) -> list[int]:
    """Values of the rule's argument that tell its verdicts apart: each case, its neighbours,
    each bit alone and flipped in a case, the extremes, and some random ones (fewer of them
    when not `thorough`, for a rule reached through another)."""
    rng = random.Random(27)
    picks = {0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, rule.mask}
    for case in rule.cases:
        picks |= {case, case - 1 & 0xFFFFFFFF, case + 1 & 0xFFFFFFFF, case | 0x80000000}
        picks |= {case ^ (1 << b) for b in range(32) if thorough or (1 << b) & rule.mask}
    picks |= {1 << b for b in range(32) if thorough or (1 << b) & rule.mask}
    picks |= {rng.getrandbits(32) for _ in range(40 if thorough else 4)}
    return sorted(picks)


def _argument_cases(rule: seccomp.Arg) -> list[tuple[int, ...]]:
    """Argument tuples walking this rule and the rule it leads to, if any."""
    inner: list[seccomp.Arg] = []
    for then in [*rule.cases.values(), rule.otherwise]:
        if isinstance(then, seccomp.Arg) and all(then is not known for known in inner):
            inner.append(then)
    others = [[(nested.index, v) for v in _values(nested, thorough=False)] for nested in inner]
    cases = []
    for value in _values(rule):
        for combo in itertools.product(*others) if others else [()]:
            args = [0] * 6
            args[rule.index] = value
            for index, v in combo:
                args[index] = v
            cases.append(tuple(args))
    return cases


@pytest.mark.parametrize("name", sorted(seccomp.ARGUMENT_RULES))
def test_argument_rules_read_only_the_low_32_bits(name: str) -> None:
    if nr_of(name) < 0:
        pytest.skip(f"no {name} on this architecture")
    rule = seccomp.ARGUMENT_RULES[name]
    seen = set()
    for args in _argument_cases(rule):
        expected = seccomp.verdict(name, args)
        seen.add(expected)
        for high in HIGH_HALVES:
            # The high half of every argument the rules read: the kernel never looks at it.
            raised = tuple(a | high for a in args)
            got = loaded(name, *raised)
            assert got == expected, (name, [hex(a) for a in raised], hex(got), hex(expected))
    assert ALLOW in seen and len(seen) >= 2, (name, seen)  # the rule tells calls apart


def test_the_refusals_the_policy_promises() -> None:
    """Literal expectations, independent of the table: what docs/security.md says is refused."""
    af_netlink, af_packet, af_inet, af_inet6, af_unix = 16, 17, 2, 10, 1
    sock_stream, sock_dgram, sock_raw, sock_packet, sock_cloexec = 1, 2, 3, 10, 0x80000
    eafnosupport, eperm = errno_action("EAFNOSUPPORT"), errno_action("EPERM")
    # The bypass of issue 27: a family with a bit above the low 32 was not netlink to the filter.
    assert loaded("socket", (1 << 32) | af_netlink, sock_raw, 0) == eafnosupport
    assert loaded("socket", af_netlink, sock_dgram) == eafnosupport
    assert loaded("socket", af_packet, sock_dgram) == eafnosupport
    for family in (0, 3, 4, 5, 9, 11, 15, 16, 17, 30, 38, 40, 45, 46, 255, 0x10001):
        assert loaded("socket", family, sock_stream) == eafnosupport, family
        assert loaded("socketpair", family, sock_stream) == eafnosupport, family
    for family in (af_unix, af_inet, af_inet6):
        for kind in (sock_stream, sock_dgram, 5, sock_stream | sock_cloexec | 0x800):
            assert loaded("socket", family, kind) == ALLOW, (family, kind)
            assert loaded("socket", (1 << 32) | family, (1 << 32) | kind) == ALLOW, (family, kind)
        for kind in (sock_raw, sock_packet, sock_raw | sock_cloexec, (1 << 32) | sock_raw):
            assert loaded("socket", family, kind) == eperm, (family, kind)
    assert loaded("socketpair", af_unix, sock_stream) == ALLOW
    # clone: any namespace flag in the low 32 bits; a thread's or fork's flags pass.
    assert loaded("clone", 0x10000000 | (1 << 32)) == eperm  # CLONE_NEWUSER
    assert loaded("clone", 0x40000000) == eperm  # CLONE_NEWNET
    assert loaded("clone", 0x003D0F00) == ALLOW  # what pthread_create passes
    assert loaded("clone", 0x01200011 | (1 << 40)) == ALLOW  # fork
    assert loaded("clone3") == errno_action("ENOSYS")
    # TIOCSTI pushes input into a terminal, whatever the high half holds.
    assert loaded("ioctl", 1, 0x5412) == loaded("ioctl", 1, (1 << 32) | 0x5412) == eperm
    assert loaded("ioctl", 1, 0x5401) == ALLOW  # TCGETS: isatty
    # RWF_NOWAIT probes the page cache; other flags pass.
    eopnotsupp = errno_action("EOPNOTSUPP")
    for name in ("preadv2", "pwritev2"):
        assert loaded(name, 3, 0, 1, 0, 0, 0x8) == eopnotsupp
        assert loaded(name, 3, 0, 1, 0, 0, (1 << 32) | 0x9) == eopnotsupp
        assert loaded(name, 3, 0, 1, 0, 0, 0) == ALLOW
        assert loaded(name, 3, 0, 1, 0, 0, (1 << 32) | 0x1) == ALLOW  # RWF_HIPRI
    for name in (
        "ptrace",
        "bpf",
        "keyctl",
        "perf_event_open",
        "userfaultfd",
        "io_uring_setup",
        "process_vm_readv",
        "init_module",
        "kexec_load",
        "open_by_handle_at",
        "fanotify_init",
    ):
        assert loaded(name) == KILL, name
    for name in (
        "mount",
        "umount2",
        "unshare",
        "setns",
        "chroot",
        "pivot_root",
        "fsopen",
        "open_tree",
        "sethostname",
    ):
        assert loaded(name) == eperm, name
    # Host observation and what only new kernels have: not allowed (the default, ENOSYS).
    for name in (
        "inotify_init",
        "inotify_init1",
        "inotify_add_watch",
        "mincore",
        "cachestat",
        "modify_ldt",
        "personality",
        "memfd_secret",
        "landlock_create_ruleset",
        "landlock_add_rule",
        "landlock_restrict_self",
        "map_shadow_stack",
        "process_madvise",
        "futex_waitv",
        "io_setup",
        "mq_open",
        "readahead",
        "remap_file_pages",
        "seccomp",
        "vmsplice",
        "sync",
        "syncfs",
        "mlock",
    ):
        if nr_of(name) >= 0:
            assert loaded(name) == seccomp.DEFAULT, name
    assert seccomp.DEFAULT == errno_action("ENOSYS")
    if NATIVE == AUDIT_ARCH_X86_64:  # numbers libseccomp may not name yet
        for nr in (457, 458, 459, 460, 461, 462, 463, 464, 465, 466, 467, 468, 469, 470):
            assert loaded(nr) == seccomp.DEFAULT, nr  # statmount, listmount, lsm_*, mseal...
