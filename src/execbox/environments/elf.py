"""The ELF facts a tree's build needs: which shared libraries a binary loads and from where
(`ldd`), and its run path, read and rewritten in place (64-bit little-endian files only)."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

from ..errors import UsageError


def ldd(path: Path) -> dict[str, str]:
    """The shared libraries `path` needs: name -> where the loader finds it ('' when not)."""
    done = subprocess.run(["ldd", str(path)], capture_output=True, text=True)
    found = {}
    for line in done.stdout.splitlines():
        name, arrow, where = line.strip().partition(" => ")
        if arrow:
            found[name] = "" if where.startswith("not found") else where.split(" (")[0]
    return found


def _runpath_at(binary: Path, data: bytes | bytearray) -> tuple[int, int] | None:
    """Where the DT_RUNPATH (or DT_RPATH) string of an ELF64 little-endian file is: its
    offset and length; None when it has none."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise UsageError(f"{binary} is not a 64-bit little-endian ELF file")
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, offset, vaddr, _, filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + i * phentsize
        )
        if p_type == 1:
            loads.append((vaddr, offset, filesz))
        elif p_type == 2:
            dynamic = (offset, filesz)
    if dynamic is None:
        return None
    entries: dict[int, int] = {}
    for at in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, value = struct.unpack_from("<qQ", data, at)
        if tag == 0:
            break
        entries.setdefault(tag, value)
    where = entries.get(29, entries.get(15))  # DT_RUNPATH, else DT_RPATH
    if where is None:
        return None
    strtab_vaddr = entries[5]  # DT_STRTAB
    strtab = next(
        off + strtab_vaddr - va for va, off, size in loads if va <= strtab_vaddr < va + size
    )
    start = strtab + where
    return start, data.index(b"\0", start) - start


def runpath(binary: Path) -> str | None:
    data = binary.read_bytes()
    at = _runpath_at(binary, data)
    return None if at is None else data[at[0] : at[0] + at[1]].decode()


def set_runpath(binary: Path, new_path: str, old_path: str) -> bool:
    """Rewrite the run path of `binary` in place when it is `old_path` (`new_path` must not be
    longer); whether it was."""
    data = bytearray(binary.read_bytes())
    at = _runpath_at(binary, data)
    if at is None or data[at[0] : at[0] + at[1]] != old_path.encode():
        return False
    new = new_path.encode()
    if len(new) > at[1]:
        raise UsageError(f"{binary}: run path {new_path!r} is longer than {old_path!r}")
    data[at[0] : at[0] + at[1]] = new + b"\0" * (at[1] - len(new))
    binary.write_bytes(bytes(data))
    return True
