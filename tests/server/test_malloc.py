"""A big result's memory goes back to the system: after blocks of several MiB are freed, the
process is as small as before (glibc otherwise keeps them in its heap for good)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROGRAM = """
import sys
from execbox.server import malloc

def rss_mib():
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) for l in fh if l.startswith("VmRSS")) / 1024

if sys.argv[1] == "fixed":
    assert malloc.return_big_blocks()
first = bytearray(16 << 20)  # freed: glibc raises its mmap threshold past 16 MiB
del first
before = rss_mib()
blocks, pins = [], []
for _ in range(8):  # results of 12 MiB each, and small objects made meanwhile that live on
    blocks.append(b"x" * (12 << 20))
    pins.append(bytearray(4096))
del blocks
print(rss_mib() - before)
"""


def _kept_mib(mode: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return float(out)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_big_results_return_their_memory_to_the_system() -> None:
    assert _kept_mib("default") > 40  # what a server kept before (the attack this guards)
    assert _kept_mib("fixed") < 8
