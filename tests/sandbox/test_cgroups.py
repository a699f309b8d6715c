"""The run cgroups on the hierarchy this host mounts, cgroup v1 or v2 (`make test-cgroup2` runs
these inside a kernel with cgroup v2 alone): what doctor says, the files a run's limits are
written to, and `execbox run --memory` through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from execbox import Executor, RunResult
from execbox.sandbox.inside import cgroup
from execbox.sandbox.inside.cgroup import Hierarchy

MIB = 1 << 20

# `jailed_one_slot`: an executor with one slot of each kind (see tests/conftest.py).


def _mounted_hierarchy() -> int:
    """The cgroup version the host gives memory and pids on, read from mountinfo without
    execbox's code: v1 when both have a v1 hierarchy, else v2."""
    v1: set[str] = set()
    v2 = False
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fstype, _source, options = (line.split(" - ", 1)[1].split() + ["", ""])[:3]
            if fstype == "cgroup":
                v1 |= set(options.split(","))
            v2 |= fstype == "cgroup2"
    if {"memory", "pids"} <= v1:
        return 1
    assert v2, "no cgroup hierarchy with memory and pids is mounted"
    return 2


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read().strip()


def test_doctor_names_the_hierarchy_the_host_mounts(executor: Executor) -> None:
    version = _mounted_hierarchy()
    proc = subprocess.run(
        [sys.executable, "-m", "execbox.cli", "doctor"], capture_output=True, text=True, timeout=120
    )
    line = next(ln for ln in proc.stdout.splitlines() if ln.split()[1:2] == ["cgroups"])
    assert line.startswith("ok") and f"cgroup v{version} at " in line, line
    for parent in Hierarchy.discover().parent_paths.values():
        assert parent in line and os.path.isdir(parent), line


def test_a_runs_cgroup_holds_its_memory_pids_and_swap_limits(executor: Executor) -> None:
    """The run's own cgroup, found by a memory limit no other run has, while the run sleeps."""
    hier = Hierarchy.discover()
    memory_mib, pids = 97, 23
    done: list[RunResult] = []
    thread = threading.Thread(
        target=lambda: done.append(
            executor.run(
                "import time\ntime.sleep(2)\n", limits={"memory_mib": memory_mib, "pids": pids}
            )
        )
    )
    thread.start()
    files: dict[str, str] = {}
    memory_dir = hier.parent_paths["" if hier.version == 2 else "memory"]
    limit_file = "memory.max" if hier.version == 2 else "memory.limit_in_bytes"
    deadline = time.monotonic() + 20
    while not files and time.monotonic() < deadline and thread.is_alive():
        for name in os.listdir(memory_dir):
            path = os.path.join(memory_dir, name)
            try:
                if _read(os.path.join(path, limit_file)) != str(memory_mib * MIB):
                    continue
                if hier.version == 2:
                    files = {f: _read(os.path.join(path, f)) for f in ("pids.max", "cgroup.procs")}
                    if hier.has_swap:
                        files["memory.swap.max"] = _read(os.path.join(path, "memory.swap.max"))
                else:
                    pids_dir = os.path.join(hier.parent_paths["pids"], name)
                    files = {
                        "pids.max": _read(os.path.join(pids_dir, "pids.max")),
                        "cgroup.procs": _read(os.path.join(path, "cgroup.procs")),
                    }
                    if hier.has_swap:
                        files["memory.swap.max"] = str(
                            int(_read(os.path.join(path, "memory.memsw.limit_in_bytes")))
                            - memory_mib * MIB
                        )
            except OSError:  # not a directory, or a run's cgroup that just went away
                continue
            if files:
                break
        time.sleep(0.05)
    thread.join()
    assert done and done[0].status.value == "ok", done
    assert files, "no cgroup with the run's memory limit was seen"
    assert files["pids.max"] == str(pids), files
    assert files["cgroup.procs"], "the run's processes are not in the cgroup with its limits"
    if hier.has_swap:  # no swap on top of the memory limit
        assert files["memory.swap.max"] == "0", files
    if hier.version == 2:  # the controllers are on where run cgroups are made
        enabled = _read(os.path.join(memory_dir, "cgroup.subtree_control")).split()
        assert {"memory", "pids"} <= set(enabled), enabled


def test_cli_run_with_memory_gives_memory_limit_and_a_peak_near_it(jailed: Executor) -> None:
    code = b"x = bytearray(300 << 20)\nfor i in range(0, len(x), 4096):\n    x[i] = 1\n"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "execbox.cli",
            "run",
            "-",
            "--memory",
            "64",
            "--timeout",
            "60",
            "--json",
        ],
        input=code,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "memory_limit", result
    assert 0.85 * 64 * MIB <= result["metrics"]["memory_peak_bytes"] <= 64 * MIB, result


def _peak_resets() -> bool:
    """Whether this kernel lets a cgroup's memory peak be reset (v1; v2 from Linux 6.12)."""
    hier = Hierarchy.discover()
    try:
        if hier.version == 1:
            return True
        probe = os.path.join(hier.parent_paths[""], f"peak-probe-{os.getpid()}")
        os.mkdir(probe)
        try:
            fd = os.open(os.path.join(probe, "memory.peak"), os.O_RDWR)
            try:
                os.pwrite(fd, b"0", 0)
            finally:
                os.close(fd)
            return True
        except OSError:
            return False
        finally:
            os.rmdir(probe)
    finally:
        for fd in hier.parents.values():
            os.close(fd)


@pytest.mark.xfail(
    "not _peak_resets()",  # evaluated at set-up: collection needs no cgroup (nor root)
    strict=True,
    reason="KNOWN BUG: cgroup v2 before Linux 6.12 cannot reset memory.peak, so a reused "
    "slot reports its lifetime peak: an earlier run's memory shows in later runs",
)
def test_a_run_in_a_reused_slot_does_not_see_an_earlier_runs_peak(
    jailed_one_slot: Executor,
) -> None:
    ex = jailed_one_slot
    big = ex.run("x = bytearray(48 << 20)\nprint(len(x))", limits={"memory_mib": 128})
    assert big.status.value == "ok" and big.metrics.memory_peak_bytes > 48 * MIB, big
    # The same (one) light slot: its peak must be this run's own, far below the last one's.
    small = ex.run("print(1)", limits={"memory_mib": 128})
    assert small.status.value == "ok", small
    assert small.metrics.memory_peak_bytes < 24 * MIB, small.metrics


def test_no_usable_cgroup_is_said_in_words_naming_what_v2_offers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A cgroup v2 mount whose controllers lack memory (as under `cgroup_disable=memory`)."""
    (tmp_path / "cgroup.controllers").write_text("cpu io pids\n")
    monkeypatch.setattr(cgroup, "_mounts", lambda: [(str(tmp_path), "cgroup2", {"rw"})])
    with pytest.raises(cgroup.CgroupUnavailable) as caught:
        Hierarchy.discover()
    assert str(caught.value) == (
        "no usable cgroup: need memory and pids controllers (cgroup v1 or v2); "
        f"cgroup v2 at {tmp_path} offers: cpu io pids"
    )
