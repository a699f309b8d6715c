"""End-to-end time of one `execbox run` command: through a running `execbox serve` (its local
socket) against a cold run in the CLI's own process, measured in the same run, alternating so
that the machine's load falls on both alike. Also the floor: the interpreter importing what
the CLI imports (`execbox --version`). Prints medians and p90; writes bench/results/cli.json.

    .venv/bin/python bench/cli.py [--runs 20]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXECBOX = [sys.executable, "-m", "execbox.cli"]


def stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered), 1),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 1),
        "n": len(ordered),
    }


def timed(args: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run([*EXECBOX, *args], capture_output=True)
    elapsed = (time.perf_counter() - start) * 1000
    if proc.returncode != 0:
        raise SystemExit(f"execbox {' '.join(args)} failed: {proc.stderr.decode()}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="execbox-bench-cli-"))
    program = work / "p.py"
    program.write_text("print(1)\n")
    sock = work / "serve.sock"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [*EXECBOX, "serve", "--port", str(port), "--socket", str(sock), "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while (
            not sock.exists()
            or subprocess.run(
                [*EXECBOX, "run", str(program), "--server", f"unix:{sock}"], capture_output=True
            ).returncode
        ):
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not start")
            time.sleep(0.5)
        served, cold, floor = [], [], []
        for _ in range(args.runs):
            served.append(timed(["run", str(program), "--no-cache", "--server", f"unix:{sock}"]))
            cold.append(timed(["run", str(program), "--no-cache", "--server", "none"]))
            floor.append(timed(["--version"]))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=90)
        for leftover in work.iterdir():
            leftover.unlink()
        work.rmdir()
    result = {
        "served": stats(served),
        "cold": stats(cold),
        "cli_import_floor": stats(floor),
        "speedup": round(statistics.median(cold) / statistics.median(served), 1),
        "load_average": os.getloadavg(),
    }
    print(json.dumps(result, indent=2))
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "cli.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
