"""A classic BPF evaluator for seccomp programs, as the kernel runs them over `seccomp_data`,
so that tests check the bytes a program actually loads without installing anything (a filter
that failed to refuse would let this process unshare or mount on the host)."""

from __future__ import annotations

import struct

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
AUDIT_ARCH_I386 = 0x40000003
X32_BIT = 0x40000000


# Complex on purpose: a BPF interpreter: one branch per instruction class.
def run(program: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:  # noqa: C901
    """The action (SECCOMP_RET_*) a classic BPF seccomp program returns for a call."""
    data = struct.pack("<IIQ6Q", nr & 0xFFFFFFFF, arch, 0, *args, *([0] * (6 - len(args))))
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
            return int(k)
        elif code == 0x16:  # ret a
            return a
        else:
            raise AssertionError(f"instruction {code:#x} not known to this evaluator")


def precedence(action: int) -> int:
    """The kernel keeps the action with the lowest SECCOMP_RET_ACTION_FULL as a signed int."""
    full = action & 0xFFFF0000
    return full - (1 << 32) if full & 0x80000000 else full


def combined(parts: tuple[bytes, ...], nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """The action of several filters installed together."""
    return min((run(p, nr, arch, args) for p in parts), key=precedence)
