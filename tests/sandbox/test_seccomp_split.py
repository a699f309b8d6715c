"""The filter in two parts (a program zygote's and each program's) refuses exactly what the
whole filter refuses, with the same action, for every system call number and the arguments
the policy looks at. Checked by evaluating the classic BPF programs libseccomp exports, as the
kernel would, and combining the parts' actions by the kernel's precedence: no filter is
installed anywhere here (a filter that failed to refuse would let this process unshare or
mount on the host). That real programs get the refusals is attacked in test_isolation."""

from __future__ import annotations

import errno
import struct

import pytest

from execbox.sandbox import seccomp

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
AUDIT_ARCH_I386 = 0x40000003
X32_BIT = 0x40000000


def _run(program: bytes, nr: int, arch: int, args: tuple[int, ...]) -> int:
    """The action (SECCOMP_RET_*) a classic BPF seccomp program returns for a call."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *args, *([0] * (6 - len(args))))
    insns = [struct.unpack_from("<HBBI", program, off) for off in range(0, len(program), 8)]
    a = x = 0
    mem = [0] * 16
    pc = 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        cls = code & 0x07
        if code == 0x20:  # ld [k]
            a = struct.unpack_from("<I", data, k)[0]
        elif code == 0x00:  # ld #k
            a = k
        elif code == 0x60:  # ld M[k]
            a = mem[k]
        elif code == 0x61:  # ldx M[k]
            x = mem[k]
        elif code == 0x02:  # st M[k]
            mem[k] = a
        elif code == 0x03:  # stx M[k]
            mem[k] = x
        elif code == 0x07:  # tax
            x = a
        elif code == 0x87:  # txa
            a = x
        elif code == 0x54:  # and #k
            a &= k
        elif code == 0x44:  # or #k
            a |= k
        elif code == 0x05:  # ja
            pc += k
        elif cls == 0x05 and code & 0x08 == 0:  # conditional jumps on #k
            op = code & 0xF0
            taken = {0x10: a == k, 0x20: a > k, 0x30: a >= k, 0x40: bool(a & k)}[op]
            pc += jt if taken else jf
        elif code == 0x06:  # ret #k
            return k
        elif code == 0x16:  # ret a
            return a
        else:
            raise AssertionError(f"instruction {code:#x} not known to this evaluator")


def _precedence(action: int) -> int:
    """The kernel keeps the action with the lowest SECCOMP_RET_ACTION_FULL as a signed int."""
    full = action & 0xFFFF0000
    return full - (1 << 32) if full & 0x80000000 else full


def _combined(parts: tuple[bytes, ...], nr: int, arch: int, args: tuple[int, ...]) -> int:
    return min((_run(p, nr, arch, args) for p in parts), key=_precedence)


def _calls() -> list[tuple[int, tuple[int, ...]]]:
    """Every call number, and for the calls the policy reads arguments of, the arguments it
    tells apart (and neighbours)."""
    lib = seccomp._lib()

    def nr(name: str) -> int:
        return lib.seccomp_syscall_resolve_name(name.encode())

    calls: list[tuple[int, tuple[int, ...]]] = [(n, ()) for n in range(0, 1024)]
    clone_flags = [0, 0x11, 0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000,
                   0x20000000, 0x40000000, 0x7E020000, 0x01200011]
    calls += [(nr("clone"), (flags,)) for flags in clone_flags]
    calls += [(nr("socket"), (family, kind)) for family in (1, 2, 10, 16, 17)
              for kind in (1, 2, 3, 5, 10, 0x80003, 0x80801)]
    calls += [(nr("ioctl"), (0, request)) for request in (0x5412, 0x5413, 0x5401, 0x1_0000_5412)]
    calls += [(nr("setns"), (3, flags)) for flags in (0, 0x20000000, 0x40000000)]
    return calls


def test_the_two_parts_refuse_exactly_what_the_whole_filter_refuses() -> None:
    whole = seccomp.compile_filter()
    parts = seccomp.compile_split()
    native = AUDIT_ARCH_X86_64 if seccomp._lib().seccomp_syscall_resolve_name(
        b"setns") == 308 else AUDIT_ARCH_AARCH64
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


def test_the_zygote_part_lets_the_contain_steps_through_and_the_program_part_refuses_them(
        ) -> None:
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
