"""Overhead of a cell in a warm session, against baselines measured in the same run: the same
code as a one-shot isolated run (what a session saves an agent per step) and IPython's own
`run_cell` in a bare, unsandboxed interpreter (the floor). Also how long a session takes to
start. Every cell goes through the whole pipeline (policy, redaction, a run record).
Prints medians, p90 and ratios; writes bench/results/session.json.

    .venv/bin/python bench/session.py [--cells 500]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # noqa: E402

from latency import save_results, stats  # noqa: E402

from execbox.executor import Executor  # noqa: E402
from execbox.image import Image  # noqa: E402

BARE_IPYTHON = """
import os, sys, time
os.environ["IPYTHONDIR"] = sys.argv[2]
from traitlets.config import Config
from IPython.core.interactiveshell import InteractiveShell
c = Config(); c.HistoryManager.enabled = False
shell = InteractiveShell.instance(config=c)
for _ in range(50):
    shell.run_cell("x = 1", store_history=True)
samples = []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter()
    shell.run_cell("x = 1", store_history=True)
    samples.append((time.perf_counter() - t) * 1000)
print(" ".join(f"{s:.4f}" for s in samples))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cells", type=int, default=500)
    args = parser.parse_args()
    image = Image.load()
    with (
        tempfile.TemporaryDirectory() as tmp,
        Executor(cache=False, records=f"sqlite:///{tmp}/runs.db") as executor,
    ):
        executor._host.wait_heavy()  # it starts in the background: not in what is measured
        time.sleep(1.0)  # let the pool stage its slots
        starts = []
        for _ in range(10):
            t = time.perf_counter()
            with executor.session() as s:
                starts.append((time.perf_counter() - t) * 1000)
                assert s.run("1").ok
        with executor.session() as s:
            for _ in range(50):
                s.run("x = 1")
            cells = []
            for _ in range(args.cells):
                t = time.perf_counter()
                r = s.run("x = 1")
                cells.append((time.perf_counter() - t) * 1000)
                assert r.ok, r
        runs = []
        for _ in range(max(20, args.cells // 5)):
            t = time.perf_counter()
            r = executor.run("x = 1")
            runs.append((time.perf_counter() - t) * 1000)
            assert r.ok, r
        bare = subprocess.run(
            [str(image.python), "-c", BARE_IPYTHON, str(args.cells), os.path.join(tmp, "ipython")],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    result = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "session_start": stats(starts),
        "cell_x_eq_1": stats(cells),
        "baselines": {
            "one-shot isolated run of x = 1": stats(runs),
            "bare IPython run_cell (no sandbox, no pipeline)": stats(
                [float(v) for v in bare.split()]
            ),
        },
    }
    b = result["baselines"]
    cell = result["cell_x_eq_1"]["median_ms"]
    result["ratios"] = {
        "cell / one-shot run": round(cell / b["one-shot isolated run of x = 1"]["median_ms"], 3),
        "cell / bare IPython run_cell": round(
            cell / b["bare IPython run_cell (no sandbox, no pipeline)"]["median_ms"], 2
        ),
    }
    print(f"{'workload':<52}{'median ms':>10}{'p90 ms':>10}")
    for label, entry in (
        ("session start (staged slot + IPython)", result["session_start"]),
        ("cell `x = 1` in a warm session", result["cell_x_eq_1"]),
        *((f"baseline: {k}", v) for k, v in b.items()),
    ):
        print(f"{label:<52}{entry['median_ms']:>10.3f}{entry['p90_ms']:>10.3f}")
    for name, ratio in result["ratios"].items():
        print(f"ratio {name}: {ratio}")
    save_results("session", result)


if __name__ == "__main__":
    main()
