"""Runs in named environments against the default, in one run: the first run in a cold
environment (its sandbox host starts), then warm runs in each environment interleaved with
default runs, medians and ratios. Writes bench/results/environments.json.

    .venv/bin/python bench/environments.py [--runs 100] [--env NAME]... [--one-tier]

The environments: `benchsmall`, built here offline from a wheel made on the spot (a tree with
no data stack: its heavy zygote preloads nothing), and each `--env` given (say `ml`, when built:
`execbox env build ml`). Workloads: `print(1)` (a light slot), `import numpy` (a heavy slot,
where the tree has numpy), back to back and 30 ms apart; where the tree has more than the data
stack, `import sklearn` (a full slot: its first run starts the full zygote) against `import
numpy` in the default, 30 ms apart; the resident memory of each zygote; and the CPU time a run
spends on each import of PROBES its tree has (what a run pays for an import its zygote did not
preload). `--one-tier`: no full zygote, the heavy one preloads all the warm imports (as before
the tiers), to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # noqa: E402

from tests.wheels import make_wheel  # noqa: E402

from execbox import (
    backend,  # noqa: E402
    environments,  # noqa: E402
)
from execbox.backend import warm_imports, warm_tiers  # noqa: E402
from execbox.executor import Executor  # noqa: E402
from execbox.policy import load_profiles  # noqa: E402

SMALL = "benchsmall"
NUMPY = "import numpy\nprint(1)\n"
SKLEARN = "import sklearn\nprint(1)\n"
# Imports data code commonly makes beyond the data stack, timed in a run of an environment
# that has them (`ml`): which are worth a zygote's preload.
PROBES = [
    "sklearn",
    "sklearn.linear_model",
    "statsmodels.api",
    "seaborn",
    "pyarrow",
    "openpyxl",
    "sympy",
    "scipy.stats",
]
TIMED_IMPORT = (  # CPU time: the machines these run on are shared, their wall time noisy
    "import time\nt = time.process_time()\nimport {module}\n"
    "print(round((time.process_time() - t) * 1000, 2))\n"
)


def stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered), 3),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 3),
        "n": len(ordered),
    }


def build_small() -> None:
    """`benchsmall`: one pure-Python package from a wheel directory, no index (offline)."""
    with tempfile.TemporaryDirectory() as tmp:
        wheels = Path(tmp)
        make_wheel(wheels, "benchpkg", {"benchpkg/__init__.py": "ANSWER = 42\n"})
        (wheels / "requirements.txt").write_text("benchpkg\n")
        environments.build(
            SMALL,
            requirements=wheels / "requirements.txt",
            find_links=wheels,
            no_index=True,
            log=False,
        )


def timed(executor: Executor, code: str, environment: str | None, expect: str | None) -> float:
    t = time.perf_counter()
    result = executor.run(code, environment=environment)
    elapsed = (time.perf_counter() - t) * 1000
    assert result.ok, result
    assert expect is None or result.stdout == expect, result
    return elapsed


def compare(
    executor: Executor,
    name: str,
    code: str,
    expect: str,
    runs: int,
    paced: bool,
    default_code: str | None = None,
) -> dict[str, object]:
    """`code` run `runs` times in environment `name` and in the default (`default_code` there,
    when given), interleaved in ABBA order (drift hits both alike); `paced`: 30 ms apart, each
    run with its pool restaged."""
    mine: list[float] = []
    default: list[float] = []
    for i in range(runs):
        for where in (name, None) if i % 2 else (None, name):
            if paced:
                time.sleep(0.03)
            there = code if where or default_code is None else default_code
            (mine if where else default).append(timed(executor, there, where, expect))
    m, d = stats(mine), stats(default)
    return {"environment": m, "default": d, "ratio": round(m["median_ms"] / d["median_ms"], 3)}


def zygote_memory(pid: int | None) -> dict[str, float] | None:
    """The zygote's resident and proportional set sizes, MiB (what it costs to keep)."""
    if pid is None:
        return None
    sizes = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Rss", "Pss"):
            sizes[key.lower() + "_mib"] = round(int(value.split()[0]) / 1024, 1)
    return sizes


def probe_imports(executor: Executor, name: str, tree: Path, runs: int) -> dict[str, float]:
    """The CPU milliseconds a run in `name` spends importing each of PROBES its tree has."""
    have = environments.modules_of(tree)
    probes = {}
    for module in PROBES:
        if module.split(".")[0] not in have:
            continue
        inside = []
        for _ in range(runs):
            code = TIMED_IMPORT.format(module=module)
            run = executor.run(code, environment=name, limits={"timeout_s": 60})
            assert run.ok, run
            inside.append(float(run.stdout))
        probes[module] = round(statistics.median(inside), 1)
    return probes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--env", action="append", default=[], help="another built environment")
    parser.add_argument("--probe-runs", type=int, default=5)
    parser.add_argument(
        "--one-tier",
        action="store_true",
        help="no full zygote: the heavy one preloads all of WARM_IMPORTS the tree has, and "
        "every data run forks it (as before the tiers)",
    )
    args = parser.parse_args()
    if args.one_tier:
        backend.warm_tiers = lambda tree: (warm_imports(tree), [])
    build_small()
    names = [SMALL, *args.env]
    profiles = load_profiles()
    profiles["data"] = profiles["data"].model_copy(update={"environments": names})
    tmp = tempfile.TemporaryDirectory()
    executor = Executor(cache=False, profiles=profiles, records=f"sqlite:///{tmp.name}/runs.db")
    machine: dict[str, object] = {"cpus": os.cpu_count(), "load_at_start": os.getloadavg()}
    result: dict[str, object] = {"machine": machine, "environments": {}}
    with executor, tmp:
        timed(executor, "print(1)", None, "1\n")
        time.sleep(2.0)  # the default host's heavy zygote and pool settle
        per_env: dict[str, dict[str, object]] = {}
        for name in names:
            tree = environments.lookup(name)
            has_numpy = "numpy" in warm_imports(tree)
            has_full = bool(warm_tiers(tree)[1]) and not args.one_tier
            # Cold: the environment's host starts for this run (light zygote and pool).
            cold = timed(executor, "print(1)", name, "1\n")
            cold_heavy = timed(executor, NUMPY, name, "1\n") if has_numpy else None
            # The first run that needs the full zygote starts it (as in use, not ahead).
            cold_full = timed(executor, SKLEARN, name, "1\n") if has_full else None
            time.sleep(2.0)  # its heavy zygote and pool settle, as the default's did
            for _ in range(10):
                timed(executor, "print(1)", name, "1\n")
                timed(executor, "print(1)", None, "1\n")
            workloads = {"print(1)": ("print(1)", "1\n")}
            if has_numpy:
                workloads["import numpy"] = (NUMPY, "1\n")
            warm: dict[str, object] = {}
            for label, (code, expect) in workloads.items():
                for paced in (False, True):
                    key = label + (", 30 ms apart" if paced else ", back to back")
                    warm[key] = compare(executor, name, code, expect, args.runs, paced)
            if has_full or (args.one_tier and "sklearn" in warm_imports(tree)):
                # Against a numpy run in the default: what a warm sklearn run costs.
                warm["import sklearn vs default's numpy, 30 ms apart"] = compare(
                    executor, name, SKLEARN, "1\n", args.runs, True, default_code=NUMPY
                )
            here = executor.stats().environments[name]
            memory = {
                "light": zygote_memory(here.light_zygote_pid),
                "heavy": zygote_memory(here.heavy_zygote_pid),
                "full": zygote_memory(here.full_zygote_pid),
            }
            probes = probe_imports(executor, name, tree, args.probe_runs)
            per_env[name] = {
                "preloaded": warm_imports(tree),
                "cold_first_run_ms": round(cold, 1),
                "cold_first_heavy_run_ms": round(cold_heavy, 1) if cold_heavy else None,
                "cold_first_full_run_ms": round(cold_full, 1) if cold_full else None,
                "full_preloaded": list(here.full_preloaded),
                "zygote_memory": memory,
                "warm": warm,
                "import_cpu_ms_inside_a_run": probes,
            }
        result["environments"] = per_env
    machine["load_at_end"] = os.getloadavg()
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    stem = "environments-one-tier" if args.one_tier else "environments"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    for name, info in per_env.items():
        print(f"{name}: preloaded {info['preloaded']}")
        print(f"  first run, cold host: {info['cold_first_run_ms']} ms", end="")
        if info["cold_first_heavy_run_ms"]:
            print(f"; first numpy run: {info['cold_first_heavy_run_ms']} ms", end="")
        if info["cold_first_full_run_ms"]:
            print(f"; first sklearn run: {info['cold_first_full_run_ms']} ms", end="")
        print()
        print(f"  zygote memory: {info['zygote_memory']}")
        warm_info = info["warm"]
        assert isinstance(warm_info, dict)
        for label, row in warm_info.items():
            print(
                f"  warm {label:<32} {row['environment']['median_ms']:8.2f} ms vs default "
                f"{row['default']['median_ms']:8.2f} ms  (x{row['ratio']})"
            )
        probes_info = info["import_cpu_ms_inside_a_run"]
        assert isinstance(probes_info, dict)
        for module, ms in probes_info.items():
            print(f"  import {module:<22} {ms:8.1f} ms of CPU inside a run")


if __name__ == "__main__":
    main()
