"""Result cache: a hit against a real run of the same request, measured in the same run.
Prints medians, p90 and the ratio; writes bench/results/cache.json.

    .venv/bin/python bench/cache.py [--runs 50]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from latency import save_results, stats

import execbox

CODE = """
import pandas as pd
df = pd.DataFrame({"k": [i % 10 for i in range(10_000)], "v": range(10_000)})
df.groupby("k").v.agg(["sum", "mean"]).to_csv("summary.csv")
print(df.groupby("k").v.sum().head(3))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        execbox.Executor(records=f"sqlite:///{tmp}/runs.db") as ex,
    ):
        ex._host.wait_heavy()  # it starts in the background: not in what is measured
        ex.run(CODE, cache=True)  # fill the cache (and warm up)
        fresh, hits = [], []
        for _ in range(args.runs):
            t = time.perf_counter()
            r = ex.run(CODE, cache=False)
            fresh.append((time.perf_counter() - t) * 1000)
            assert r.ok and not r.cached, r
            t = time.perf_counter()
            h = ex.run(CODE, cache=True)
            hits.append((time.perf_counter() - t) * 1000)
            assert h.cached and h.stdout == r.stdout and h.artifacts[0].data is not None, h
    result = {"fresh_run": stats(fresh), "cache_hit": stats(hits)}
    result["ratio_hit_over_fresh"] = round(
        result["cache_hit"]["median_ms"] / result["fresh_run"]["median_ms"], 3
    )
    print(f"{'workload (pandas snippet + artifact)':<40}{'median ms':>10}{'p90 ms':>10}")
    for name in ("fresh_run", "cache_hit"):
        print(f"{name:<40}{result[name]['median_ms']:>10.2f}{result[name]['p90_ms']:>10.2f}")
    print(f"ratio cache hit / fresh run: {result['ratio_hit_over_fresh']:.3f}")
    save_results("cache", result)


if __name__ == "__main__":
    main()
