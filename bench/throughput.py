"""Isolated runs per second with 1, 2 and 4 concurrent clients (threads calling Executor.run),
against bare `python3 -I -S -c pass` processes started by the same number of clients, measured
in the same run; then JavaScript (`console.log(1)`) and bash (`echo 1`) runs/s beside as many
clients looping bare `node -e` and `bash -c` (`languages.throughput`).
Prints runs/s and ratios; writes bench/results/throughput.json.

    .venv/bin/python bench/throughput.py [--seconds 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # noqa: E402

from languages import rate, warm  # noqa: E402
from languages import throughput as language_throughput  # noqa: E402
from latency import save_results  # noqa: E402

import execbox  # noqa: E402
from execbox.image import Image  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    python3 = str(Image.load().base_prefix / "bin" / "python3")
    results: dict[str, Any] = {}
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
        for language in ("javascript", "bash"):
            warm(ex, language)
            results[language] = {
                str(clients): language_throughput(ex, language, clients, args.seconds)
                for clients in (1, 2, 4)
            }
    print(f"{'clients':<10}{'isolated runs/s':>18}{'bare python -I -S/s':>22}{'ratio':>8}")
    for clients in ("1", "2", "4"):
        row = results[clients]
        print(
            f"{clients:<10}{row['isolated_runs_per_s']:>18.1f}"
            f"{row['bare_python_I_S_per_s']:>22.1f}{row['ratio']:>8.2f}"
        )
    for language in ("javascript", "bash"):
        print(f"{language}: {'clients':<10}{'execbox runs/s':>16}{'bare runs/s':>14}{'ratio':>8}")
        for clients, got in results[language].items():
            print(
                f"{'':<12}{clients:<10}{got['execbox_runs_per_s']:>16.1f}"
                f"{got['bare_runs_per_s']:>14.1f}{got['ratio']:>8.2f}"
            )
    save_results("throughput", results)


if __name__ == "__main__":
    main()
