"""`execbox serve` in a process of its own on a free loopback port, for the benchmarks that
measure the server from outside (bench/load.py, bench/noisy.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx


@contextmanager
def served(
    db: str, *options: str, start_s: float = 90.0
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """(url, process) of a server on the records database `db`, once it answers /readyz;
    stopped with SIGTERM (killed after 60 s) when the block ends."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "execbox.cli", "serve", "--port", str(port), "--db", db, *options]
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_s
        while True:
            try:
                if httpx.get(url + "/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the server did not start")
            time.sleep(0.1)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
