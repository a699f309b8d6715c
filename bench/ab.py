"""A/B of two execbox trees in the same minutes: `print(1)` latency, runs/s with 4 callers and
HumanEval (canonical solutions) problems/s, each tree measured in rounds that alternate (A B,
B A, A B, ...), each round a fresh executor in a fresh interpreter of that tree. Each rate also
has its whole-tree CPU per run (a cpuacct group per round: caller, zygotes, supervisors and
programs), which swings less than wall time on a shared machine. Prints each side's median and
B's ratio to A, and the ratios of the rounds' pairs (round i's B over its A, run back to back):
their median and range. A ratio whose range holds 1 is within what the rounds swing by: more
rounds, not a finding. Writes bench/results/ab.json.

    .venv/bin/python bench/ab.py --a TREE_A --b TREE_B [--rounds 6]

A tree is a checkout with its own `.venv` (`make image` made it); `--a-home`/`--b-home` give
each tree's EXECBOX_HOME when their images differ (native code changed).
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

WARMUP = 30
LATENCY_RUNS = 200
THROUGHPUT_S = 4.0
CLIENTS = 4
HUMANEVAL_PASSES = 3  # one pass is ~1 s, too short to outlast the machine's swings


def _child() -> None:
    """One round in this interpreter (the tree's own execbox): a JSON line of measurements."""
    # this tree's execbox, before `cpu` and `throughput` put the bench's own tree on sys.path
    import execbox  # noqa: I001
    from execbox.evals import humaneval as he

    from cpu import enter_cpuacct_group, leave_cpuacct_group
    from throughput import rate

    cgroup = enter_cpuacct_group("bench/ab.py")

    def cpu_ms() -> float:
        time.sleep(0.3)  # the last slots' teardown and restaging are counted
        with open(f"{cgroup}/cpuacct.usage") as fh:
            return int(fh.read()) / 1e6

    out: dict[str, float] = {}
    try:
        with (
            tempfile.TemporaryDirectory() as tmp,
            execbox.Executor(cache=False, records=f"sqlite:///{tmp}/runs.db") as ex,
        ):
            ex._host.wait_heavy()
            for _ in range(WARMUP):
                assert ex.run("print(1)").ok
            samples = []
            c0 = cpu_ms()
            for _ in range(LATENCY_RUNS):
                t = time.perf_counter()
                r = ex.run("print(1)")
                samples.append((time.perf_counter() - t) * 1000)
                assert r.ok and r.stdout == "1\n", r
            out["print1_ms"] = statistics.median(samples)
            out["print1_cpu_ms"] = (cpu_ms() - c0) / LATENCY_RUNS
            runs = [0]

            def one() -> None:
                ex.run("print(1)")
                runs[0] += 1

            c0 = cpu_ms()
            out["runs_per_s_4"] = rate(CLIENTS, THROUGHPUT_S, one)
            out["runs_4_cpu_ms"] = (cpu_ms() - c0) / runs[0]
            problems = he.load_problems()
            canonical = he.canonical_samples(problems)
            c0 = cpu_ms()
            wall = 0.0
            for _ in range(HUMANEVAL_PASSES):
                t = time.perf_counter()
                evaluation = he.evaluate(ex, canonical, problems, timeout_s=he.DEFAULT_TIMEOUT_S)
                wall += time.perf_counter() - t
                assert sum(bool(r["passed"]) for r in evaluation.rows) == len(problems)
            solved = HUMANEVAL_PASSES * len(problems)
            out["humaneval_cpu_ms"] = (cpu_ms() - c0) / solved
            out["humaneval_per_s"] = solved / wall
    finally:
        leave_cpuacct_group(cgroup)
    print(json.dumps(out))


def paired_ratios(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """The lowest, median and highest of b[i] / a[i]: each round's B over the A measured
    beside it, so that what the machine did in that round's minutes divides out."""
    if len(a) != len(b) or not a:
        raise ValueError(
            f"paired ratios need as many rounds on each side, got {len(a)} and {len(b)}"
        )
    ratios = [y / x for x, y in zip(a, b, strict=True)]
    return min(ratios), statistics.median(ratios), max(ratios)


def _round(tree: Path, home: str | None) -> dict[str, float]:
    env = dict(os.environ)
    if home:
        env["EXECBOX_HOME"] = home
    done = subprocess.run(
        [str(tree / ".venv" / "bin" / "python"), __file__, "--child"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        sys.exit(f"a round in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    if sys.argv[1:] == ["--child"]:
        _child()
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--a", type=Path, required=True)
    parser.add_argument("--b", type=Path, required=True)
    parser.add_argument("--a-home")
    parser.add_argument("--b-home")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    sides = {"A": (args.a.resolve(), args.a_home), "B": (args.b.resolve(), args.b_home)}
    seen: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    for i in range(args.rounds):
        for side in "AB" if i % 2 == 0 else "BA":
            seen[side].append(_round(*sides[side]))
            print(f"round {i + 1} {side}: {seen[side][-1]}", flush=True)
    result: dict[str, dict[str, float]] = {}
    for metric in seen["A"][0]:
        a = statistics.median(r[metric] for r in seen["A"])
        b = statistics.median(r[metric] for r in seen["B"])
        low, mid, high = paired_ratios(
            [r[metric] for r in seen["A"]], [r[metric] for r in seen["B"]]
        )
        result[metric] = {
            "A": round(a, 3),
            "B": round(b, 3),
            "B/A": round(b / a, 3),
            "paired": round(mid, 3),
            "paired_low": round(low, 3),
            "paired_high": round(high, 3),
        }
    print(f"{'metric':<18}{'A':>10}{'B':>10}{'B/A':>8}{'paired':>8}  range")
    for metric, row in result.items():
        spread = " (holds 1)" if row["paired_low"] <= 1 <= row["paired_high"] else ""
        print(
            f"{metric:<18}{row['A']:>10.2f}{row['B']:>10.2f}{row['B/A']:>8.3f}"
            f"{row['paired']:>8.3f}  {row['paired_low']:.3f}-{row['paired_high']:.3f}{spread}"
        )
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "ab.json").write_text(
        json.dumps(
            {"a": str(args.a), "b": str(args.b), "rounds": seen, "medians": result}, indent=2
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
