"""End-to-end time of one `execbox run` command (the installed `execbox` script, as a user
types it): through a running `execbox serve` (its local socket) against a cold run in the CLI's
own process, measured in the same run, alternating so that the machine's load falls on all
alike. Also the floor: the bare interpreter (`python -c pass`). Each command's wall time and
its own CPU time (user + system of the command's process: what load on a shared machine
inflates least). Prints medians and p90; writes bench/results/cli.json.

    .venv/bin/python bench/cli.py [--runs 20]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The console script beside this interpreter: what `execbox` on PATH runs.
EXECBOX = [str(Path(sys.executable).with_name("execbox"))]


def stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered), 1),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 1),
        "n": len(ordered),
    }


def timed(command: list[str]) -> tuple[float, float]:
    """Wall and CPU milliseconds of one command (CPU: the command's own process tree)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True)
    elapsed = (time.perf_counter() - start) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {proc.stderr.decode()}")
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000
    return elapsed, cpu


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
        commands = {
            "served": [*EXECBOX, "run", str(program), "--no-cache", "--server", f"unix:{sock}"],
            "cold": [*EXECBOX, "run", str(program), "--no-cache", "--server", "none"],
            "python": [sys.executable, "-c", "pass"],
        }
        wall: dict[str, list[float]] = {name: [] for name in commands}
        cpu: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, command in commands.items():
                took, used = timed(command)
                wall[name].append(took)
                cpu[name].append(used)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=90)
        for leftover in work.iterdir():
            leftover.unlink()
        work.rmdir()
    result = {
        **{name: {**stats(wall[name]), "cpu": stats(cpu[name])} for name in commands},
        "speedup": round(statistics.median(wall["cold"]) / statistics.median(wall["served"]), 1),
        "served_over_python_ms": round(
            statistics.median(wall["served"]) - statistics.median(wall["python"]), 1
        ),
        "load_average": os.getloadavg(),
    }
    print(json.dumps(result, indent=2))
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "cli.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
