"""Isolated runs per second with 1, 2 and 4 concurrent clients (threads calling Executor.run),
against bare `python3 -I -S -c pass` processes started by the same number of clients, measured
in the same run. Prints runs/s and ratios; writes bench/results/throughput.json.

    .venv/bin/python bench/throughput.py [--seconds 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # noqa: E402

from latency import save_results  # noqa: E402

import execbox  # noqa: E402
from execbox.image import Image  # noqa: E402


def rate(clients: int, seconds: float, call: object) -> float:
    count = [0] * clients
    stop = time.monotonic() + seconds

    def client(i: int) -> None:
        while time.monotonic() < stop:
            call()  # type: ignore[operator]
            count[i] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return sum(count) / (time.monotonic() - t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    python3 = str(Image.load().base_prefix / "bin" / "python3")
    results: dict[str, dict[str, float]] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        execbox.Executor(cache=False, records=f"sqlite:///{tmp}/runs.db") as ex,
    ):
        ex._host.wait_heavy()  # it starts in the background: not in what is measured

        def isolated() -> None:
            r = ex.run("print(1)")
            assert r.ok, r

        def bare() -> None:
            subprocess.run([python3, "-I", "-S", "-c", "pass"], check=True)

        rate(2, 1.0, isolated)  # warm up
        for clients in (1, 2, 4):
            iso = rate(clients, args.seconds, isolated)
            base = rate(clients, args.seconds, bare)
            results[str(clients)] = {
                "isolated_runs_per_s": round(iso, 1),
                "bare_python_I_S_per_s": round(base, 1),
                "ratio": round(iso / base, 3),
            }
    print(f"{'clients':<10}{'isolated runs/s':>18}{'bare python -I -S/s':>22}{'ratio':>8}")
    for clients, row in results.items():
        print(
            f"{clients:<10}{row['isolated_runs_per_s']:>18.1f}"
            f"{row['bare_python_I_S_per_s']:>22.1f}{row['ratio']:>8.2f}"
        )
    save_results("throughput", results)


if __name__ == "__main__":
    main()
