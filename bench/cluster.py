"""What the cluster path costs: `print(1)` latency and runs/s through a local Ray cluster against
the local executor in the same run, then runs/s of a CPU-bound run (the work per run held fixed)
on one node and on three. Every node here is a process of this one machine, so the cluster can
only add overhead: the one-to-three figure is overhead, not a speed-up.

Both sides record into a throwaway SQLite file (the same store for both, so the difference is
the cluster's; a real cluster records into PostgreSQL). It runs itself again inside a network
namespace of its own with only lo up (Ray dials public resolvers otherwise; see
tests/cluster/conftest.py). Writes bench/results/cluster.json.

    .venv/bin/python bench/cluster.py [--runs 200] [--seconds 5]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # noqa: E402

from latency import save_results, stats  # noqa: E402

from execbox.executor import Executor  # noqa: E402

CALLERS = 4
WORK = "s = 0\nfor i in range(300_000):\n    s += i\nprint(s)"  # ~15 ms of CPU
SETTINGS = {"max_concurrency": 4, "pool_size": 2, "rotate_after_runs": None, "rotate_after_s": None}


def latency(ex: Executor, n: int) -> dict[str, float]:
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        result = ex.run("print(1)")
        samples.append((time.perf_counter() - t) * 1000)
        assert result.ok, result
    return stats(samples)


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


def actor_call(backend: Any, n: int) -> dict[str, float]:
    """The floor: a round trip to a node's host that does nothing, on this machine now."""
    import ray

    actor = backend._serving()[0].actor
    samples = []
    for _ in range(30 + n):
        t = time.perf_counter()
        ray.get(actor.status.remote(), timeout=30)
        samples.append((time.perf_counter() - t) * 1000)
    return stats(samples[30:])


def measure(ex: Executor, args: argparse.Namespace) -> dict[str, Any]:
    for _ in range(30):
        ex.run("print(1)")
    return {
        "print1": latency(ex, args.runs),
        "runs_per_s_4_callers": rate(ex, "print(1)", CALLERS, args.seconds),
    }


def in_cluster(args: argparse.Namespace, db: str) -> dict[str, Any]:
    from ray.cluster_utils import Cluster

    from execbox.cluster.backend import RayBackend

    out: dict[str, Any] = {}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False},
    )
    try:

        def executor(backend: RayBackend) -> Executor:
            # A backend given directly: the cluster's refusal of SQLite is for `cluster=`.
            return Executor(backend=backend, records=db, cache=False, max_concurrency=12)

        backend = RayBackend(cluster.address, SETTINGS)
        with executor(backend) as ex:
            out["bare_actor_call"] = actor_call(backend, args.runs)
            out["one_node"] = measure(ex, args)
            out["one_node"]["work_runs_per_s_12_callers"] = rate(ex, WORK, 12, args.seconds)
            cluster.add_node(num_cpus=1)
            cluster.add_node(num_cpus=1)
            deadline = time.monotonic() + 180
            while len(backend.nodes()) < 3:
                assert time.monotonic() < deadline, "the new nodes never served"
                time.sleep(0.2)
            out["three_nodes"] = measure(ex, args)
            out["three_nodes"]["work_runs_per_s_12_callers"] = rate(ex, WORK, 12, args.seconds)
    finally:
        cluster.shutdown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    if sorted(name for _, name in socket.if_nameindex()) != ["lo"]:
        again = " ".join([sys.executable, *map(_quote, sys.argv)])
        os.execvp("unshare", ["unshare", "-n", "sh", "-c", f"ip link set lo up && exec {again}"])
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{tmp}/runs.db"
        with Executor(cache=False, records=db, **SETTINGS) as ex:  # type: ignore[arg-type]
            local = measure(ex, args)
            local["work_runs_per_s_12_callers"] = rate(ex, WORK, 12, args.seconds)
        cluster = in_cluster(args, db)
    result = {"local": local, **cluster}
    one, three = cluster["one_node"], cluster["three_nodes"]
    result["overhead_ms_median"] = {
        "one_node": round(one["print1"]["median_ms"] - local["print1"]["median_ms"], 3),
        "three_nodes": round(three["print1"]["median_ms"] - local["print1"]["median_ms"], 3),
    }
    show("local", local)
    show("1 node", one)
    show("3 nodes", three)
    print(f"cluster overhead at the median: {result['overhead_ms_median']}")
    print(f"a bare call on a node's host: {cluster['bare_actor_call']}")
    save_results("cluster", result)


def show(name: str, r: dict[str, Any]) -> None:
    print(
        f"{name:<8} print(1) median {r['print1']['median_ms']:.2f} ms  p90 "
        f"{r['print1']['p90_ms']:.2f} ms  {r['runs_per_s_4_callers']:.0f} runs/s (4 callers)  "
        f"{r['work_runs_per_s_12_callers']:.1f} CPU-bound runs/s (12 callers)"
    )


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


if __name__ == "__main__":
    main()
