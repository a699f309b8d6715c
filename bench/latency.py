"""Latency of isolated runs through Executor.run, against bare interpreters measured in the same
run: `print(1)` against `python3 -c pass`, and a pandas snippet against a bare interpreter doing
the same work. Also: how long the executor takes to be ready and what it holds in memory idle.
Then JavaScript's `console.log(1)` and bash's `echo 1`, paced, each beside its bare interpreter
(`node -e`, `bash -c`) called between the same runs (`languages.latency`).
Prints medians, p90 and ratios; writes bench/results/latency.json.

    .venv/bin/python bench/latency.py [--runs 200] [--baseline-runs 40] [--secrets 3]
                                      [--language-runs 40]

`--secrets N` registers N secret values with every run (`run(..., secrets=...)`), so the
per-run redaction of registered values is in what is measured.
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

from languages import latency as language_latency  # noqa: E402
from languages import warm  # noqa: E402

from execbox.executor import Executor  # noqa: E402 - imported before the clock starts
from execbox.image import Image  # noqa: E402

OTHER_LANGUAGES = ("javascript", "bash")

PANDAS = (
    "import pandas as pd\n"
    "df = pd.DataFrame({'k': [i % 10 for i in range(10_000)], 'v': range(10_000)})\n"
    "print(df.groupby('k').v.agg(['sum', 'mean']).shape)\n"
)


def stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered), 3),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 3),
        "min_ms": round(ordered[0], 3),
        "n": len(ordered),
    }


def save_results(name: str, result: object) -> None:
    """Write a benchmark's result as bench/results/<name>.json."""
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")


def time_command(argv: list[str], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        samples.append((time.perf_counter() - t) * 1000)
    return samples


def time_runs(
    executor: Executor, code: str, n: int, expect: str, secrets: tuple[str, ...] = ()
) -> list[float]:
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        r = executor.run(code, secrets=secrets)
        samples.append((time.perf_counter() - t) * 1000)
        assert r.ok and r.stdout == expect, r
    return samples


def tree_pss_kib(*root_pids: int) -> int:
    """Proportional set size of processes and all their descendants (shared pages split)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, list(root_pids)
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                for line in fh:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--baseline-runs", type=int, default=40)
    parser.add_argument(
        "--secrets", type=int, default=0, help="secret values registered with every run"
    )
    parser.add_argument(
        "--language-runs", type=int, default=40, help="paced runs of each other language"
    )
    args = parser.parse_args()
    # Realistic credentials: 40-64 characters, one with a quote and one not ASCII.
    secrets = tuple(
        f"sk-bench{i}-" + "x7Qz" * (8 + i) + ("'\u00e9" if i % 2 else "")
        for i in range(args.secrets)
    )

    image = Image.load()
    # The interpreter the runtime image is built on, called directly (no shims in between).
    python3 = str(image.base_prefix / "bin" / "python3")
    tmp = tempfile.TemporaryDirectory()
    t = time.perf_counter()
    # Every run really runs (no cache) and is recorded, as in production, into a scratch DB.
    executor = Executor(cache=False, records=f"sqlite:///{tmp.name}/runs.db")
    first = executor.run("print(1)")
    ready_ms = (time.perf_counter() - t) * 1000
    assert first.ok, first
    # The heavy zygote starts in the background (what needs it waits): the first pandas
    # result after start, from the same start.
    first_pandas = executor.run(PANDAS)
    first_pandas_ms = (time.perf_counter() - t) * 1000
    assert first_pandas.ok and first_pandas.stdout == "(10, 2)\n", first_pandas
    with executor, tmp:
        time.sleep(1.0)  # let the pool stage its slots
        # The three zygotes and what they forked: supervisors, init, staged programs.
        host = executor.stats().host
        assert host is not None
        idle_pss_mib = (
            tree_pss_kib(host.zygote_pid, host.heavy_zygote_pid, host.light_zygote_pid) / 1024
        )
        time_runs(executor, "print(1)", 10, "1\n", secrets)
        print1 = time_runs(executor, "print(1)", args.runs, "1\n", secrets)
        paced = []
        for _ in range(max(20, args.runs // 4)):  # with the pool settled between requests
            time.sleep(0.03)
            paced += time_runs(executor, "print(1)", 1, "1\n", secrets)
        pandas = time_runs(executor, PANDAS, max(20, args.runs // 4), "(10, 2)\n", secrets)
        # Back to back, each run's slot restages (its program copies ~10 MB of warm pages)
        # on the other core while the next runs: paced, the run has the machine to itself.
        pandas_paced = []
        for _ in range(max(20, args.runs // 4)):
            time.sleep(0.03)
            pandas_paced += time_runs(executor, PANDAS, 1, "(10, 2)\n", secrets)
        languages = {}
        for language in OTHER_LANGUAGES:
            warm(executor, language)
            languages[language] = language_latency(executor, language, args.language_runs)
    n_base = args.baseline_runs
    baselines = {
        "python3 -c pass": time_command([python3, "-c", "pass"], n_base),
        "python3 -I -S -c pass": time_command([python3, "-I", "-S", "-c", "pass"], n_base),
        "runtime python, pandas snippet": time_command(
            [str(image.python), "-c", PANDAS], max(5, n_base // 4)
        ),
    }
    result = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "secrets_per_run": args.secrets,
        "executor_ready_ms": round(ready_ms, 1),
        "first_pandas_result_ms_after_start": round(first_pandas_ms, 1),
        "executor_idle_pss_mib": round(idle_pss_mib, 1),
        "isolated_print1_back_to_back": stats(print1),
        "isolated_print1_paced": stats(paced),
        "isolated_pandas_snippet": stats(pandas),
        "isolated_pandas_snippet_paced": stats(pandas_paced),
        "baselines": {name: stats(s) for name, s in baselines.items()},
        "languages_paced": languages,
    }
    b = result["baselines"]
    result["ratios"] = {
        "print1 / python3 -c pass": round(
            result["isolated_print1_back_to_back"]["median_ms"] / b["python3 -c pass"]["median_ms"],
            3,
        ),
        "print1 / python3 -I -S -c pass": round(
            result["isolated_print1_back_to_back"]["median_ms"]
            / b["python3 -I -S -c pass"]["median_ms"],
            3,
        ),
        "pandas snippet / bare interpreter": round(
            result["isolated_pandas_snippet"]["median_ms"]
            / b["runtime python, pandas snippet"]["median_ms"],
            3,
        ),
        "pandas snippet 30 ms apart / bare interpreter": round(
            result["isolated_pandas_snippet_paced"]["median_ms"]
            / b["runtime python, pandas snippet"]["median_ms"],
            3,
        ),
    }
    print(
        f"executor ready (constructor + first run) in {ready_ms:.0f} ms; first pandas "
        f"result {first_pandas_ms:.0f} ms after start; idle executor PSS {idle_pss_mib:.0f} MiB"
    )
    print(f"{'workload':<52}{'median ms':>10}{'p90 ms':>10}")
    rows = [
        ("isolated print(1), back to back", "isolated_print1_back_to_back"),
        ("isolated print(1), 30 ms apart", "isolated_print1_paced"),
        ("isolated pandas snippet, back to back", "isolated_pandas_snippet"),
        ("isolated pandas snippet, 30 ms apart", "isolated_pandas_snippet_paced"),
    ]
    for label, key in rows:
        print(f"{label:<52}{result[key]['median_ms']:>10.2f}{result[key]['p90_ms']:>10.2f}")
    for name in baselines:
        print(f"{'bare ' + name:<52}{b[name]['median_ms']:>10.2f}{b[name]['p90_ms']:>10.2f}")
    for name, ratio in result["ratios"].items():
        print(f"ratio {name}: {ratio:.3f}")
    for language, measured in languages.items():
        ours, bare = measured["execbox"], measured["bare"]
        print(
            f"{language:<11} paced: execbox median {ours['median_ms']:.2f} ms "
            f"(p90 {ours['p90_ms']:.2f}), bare median {bare['median_ms']:.2f} ms "
            f"(p90 {bare['p90_ms']:.2f}), ratio {ours['median_ms'] / bare['median_ms']:.3f}"
        )
    save_results("latency", result)


if __name__ == "__main__":
    main()
