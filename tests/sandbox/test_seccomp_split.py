"""The filter in two parts (a program zygote's and each program's) refuses exactly what the
whole filter refuses, with the same action, for every system call number and the arguments
the policy looks at. Checked by evaluating the classic BPF programs libseccomp exports, as the
kernel would, and combining the parts' actions by the kernel's precedence: no filter is
installed anywhere here (a filter that failed to refuse would let this process unshare or
mount on the host). That real programs get the refusals is attacked in test_isolation."""

from __future__ import annotations

import errno

import pytest

from execbox.sandbox.inside import seccomp
from tests.sandbox.seccomp_bpf import (
    AUDIT_ARCH_AARCH64,
    AUDIT_ARCH_I386,
    AUDIT_ARCH_X86_64,
    X32_BIT,
)
from tests.sandbox.seccomp_bpf import combined as _combined
from tests.sandbox.seccomp_bpf import run as _run


def _calls() -> list[tuple[int, tuple[int, ...]]]:
    """Every call number, and for the calls the policy reads arguments of, the arguments it
    tells apart (and neighbours)."""
    lib = seccomp._lib()

    def nr(name: str) -> int:
        return int(lib.seccomp_syscall_resolve_name(name.encode()))

    calls: list[tuple[int, tuple[int, ...]]] = [(n, ()) for n in range(0, 1024)]
    clone_flags = [
        0,
        0x11,
        0x00020000,
        0x02000000,
        0x04000000,
        0x08000000,
        0x10000000,
        0x20000000,
        0x40000000,
        0x7E020000,
        0x01200011,
    ]
    calls += [(nr("clone"), (flags,)) for flags in clone_flags]
    calls += [
        (nr("socket"), (family, kind))
        for family in (1, 2, 10, 16, 17)
        for kind in (1, 2, 3, 5, 10, 0x80003, 0x80801)
    ]
    calls += [(nr("ioctl"), (0, request)) for request in (0x5412, 0x5413, 0x5401, 0x1_0000_5412)]
    calls += [(nr("setns"), (3, flags)) for flags in (0, 0x20000000, 0x40000000)]
    return calls


def test_the_two_parts_refuse_exactly_what_the_whole_filter_refuses() -> None:
    whole = seccomp.compile_filter()
    parts = seccomp.compile_split()
    native = (
        AUDIT_ARCH_X86_64
        if seccomp._lib().seccomp_syscall_resolve_name(b"setns") == 308
        else AUDIT_ARCH_AARCH64
    )
    checked = 0
    for arch in (native, AUDIT_ARCH_I386):
        for nr, args in _calls():
            for number in (nr, nr | X32_BIT) if arch == AUDIT_ARCH_X86_64 else (nr,):
                expected = _run(whole, number, arch, args)
                got = _combined(parts, number, arch, args)
                assert got == expected, (arch, number, args, hex(got), hex(expected))
                checked += 1
    assert checked > 2000
    # A call from another architecture's ABI kills the whole process, not only its thread.
    assert _run(whole, 11, AUDIT_ARCH_I386, ()) == seccomp.ACT_KILL_PROCESS
    assert _combined(parts, 11, AUDIT_ARCH_I386, ()) == seccomp.ACT_KILL_PROCESS


def test_the_zygote_part_lets_the_contain_steps_through_and_the_program_part_refuses_them() -> None:
    zygote_part, program_part = seccomp.compile_split()
    setns = seccomp._lib().seccomp_syscall_resolve_name(b"setns")
    if setns < 0:
        pytest.skip("no setns on this architecture")
    arch = AUDIT_ARCH_X86_64 if setns == 308 else AUDIT_ARCH_AARCH64
    assert _run(zygote_part, setns, arch, (3, 0x20000000)) == seccomp.ACT_ALLOW
    assert _run(program_part, setns, arch, (3, 0x20000000)) == seccomp.act_errno(errno.EPERM)
    # The program part refuses nothing else: what it adds is only ever the contain calls.
    others = [_run(program_part, n, arch, ()) for n in range(0, 1024) if n != setns]
    assert set(others) == {seccomp.ACT_ALLOW}
    # And it is small: the point of the split is that each program installs little.
    assert len(program_part) // 8 < 20 < len(zygote_part) // 8
