"""JavaScript and bash run latency against their bare interpreters, measured in the same run.

Each sample is one paced call, one at a time: `console.log(1)` / `echo 1` through the executor
(the real sandbox: a contained program execs Node or bash) beside a bare `node -e` / `bash -c`
on the host. Prints medians and p90s in milliseconds.

    python bench/languages.py [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

from execbox import Executor

CASES = {
    "python": ("print(1)", None),
    "javascript": ("console.log(1)", ["node", "-e", "console.log(1)"]),
    "bash": ("echo 1", ["bash", "-c", "echo 1"]),
}


def _summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[int(len(ordered) * 0.9) - 1]
    return f"median {statistics.median(ordered):7.2f} ms  p90 {p90:7.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    with Executor(cache=False) as ex:
        for language, (code, _bare) in CASES.items():
            for _ in range(5):  # every slot of the pool has run once
                ex.run(code, language=language)
        for language, (code, bare) in CASES.items():
            sandboxed, host = [], []
            for _ in range(args.runs):
                start = time.perf_counter()
                result = ex.run(code, language=language)
                sandboxed.append((time.perf_counter() - start) * 1000)
                assert result.stdout == "1\n", result
                if bare is not None:
                    start = time.perf_counter()
                    subprocess.run(bare, check=True, capture_output=True)
                    host.append((time.perf_counter() - start) * 1000)
                time.sleep(0.02)  # paced: each call finds its slot staged again
            print(f"{language:<10} execbox {_summary(sandboxed)}")
            if host:
                print(f"{'':<10} bare    {_summary(host)}")


if __name__ == "__main__":
    main()
