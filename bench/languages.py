"""JavaScript and bash run latency and throughput against their bare interpreters, measured in
the same run.

Latency: one paced call at a time, `console.log(1)` / `echo 1` through the executor (the real
sandbox: a staged Node or bash that waits for its code in its slot) beside a bare `node -e` /
`bash -c` on the host; medians and p90s in milliseconds. Paced: before each call every slot of
its kind is staged again (a slot serves one run), and SETTLE_S more: a slot is staged before
its interpreter has started and waits for its code (Node: up to ~0.5 s on a loaded 2-core
machine), so each call finds its interpreter waiting. Throughput: runs/s with
`--callers` threads calling at once for `--seconds`, beside as many threads looping the bare
interpreter. The bare runs get an empty environment, as runs do (a host's
NODE_EXTRA_CA_CERTS, say, costs Node a certificate parse at every start).
bench/latency.py and bench/throughput.py report JavaScript and bash beside Python with the
functions here (`latency`, `throughput`); run alone, this prints all three languages.

    python bench/languages.py [--runs N] [--callers 4] [--seconds 10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import threading
import time
from collections.abc import Callable

from execbox import Executor

CASES = {
    "python": ("print(1)", None),
    "javascript": ("console.log(1)", ["node", "-e", "console.log(1)"]),
    "bash": ("echo 1", ["bash", "-c", "echo 1"]),
}
SLOT_KIND = {"python": "light", "javascript": "javascript", "bash": "bash"}
PACE_MIN_S = 0.02
PACE_MAX_S = 10.0
SETTLE_S = {"javascript": 1.0, "bash": 0.05}


def summary(samples: list[float]) -> dict[str, float]:
    """Median and p90 of `samples` (milliseconds)."""
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered), 3),
        "p90_ms": round(ordered[max(0, int(len(ordered) * 0.9) - 1)], 3),
        "n": len(ordered),
    }


def rate(callers: int, seconds: float, once: Callable[[], None]) -> float:
    """Calls per second of `once` from `callers` threads for `seconds`."""
    done = [0] * callers
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        while time.monotonic() < stop:
            once()
            done[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(callers)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.monotonic() - start)


def pace(ex: Executor, language: str) -> None:
    """Wait until every slot of the language's kind is staged again (at most PACE_MAX_S)."""
    time.sleep(PACE_MIN_S)
    kind, deadline = SLOT_KIND[language], time.monotonic() + PACE_MAX_S
    while time.monotonic() < deadline:
        stats = ex.stats()
        if stats.host is None or stats.host.staged[kind] >= stats.pool_size:
            break
        time.sleep(0.01)
    time.sleep(SETTLE_S.get(language, 0.0))


def warm(ex: Executor, language: str) -> None:
    """Run the language's case until every slot of the pool has run once."""
    for _ in range(5):
        ex.run(CASES[language][0], language=language)


def _bare(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True, env={})


def latency(ex: Executor, language: str, runs: int) -> dict[str, dict[str, float]]:
    """Paced latency of the language's case through `ex`, and of its bare interpreter (none
    for Python: bench/latency.py has its own baselines) measured between the same calls."""
    code, bare = CASES[language]
    sandboxed, host = [], []
    for _ in range(runs):
        start = time.perf_counter()
        result = ex.run(code, language=language)
        sandboxed.append((time.perf_counter() - start) * 1000)
        assert result.stdout == "1\n", result
        if bare is not None:
            start = time.perf_counter()
            _bare(bare)
            host.append((time.perf_counter() - start) * 1000)
        pace(ex, language)
    out = {"execbox": summary(sandboxed)}
    if host:
        out["bare"] = summary(host)
    return out


def throughput(ex: Executor, language: str, callers: int, seconds: float) -> dict[str, float]:
    """Runs/s of the language's case with `callers` threads, beside as many threads looping
    its bare interpreter, measured one after the other in the same run."""
    code, bare = CASES[language]

    def sandboxed_once() -> None:
        ex.run(code, language=language)

    out = {"execbox_runs_per_s": round(rate(callers, seconds, sandboxed_once), 1)}
    if bare is not None:
        out["bare_runs_per_s"] = round(rate(callers, seconds, lambda: _bare(bare)), 1)
        out["ratio"] = round(out["execbox_runs_per_s"] / out["bare_runs_per_s"], 3)
    return out


def _line(stats: dict[str, float]) -> str:
    return f"median {stats['median_ms']:7.2f} ms  p90 {stats['p90_ms']:7.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--callers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    with Executor(cache=False) as ex:
        for language in CASES:
            warm(ex, language)
        for language in CASES:
            measured = latency(ex, language, args.runs)
            print(f"{language:<10} execbox {_line(measured['execbox'])}")
            if "bare" in measured:
                print(f"{'':<10} bare    {_line(measured['bare'])}")
        for language in CASES:
            got = throughput(ex, language, args.callers, args.seconds)
            line = f"{language:<10} {args.callers} callers: execbox {got['execbox_runs_per_s']:6.1f} runs/s"
            if "bare_runs_per_s" in got:
                line += f", bare {got['bare_runs_per_s']:6.1f} runs/s ({got['ratio']:.2f}x)"
            print(line)


if __name__ == "__main__":
    main()
