"""Counts per `print(1)` run that the machine's load does not move, for two trees: system calls
by process (the caller, the light zygote, supervisors, init, programs) and by call, and the
tree's page faults and context switches. On a machine shared with other work, rates and CPU
times swing by a third between rounds; these counts do not, so a difference of one call a run
is a finding. Each tree runs in a fresh interpreter of its own (its `.venv`), under
`perf record`, enabled only around the measured runs (after a warm-up, with the pool settled).
Prints each process's calls a run on both sides and the calls that differ by more than
`--min-diff`; writes bench/results/counts.json.

    .venv/bin/python bench/counts.py --a TREE_A --b TREE_B [--a-home H] [--b-home H] [--runs 300]

Needs root, perf, and libseccomp (call names). Which calls a program makes (its madvise of
the warm pages, one per range) varies by a few from one zygote start to the next.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WARMUP = 60
SETTLE_S = 0.3  # the last run's teardown and restaging are counted
EVENTS = ("raw_syscalls:sys_enter", "page-faults", "context-switches")


def _child(runs: int, ctl_path: str, ack_path: str) -> None:
    """The measured runs in this interpreter (the tree's own execbox), perf enabled around
    them through its control fifo."""
    import execbox

    with open(ctl_path, "w") as ctl, open(ack_path) as ack:

        def perf(command: str) -> None:
            ctl.write(command + "\n")
            ctl.flush()
            ack.readline()

        with (
            tempfile.TemporaryDirectory() as tmp,
            execbox.Executor(cache=False, records=f"sqlite:///{tmp}/runs.db") as ex,
        ):
            ex._host.wait_heavy()
            for _ in range(WARMUP):
                assert ex.run("print(1)").ok
            time.sleep(SETTLE_S)
            perf("enable")
            for _ in range(runs):
                r = ex.run("print(1)")
                assert r.ok and r.stdout == "1\n", r
            time.sleep(SETTLE_S)
            perf("disable")


def _measure(tree: Path, home: str | None, runs: int) -> dict[str, float]:
    """{"<process> <call>": calls a run, "<event>": events a run} for `runs` runs in `tree`."""
    env = dict(os.environ)
    if home:
        env["EXECBOX_HOME"] = home
    with tempfile.TemporaryDirectory() as tmp:
        ctl, ack, data = f"{tmp}/ctl", f"{tmp}/ack", f"{tmp}/perf.data"
        os.mkfifo(ctl)
        os.mkfifo(ack)
        script_path = str(Path(__file__).resolve())
        child = [str(tree / ".venv" / "bin" / "python"), script_path, "--child", str(runs)]
        record = ["perf", "record", "-q", "-c", "1", "-e", ",".join(EVENTS), "-D", "-1"]
        record += ["--control", f"fifo:{ctl},{ack}", "-o", data, "--", *child, ctl, ack]
        done = subprocess.run(record, cwd=tree, env=env, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"the runs in {tree} failed:\n{done.stderr[-3000:]}")
        script = subprocess.run(
            ["perf", "script", "-i", data, "-F", "comm,event,trace"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    counts: collections.Counter[str] = collections.Counter()
    for line in script.splitlines():
        comm, _, rest = line.strip().partition(" ")
        event, _, trace = rest.strip().partition(":")
        if event == "raw_syscalls":
            words = trace.split()
            counts[f"{comm} {_call_name(int(words[words.index('NR') + 1]))}"] += 1
        else:
            counts[event.strip()] += 1
    return {key: n / runs for key, n in counts.items()}


_names: dict[int, str] = {}


def _call_name(number: int) -> str:
    if number not in _names:
        lib = ctypes.CDLL("libseccomp.so.2")
        lib.seccomp_syscall_resolve_num_arch.restype = ctypes.c_char_p
        name = lib.seccomp_syscall_resolve_num_arch(0, number)  # 0: the native architecture
        _names[number] = name.decode() if name else str(number)
    return _names[number]


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        _child(int(sys.argv[2]), sys.argv[3], sys.argv[4])
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--a", type=Path, required=True)
    parser.add_argument("--b", type=Path, required=True)
    parser.add_argument("--a-home")
    parser.add_argument("--b-home")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--min-diff", type=float, default=0.5, help="calls a run")
    args = parser.parse_args()
    a = _measure(args.a.resolve(), args.a_home, args.runs)
    b = _measure(args.b.resolve(), args.b_home, args.runs)
    by_process: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for side, counts in enumerate((a, b)):
        for key, n in counts.items():
            if " " in key:
                by_process[key.split(" ")[0]][side] += n
    print(f"{'a run':<34}{'A':>9}{'B':>9}{'B-A':>9}")
    for event in EVENTS[1:]:
        print(f"{event:<34}{a.get(event, 0):>9.1f}{b.get(event, 0):>9.1f}", end="")
        print(f"{b.get(event, 0) - a.get(event, 0):>+9.1f}")
    for process, (x, y) in sorted(by_process.items()):
        print(f"{process + ' calls':<34}{x:>9.1f}{y:>9.1f}{y - x:>+9.1f}")
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key, 0.0), b.get(key, 0.0)
        if " " in key and abs(y - x) >= args.min_diff:
            print(f"  {key:<32}{x:>9.1f}{y:>9.1f}{y - x:>+9.1f}")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "counts.json").write_text(
        json.dumps({"a": str(args.a), "b": str(args.b), "runs": args.runs, "A": a, "B": b}) + "\n"
    )


if __name__ == "__main__":
    main()
