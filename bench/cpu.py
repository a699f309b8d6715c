"""CPU time per isolated run, for the whole process tree: the caller, the three zygotes,
supervisors, init and the programs, set-up and teardown included. On a shared machine runs/s swing with
other load; CPU per run hardly does, and it is what bounds throughput (2 cores / CPU per run).

The baseline, measured in the same run before and after: the CPU of a bare
`python3 -I -S -c pass`; the ratio to it holds when the machine's speed drifts.

It moves itself into a cpuacct cgroup of its own (cgroup v1; execbox nests the run cgroups
under the caller's, so they are counted too) and reads it before and after each batch, with
the pool settled on both sides. Prints ms per run and a breakdown; writes bench/results/cpu.json.

    .venv/bin/python bench/cpu.py [--runs 200]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # noqa: E402

from latency import PANDAS, save_results  # noqa: E402

from execbox.executor import Executor  # noqa: E402

CPUACCT = "/sys/fs/cgroup/cpuacct"
TICKS = os.sysconf("SC_CLK_TCK")


def enter_cpuacct_group(script: str) -> str:
    """Move this process (and what it starts from now on) into a cpuacct cgroup of its own;
    returns its path. Exits when the host has no cgroup v1 cpuacct controller."""
    if not os.path.exists(f"{CPUACCT}/cpuacct.usage"):
        sys.exit(f"{script} needs cgroup v1 with the cpuacct controller")
    cgroup = f"{CPUACCT}/execbox-bench-{os.getpid()}"
    os.makedirs(cgroup)
    with open(f"{cgroup}/cgroup.procs", "w") as fh:
        fh.write(str(os.getpid()))
    return cgroup


def leave_cpuacct_group(cgroup: str) -> None:
    """Back to the parent group, and `cgroup` (with any child groups) removed once empty."""
    with open(f"{CPUACCT}/cgroup.procs", "w") as fh:
        fh.write(str(os.getpid()))
    for _ in range(50):
        try:
            for sub in Path(cgroup).iterdir():
                if sub.is_dir():
                    sub.rmdir()
            os.rmdir(cgroup)
            break
        except OSError:
            time.sleep(0.1)


def proc_cpu_ms(pid: int, children: bool = False) -> float:
    """CPU of the process itself, or of its reaped children (cutime + cstime)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    first = 13 if children else 11
    return (int(fields[first]) + int(fields[first + 1])) * 1000 / TICKS


def self_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime) * 1000


def bare_cpu_ms(n: int = 60) -> float:
    """Median CPU of a bare `python3 -I -S -c pass` (started and waited for here): the
    baseline, measured in the same run, that absolute numbers drift with."""
    samples = []
    for _ in range(n):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        samples.append((after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    cgroup = enter_cpuacct_group("bench/cpu.py")

    def usage_ms() -> float:
        with open(f"{cgroup}/cpuacct.usage") as fh:
            return int(fh.read()) / 1e6

    result: dict[str, object] = {}
    bare = [bare_cpu_ms()]
    try:
        with Executor(cache=False) as ex:
            ex._host.wait_heavy()  # it starts in the background: not in what is measured
            host = ex.stats().host
            assert host is not None
            zygotes = {
                "sup_zygote": host.zygote_pid,
                "light_zygote": host.light_zygote_pid,
                "heavy_zygote": host.heavy_zygote_pid,
            }
            program_zygotes = (host.light_zygote_pid, host.heavy_zygote_pid)
            for _ in range(20):
                ex.run("print(1)")
            for name, code, clients in (
                ("print1_1_client", "print(1)", 1),
                ("print1_4_clients", "print(1)", 4),
                ("pandas_1_client", PANDAS, 1),
            ):
                per = max(1, args.runs // clients)
                time.sleep(1.0)  # the pool is settled: staging of earlier runs is not counted
                z0 = {k: proc_cpu_ms(p) for k, p in zygotes.items()}
                p0 = sum(proc_cpu_ms(p, children=True) for p in program_zygotes)
                s0, u0, t0 = self_cpu_ms(), usage_ms(), time.monotonic()

                def work(code: str = code, per: int = per) -> None:
                    for _ in range(per):
                        r = ex.run(code)
                        assert r.ok, r

                threads = [threading.Thread(target=work) for _ in range(clients)]
                for th in threads:
                    th.start()
                for th in threads:
                    th.join()
                wall = time.monotonic() - t0
                time.sleep(1.0)  # teardown and restaging of the last slots are counted too
                n = per * clients
                total = (usage_ms() - u0) / n
                caller = (self_cpu_ms() - s0) / n
                zyg = {k: round((proc_cpu_ms(p) - z0[k]) / n, 2) for k, p in zygotes.items()}
                programs = (sum(proc_cpu_ms(p, children=True) for p in program_zygotes) - p0) / n
                result[name] = {
                    "cpu_ms_per_run": round(total, 2),
                    "runs_per_s": round(n / wall, 1),
                    "caller_ms": round(caller, 2),
                    **zyg,
                    "programs_ms": round(programs, 2),
                    "supervisor_init_ms": round(total - caller - sum(zyg.values()) - programs, 2),
                    "n": n,
                }
        bare.append(bare_cpu_ms())
    finally:
        leave_cpuacct_group(cgroup)
    base = statistics.mean(bare)
    result["bare_python_I_S_cpu_ms"] = round(base, 3)
    print(f"bare `python3 -I -S -c pass`: {bare[0]:.2f} ms CPU before, {bare[1]:.2f} after")
    print(
        f"{'workload':22} {'CPU ms/run':>10} {'ratio':>6} {'caller':>7} {'zygotes':>8} "
        f"{'programs':>9} {'sup+init':>9} {'runs/s':>7}"
    )
    for name, row in result.items():
        if not isinstance(row, dict):
            continue
        row["ratio_to_bare"] = round(row["cpu_ms_per_run"] / base, 3)
        zyg_ms = row["sup_zygote"] + row["light_zygote"] + row["heavy_zygote"]
        print(
            f"{name:22} {row['cpu_ms_per_run']:>10.2f} {row['ratio_to_bare']:>6.2f} "
            f"{row['caller_ms']:>7.2f} "
            f"{zyg_ms:>8.2f} {row['programs_ms']:>9.2f} "
            f"{row['supervisor_init_ms']:>9.2f} {row['runs_per_s']:>7.1f}"
        )
    save_results("cpu", result)


if __name__ == "__main__":
    main()
