"""What the cluster path costs: `print(1)` through a local Ray cluster (over the hosts' direct
connections, and through Ray's actor calls alone) against the local executor and against a bare
call on a node's host (a Ray call, and a direct one), all interleaved in blocks in the same run
(so the machine's load is the same for each), with the CPU each takes per run; then runs/s with 4
callers and of a CPU-bound run (the work per run held fixed) on one node and on three. Every
node here is a process of this one machine, so the cluster can only add overhead: the
one-to-three figure is overhead, not a speed-up.

CPU per run is read from the kernel's per-thread run time (`/proc/PID/task/*/schedstat`) of
the caller's process and of the node's host actor, summed over each block: the sandbox's own
processes (zygote, supervisor, the program) are left out on both sides, as they do the same
work. Both executors record into one throwaway SQLite file (a real cluster records into
PostgreSQL). It runs itself again inside a network namespace of its own with only lo up (Ray
dials public resolvers otherwise; see tests/cluster/conftest.py). Writes
bench/results/cluster.json.

    .venv/bin/python bench/cluster.py [--runs 300] [--block 20] [--seconds 5]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # noqa: E402

from latency import save_results, stats  # noqa: E402

from execbox.executor import Executor  # noqa: E402

CALLERS = 4
IDLE_S = 5.0  # how long each process's CPU is read with nothing running
WORK = "s = 0\nfor i in range(300_000):\n    s += i\nprint(s)"  # ~15 ms of CPU
SETTINGS = {"max_concurrency": 4, "pool_size": 2, "rotate_after_runs": None, "rotate_after_s": None}


def cpu_ms(pid: int) -> float:
    """CPU time of every thread of `pid` so far, in ms (the scheduler's clock, to the ns)."""
    total = 0
    task = Path(f"/proc/{pid}/task")
    for tid in os.listdir(task):
        try:
            total += int((task / tid / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):  # a thread that just ended
            continue
    return total / 1e6


class Side:
    """One way to run `print(1)`: its wall samples and the CPU of the processes it uses."""

    def __init__(self, name: str, call: Callable[[], None], pids: list[int]) -> None:
        self.name, self.call, self.pids = name, call, pids
        self.wall: list[float] = []
        self.cpu = {pid: 0.0 for pid in pids}

    def block(self, n: int) -> None:
        before = {pid: cpu_ms(pid) for pid in self.pids}
        for _ in range(n):
            t = time.perf_counter()
            self.call()
            self.wall.append((time.perf_counter() - t) * 1000)
        for pid in self.pids:
            self.cpu[pid] += cpu_ms(pid) - before[pid]

    def result(self, names: dict[int, str], idle: dict[int, float]) -> dict[str, Any]:
        """Its latency and CPU per run, and that CPU less what each process spends idle per
        second over the run's mean wall time (Ray's and the executor's own timers)."""
        n = len(self.wall)
        cpu = {names[pid]: round(ms / n, 3) for pid, ms in self.cpu.items()}
        mean_s = sum(self.wall) / n / 1000
        busy = {names[pid]: round(ms / n - idle[pid] * mean_s, 3) for pid, ms in self.cpu.items()}
        # The low tail: what a call costs when the machine's other load leaves it alone.
        p10 = round(sorted(self.wall)[n // 10], 3)
        return {
            **stats(self.wall),
            "p10_ms": p10,
            "cpu_ms_per_run": {**cpu, "total": round(sum(cpu.values()), 3)},
            "cpu_ms_per_run_less_idle": {**busy, "total": round(sum(busy.values()), 3)},
        }


def interleaved(sides: list[Side], runs: int, block: int) -> None:
    """`runs` calls of each side, in blocks of `block`, the sides' order turning each round."""
    for side in sides:  # warm each path up
        side.block(20)
        side.wall.clear()
        side.cpu = dict.fromkeys(side.cpu, 0.0)
    for round_ in range(max(1, runs // block)):
        k = round_ % len(sides)
        for side in sides[k:] + sides[:k]:
            side.block(block)


def check(ex: Executor) -> Callable[[], None]:
    def call() -> None:
        result = ex.run("print(1)")
        assert result.ok and result.stdout == "1\n", result

    return call


def rate(ex: Executor, code: str, callers: int, seconds: float) -> float:
    """Runs per second that ended ok, with `callers` threads running `code` back to back."""
    done = [0] * callers
    stop = time.monotonic() + seconds

    def caller(i: int) -> None:
        while time.monotonic() < stop:
            done[i] += ex.run(code).ok

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
    t = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return round(sum(done) / (time.monotonic() - t), 1)


def latency_ab(
    local: Executor, ex: Executor, ex_ray: Executor, backend: Any, args: argparse.Namespace
) -> dict[str, Any]:
    """Local, cluster (direct and through Ray) and bare-call `print(1)` interleaved; the
    overheads at the median."""
    import pickle

    import ray

    host = backend._serving()[0]
    actor = host.actor
    host_pid = ray.get(actor.__ray_call__.remote(lambda _self: os.getpid()), timeout=30)
    me = os.getpid()
    names = {me: "caller", host_pid: "host"}

    def bare() -> None:
        ray.get(actor.status.remote(), timeout=30)

    ping = pickle.dumps(("ping", ()))

    def bare_direct() -> None:
        host.channel.call(ping, 30)

    sides = [
        Side("local", check(local), [me]),
        Side("cluster", check(ex), [me, host_pid]),
        Side("cluster_ray", check(ex_ray), [me, host_pid]),
        Side("bare_call", bare, [me, host_pid]),
        Side("bare_direct", bare_direct, [me, host_pid]),
    ]
    load = os.getloadavg()
    interleaved(sides, args.runs, args.block)
    before = {pid: cpu_ms(pid) for pid in names}
    time.sleep(IDLE_S)
    idle = {pid: (cpu_ms(pid) - before[pid]) / IDLE_S for pid in names}
    out: dict[str, Any] = {s.name: s.result(names, idle) for s in sides}
    out["idle_cpu_ms_per_s"] = {names[pid]: round(ms, 2) for pid, ms in idle.items()}
    here, there, call = (out[k]["median_ms"] for k in ("local", "cluster", "bare_call"))
    out["overhead_ms_median"] = round(there - here, 3)
    out["overhead_ms_p10"] = round(out["cluster"]["p10_ms"] - out["local"]["p10_ms"], 3)
    out["overhead_ms_min"] = round(out["cluster"]["min_ms"] - out["local"]["min_ms"], 3)
    out["overhead_beyond_bare_call_ms"] = round(there - here - call, 3)
    cpu = {k: out[k]["cpu_ms_per_run"]["total"] for k in ("local", "cluster", "bare_call")}
    out["overhead_cpu_ms_per_run"] = round(cpu["cluster"] - cpu["local"], 3)
    less = {
        k: out[k]["cpu_ms_per_run_less_idle"]["total"] for k in ("local", "cluster", "bare_call")
    }
    out["overhead_cpu_less_idle_ms_per_run"] = round(less["cluster"] - less["local"], 3)
    out["overhead_cpu_beyond_bare_call_ms"] = round(
        cpu["cluster"] - cpu["local"] - cpu["bare_call"], 3
    )
    ray_median = out["cluster_ray"]["median_ms"]
    out["ray_path"] = {
        "overhead_ms_median": round(ray_median - here, 3),
        "overhead_ms_p10": round(out["cluster_ray"]["p10_ms"] - out["local"]["p10_ms"], 3),
        "overhead_ms_min": round(out["cluster_ray"]["min_ms"] - out["local"]["min_ms"], 3),
        "overhead_cpu_ms_per_run": round(
            out["cluster_ray"]["cpu_ms_per_run"]["total"] - cpu["local"], 3
        ),
    }
    out["load_average"] = [round(x, 2) for x in (*load, *os.getloadavg())]
    return out


def in_cluster(args: argparse.Namespace, db: str) -> dict[str, Any]:
    from ray.cluster_utils import Cluster

    from execbox.cluster.backend import RayBackend

    out: dict[str, Any] = {}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False},
    )
    try:
        local = Executor(cache=False, records=db, **SETTINGS)  # type: ignore[arg-type]
        backend = RayBackend(cluster.address, SETTINGS)
        through_ray = RayBackend(cluster.address, SETTINGS, direct=False)
        # A backend given directly: the cluster's refusal of SQLite is for `cluster=`.
        with (
            local,
            Executor(backend=backend, records=db, cache=False, max_concurrency=12) as ex,
            Executor(backend=through_ray, records=db, cache=False, max_concurrency=12) as ex_ray,
        ):
            assert backend._serving()[0].channel is not None, "no direct connection to the host"
            out["one_node"] = latency_ab(local, ex, ex_ray, backend, args)
            out["local"] = {
                "runs_per_s_4_callers": rate(local, "print(1)", CALLERS, args.seconds),
                "work_runs_per_s_12_callers": rate(local, WORK, 12, args.seconds),
            }
            out["one_node"]["runs_per_s_4_callers"] = rate(ex, "print(1)", CALLERS, args.seconds)
            out["one_node"]["work_runs_per_s_12_callers"] = rate(ex, WORK, 12, args.seconds)
            cluster.add_node(num_cpus=1)
            cluster.add_node(num_cpus=1)
            deadline = time.monotonic() + 180
            while len(backend.nodes()) < 3:
                assert time.monotonic() < deadline, "the new nodes never served"
                time.sleep(0.2)
            out["three_nodes"] = {
                "runs_per_s_4_callers": rate(ex, "print(1)", CALLERS, args.seconds),
                "work_runs_per_s_12_callers": rate(ex, WORK, 12, args.seconds),
            }
    finally:
        cluster.shutdown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    if sorted(name for _, name in socket.if_nameindex()) != ["lo"]:
        again = " ".join([sys.executable, *map(_quote, sys.argv)])
        os.execvp("unshare", ["unshare", "-n", "sh", "-c", f"ip link set lo up && exec {again}"])
    with tempfile.TemporaryDirectory() as tmp:
        result = in_cluster(args, f"sqlite:///{tmp}/runs.db")
    one = result["one_node"]
    print(f"load average {one['load_average']} (1, 5, 15 min at the start, then at the end)")
    for name in ("local", "cluster", "cluster_ray", "bare_call", "bare_direct"):
        r = one[name]
        print(
            f"{name:<11} print(1) median {r['median_ms']:.2f} ms  p90 {r['p90_ms']:.2f}  "
            f"p10 {r['p10_ms']:.2f}  min {r['min_ms']:.2f}  CPU/run {r['cpu_ms_per_run']}"
        )
    print(
        f"cluster overhead at the median: {one['overhead_ms_median']} ms "
        f"({one['overhead_beyond_bare_call_ms']} ms beyond a bare call on the host; "
        f"{one['overhead_ms_p10']} ms at p10, {one['overhead_ms_min']} at the minimum); "
        f"CPU {one['overhead_cpu_ms_per_run']} ms a run "
        f"({one['overhead_cpu_beyond_bare_call_ms']} beyond a bare call; "
        f"{one['overhead_cpu_less_idle_ms_per_run']} less the idle CPU "
        f"{one['idle_cpu_ms_per_s']} ms/s over each run's time)"
    )
    ray_path = one["ray_path"]
    print(
        f"through Ray's calls alone: {ray_path['overhead_ms_median']} ms at the median, "
        f"{ray_path['overhead_ms_p10']} ms at p10, {ray_path['overhead_ms_min']} at the minimum, CPU {ray_path['overhead_cpu_ms_per_run']} ms a run"
    )
    for name in ("local", "one_node", "three_nodes"):
        r = result[name]
        print(
            f"{name:<11} {r['runs_per_s_4_callers']:.0f} runs/s (4 callers)  "
            f"{r['work_runs_per_s_12_callers']:.1f} CPU-bound runs/s (12 callers)"
        )
    save_results("cluster", result)


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


if __name__ == "__main__":
    main()
