"""What replacing the sandbox host costs, to choose the rotation defaults (`Executor`'s
`rotate_after_runs` and `rotate_after_s`), and what an idle host holds in memory (the price of
a host per tenant).

One host is the three zygotes and the slot pool. Its start is measured as rotation pays for
it: the zygotes started, the heavy one's imports and page training done, the pool staged in
full (`pool_size` slots of each kind); then its close. CPU is that of the whole process tree,
read from a cpuacct cgroup of its own (cgroup v1; execbox nests the run cgroups under the
caller's, so the supervisors, init and staged programs are counted too), as in `cpu.py`.
The idle host's memory is the PSS and the private bytes (what a second host adds) of every
process of it, from /proc/<pid>/smaps_rollup.

`--load RUNS` instead measures what a replacement does to runs in flight around it: `print(1)`
from 4 clients on an executor replaced every `--every` runs, against one never replaced, in
alternating rounds (runs/s, and latency percentiles over all runs).

    .venv/bin/python bench/rotation.py [--starts 5] [--pool-size N] [--run-cpu-ms 3.8]
                                       [--runs-per-s 400]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # noqa: E402

from cpu import enter_cpuacct_group, leave_cpuacct_group  # noqa: E402
from latency import save_results  # noqa: E402

from execbox.backend import warm_imports  # noqa: E402
from execbox.image import LIGHT_PRELOAD, Image  # noqa: E402
from execbox.sandbox.host.pool import SLOT_KINDS  # noqa: E402
from execbox.sandbox.host.zygotes import ZygoteProcess  # noqa: E402


def descendants(root: int) -> list[int]:
    """Every live process under `root` (not itself)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    parent[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    found, frontier = [], [root]
    while frontier:
        kids = [pid for pid, ppid in parent.items() if ppid in frontier]
        found += kids
        frontier = kids
    return found


def memory_kib(pids: list[int]) -> dict[str, int]:
    """PSS and private (clean + dirty) KiB summed over `pids`."""
    total = {"pss_kib": 0, "private_kib": 0}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                for line in fh:
                    key, _, rest = line.partition(":")
                    if key == "Pss":
                        total["pss_kib"] += int(rest.split()[0])
                    elif key in ("Private_Clean", "Private_Dirty"):
                        total["private_kib"] += int(rest.split()[0])
        except OSError:
            continue
    return total


def under_load(runs: int, every: int, rounds: int = 2, clients: int = 4) -> dict[str, object]:
    """Runs/s and latency of `print(1)` from `clients` threads, replaced every `every` runs or
    never, in alternating rounds of `runs` runs each."""
    import threading

    from execbox.executor import Executor

    out: dict[str, dict[str, list[float]]] = {"rotating": {}, "never": {}}
    for _ in range(rounds):
        for name, after in (("never", None), ("rotating", every)):
            with Executor(cache=False, rotate_after_runs=after, rotate_after_s=None) as ex:
                ex._host.wait_heavy()
                for _ in range(50):
                    ex.run("print(1)")
                latencies: list[float] = []
                hosts: set[int] = set()

                def work(
                    ex: Executor = ex, latencies: list[float] = latencies, hosts: set[int] = hosts
                ) -> None:
                    for _ in range(runs // clients):
                        t = time.perf_counter()
                        r = ex.run("print(1)")
                        latencies.append((time.perf_counter() - t) * 1000)
                        hosts.add(id(ex._hosts.current()))
                        assert r.ok, r

                threads = [threading.Thread(target=work) for _ in range(clients)]
                t0 = time.monotonic()
                for th in threads:
                    th.start()
                for th in threads:
                    th.join()
                wall = time.monotonic() - t0
                row = out[name]
                row.setdefault("runs_per_s", []).append(len(latencies) / wall)
                row.setdefault("latency_ms", []).extend(latencies)
                row.setdefault("hosts", []).append(len(hosts))
            print(name, round(len(latencies) / wall), "runs/s,", len(hosts), "hosts", flush=True)
    result: dict[str, object] = {"runs": runs, "every": every, "rounds": rounds}
    for name, row in out.items():
        lat = sorted(row["latency_ms"])
        result[name] = {
            "runs_per_s": round(statistics.mean(row["runs_per_s"]), 1),
            "p50_ms": round(lat[len(lat) // 2], 2),
            "p99_ms": round(lat[int(len(lat) * 0.99)], 2),
            "max_ms": round(lat[-1], 1),
            "hosts_per_round": row["hosts"],
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument(
        "--pool-size",
        type=int,
        default=None,
        help="slots of each kind (default: the Executor's, 2 per CPU)",
    )
    parser.add_argument(
        "--run-cpu-ms",
        type=float,
        default=3.8,
        help="CPU of one run at full load (bench/cpu.py, 4 clients)",
    )
    parser.add_argument(
        "--runs-per-s",
        type=float,
        default=400.0,
        help="runs/s at full load (bench/throughput.py, 4 clients)",
    )
    parser.add_argument(
        "--load",
        type=int,
        default=0,
        metavar="RUNS",
        help="measure runs around replacements instead (see above)",
    )
    parser.add_argument(
        "--every", type=int, default=1000, help="with --load: replace the host after this many runs"
    )
    args = parser.parse_args()
    if args.load:
        result = under_load(args.load, args.every)
        print(result)
        save_results("rotation_load", result)
        return
    cgroup = enter_cpuacct_group("bench/rotation.py")

    def usage_s() -> float:
        with open(f"{cgroup}/cpuacct.usage") as fh:
            return int(fh.read()) / 1e9

    image = Image.load()
    pool_size = args.pool_size or 2 * (os.cpu_count() or 1)  # the Executor's default
    rows: list[dict[str, float]] = []
    memory: dict[str, int] = {}
    try:
        for i in range(args.starts):
            time.sleep(1.0)
            u0, t0 = usage_s(), time.monotonic()
            host = ZygoteProcess(
                image,
                warm_imports(image.root),
                list(LIGHT_PRELOAD),
                pool_size=pool_size,
            )
            light_ready = time.monotonic() - t0
            host.wait_heavy()
            heavy_ready = time.monotonic() - t0
            while any(host.pool.ready_count(k) < pool_size for k in SLOT_KINDS):
                time.sleep(0.005)
            staged = time.monotonic() - t0
            start_cpu = usage_s() - u0
            if i == 0:
                time.sleep(2.0)  # settled: nothing of the start is still being written
                memory = memory_kib(descendants(os.getpid()))
            u1, t1 = usage_s(), time.monotonic()
            host.close()
            close_wall = time.monotonic() - t1
            time.sleep(0.5)  # the supervisors' teardown after `close` returned
            rows.append(
                {
                    "light_ready_s": light_ready,
                    "heavy_ready_s": heavy_ready,
                    "staged_s": staged,
                    "start_cpu_s": start_cpu,
                    "close_wall_s": close_wall,
                    "close_cpu_s": usage_s() - u1,
                }
            )
            print({k: round(v, 3) for k, v in rows[-1].items()}, flush=True)
    finally:
        leave_cpuacct_group(cgroup)
    med = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}
    cost_s = med["start_cpu_s"] + med["close_cpu_s"]
    load_cpu_s = args.run_cpu_ms / 1000 * args.runs_per_s  # CPU seconds a second at full load
    result = {
        "pool_size": pool_size,
        "starts": args.starts,
        "median": med,
        "rotation_cpu_s": round(cost_s, 3),
        # Runs per rotation for the rotation to cost 1% and 2% of the CPU the runs use.
        "runs_for_1pct": round(cost_s / (0.01 * args.run_cpu_ms / 1000)),
        "runs_for_2pct": round(cost_s / (0.02 * args.run_cpu_ms / 1000)),
        "full_load_cpu_s_per_s": round(load_cpu_s, 2),
        "idle_host_memory_kib": memory,
        "idle_host_slots": pool_size * len(SLOT_KINDS),
    }
    print(result)
    save_results("rotation", result)


if __name__ == "__main__":
    main()
