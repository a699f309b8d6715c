"""A big result's memory goes back to the system once the result is gone.

glibc serves an allocation of at least its mmap threshold with its own mapping, unmapped at
free; but it raises the threshold to the largest such block freed so far (up to 32 MiB), so
after one big result the next ones are carved from the heap, whose freed pages the process
keeps: a server that once held several 16 MiB outputs stayed hundreds of MiB larger for good.
A fixed threshold keeps every block of 2 MiB or more on its own mapping."""

from __future__ import annotations

import ctypes
import sys

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc's malloc.h)
MMAP_THRESHOLD_BYTES = 2 << 20  # above the 1 MiB receive buffers of the sandbox channel


def return_big_blocks() -> bool:
    """Fix the process's mmap threshold (glibc only; elsewhere nothing). True if it was set."""
    if not sys.platform.startswith("linux"):
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # musl has none
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
