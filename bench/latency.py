"""Latency of an isolated `print(1)` through Executor.run, against bare interpreters measured in
the same run. Prints medians, p90 and ratios; writes bench/results/latency.json.

    .venv/bin/python bench/latency.py [--runs 200] [--baseline-runs 40]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # noqa: E402

import execbox  # noqa: E402
from execbox.image import Image  # noqa: E402


def stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered), 3),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 3),
        "min_ms": round(ordered[0], 3),
        "n": len(ordered),
    }


def time_command(argv: list[str], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(argv, check=True)
        samples.append((time.perf_counter() - t) * 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--baseline-runs", type=int, default=40)
    args = parser.parse_args()

    image = Image.load()
    # The interpreter the runtime image is built on, called directly (no shims in between).
    python3 = str(image.base_prefix / "bin" / "python3")
    tmp = tempfile.TemporaryDirectory()
    t = time.perf_counter()
    # Every run really runs (no cache) and is recorded, as in production, into a scratch DB.
    executor = execbox.Executor(cache=False, records=f"sqlite:///{tmp.name}/runs.db")
    ready_ms = (time.perf_counter() - t) * 1000
    with executor, tmp:
        for _ in range(10):
            executor.run("print(1)")
        samples, walls = [], []
        for _ in range(args.runs):
            t = time.perf_counter()
            r = executor.run("print(1)")
            samples.append((time.perf_counter() - t) * 1000)
            walls.append(r.metrics.wall_ms)
            assert r.ok and r.stdout == "1\n", r
    baselines = {
        "python3 -c pass": time_command([python3, "-c", "pass"], args.baseline_runs),
        "python3 -I -S -c pass": time_command([python3, "-I", "-S", "-c", "pass"],
                                              args.baseline_runs),
        "runtime python -c 'import numpy, pandas'": time_command(
            [str(image.python), "-c", "import numpy, pandas"], max(5, args.baseline_runs // 4)),
    }
    result = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "executor_ready_ms": round(ready_ms, 1),
        "isolated_print1": stats(samples),
        "isolated_print1_wall_in_sandbox": stats(walls),
        "baselines": {name: stats(s) for name, s in baselines.items()},
    }
    med = result["isolated_print1"]["median_ms"]
    result["ratios"] = {
        f"isolated / {name}": round(med / result["baselines"][name]["median_ms"], 3)
        for name in baselines
    }
    print(f"executor ready in {ready_ms:.0f} ms")
    print(f"{'workload':<44}{'median ms':>10}{'p90 ms':>10}")
    print(f"{'isolated print(1) via Executor.run':<44}{med:>10.2f}"
          f"{result['isolated_print1']['p90_ms']:>10.2f}")
    for name in baselines:
        b = result["baselines"][name]
        print(f"{'bare ' + name:<44}{b['median_ms']:>10.2f}{b['p90_ms']:>10.2f}")
    for name, ratio in result["ratios"].items():
        print(f"ratio {name}: {ratio:.2f}")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "latency.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
