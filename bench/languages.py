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
This is where bench/latency.py and bench/throughput.py's Python figures have their
JavaScript and bash counterparts.

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


def _summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[int(len(ordered) * 0.9) - 1]
    return f"median {statistics.median(ordered):7.2f} ms  p90 {p90:7.2f} ms"


def _rate(callers: int, seconds: float, once: Callable[[], None]) -> float:
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


def _pace(ex: Executor, language: str) -> None:
    """Wait until every slot of the language's kind is staged again (at most PACE_MAX_S)."""
    time.sleep(PACE_MIN_S)
    kind, deadline = SLOT_KIND[language], time.monotonic() + PACE_MAX_S
    while time.monotonic() < deadline:
        stats = ex.stats()
        if stats.host is None or stats.host.staged[kind] >= stats.pool_size:
            break
        time.sleep(0.01)
    time.sleep(SETTLE_S.get(language, 0.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--callers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
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
                    subprocess.run(bare, check=True, capture_output=True, env={})
                    host.append((time.perf_counter() - start) * 1000)
                _pace(ex, language)
            print(f"{language:<10} execbox {_summary(sandboxed)}")
            if host:
                print(f"{'':<10} bare    {_summary(host)}")
        for language, (code, bare) in CASES.items():

            def sandboxed_once(code: str = code, language: str = language) -> None:
                ex.run(code, language=language)

            rate = _rate(args.callers, args.seconds, sandboxed_once)
            line = f"{language:<10} {args.callers} callers: execbox {rate:6.1f} runs/s"
            if bare is not None:

                def bare_once(bare: list[str] = bare) -> None:
                    subprocess.run(bare, check=True, capture_output=True, env={})

                bare_rate = _rate(args.callers, args.seconds, bare_once)
                line += f", bare {bare_rate:6.1f} runs/s ({rate / bare_rate:.2f}x)"
            print(line)


if __name__ == "__main__":
    main()
