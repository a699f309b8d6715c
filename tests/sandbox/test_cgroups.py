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
from tests.probes import peak_of

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
            if not name.startswith(f"x{os.getpid()}-"):  # another test process's run
                continue
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


def test_a_run_in_a_reused_slot_does_not_see_an_earlier_runs_peak(
    jailed_one_slot: Executor,
) -> None:
    """On cgroup v2 before Linux 6.12 the peak cannot be reset: the slot's cgroup is made anew
    for each run (a print(1) read 83 MB there after a large run, before)."""
    ex = jailed_one_slot
    big = ex.run("x = bytearray(48 << 20)\nprint(len(x))", limits={"memory_mib": 128})
    assert big.status.value == "ok" and peak_of(big) > 48 * MIB, big
    # The same (one) light slot: its peak must be this run's own, far below the last one's.
    small = ex.run("print(1)", limits={"memory_mib": 128})
    assert small.status.value == "ok", small
    assert peak_of(small) < 24 * MIB, small.metrics


def _cgroup_of(pid: int) -> set[str]:
    with open(f"/proc/{pid}/cgroup") as fh:
        return {line.rstrip("\n").split(":", 2)[2] for line in fh}


def test_a_renewed_cgroup_is_new_at_the_old_descriptor_numbers_with_its_limits() -> None:
    """`RunCgroup.renew` (each run's cgroup where the peak cannot be reset): the C steps hold
    the kept descriptors by number, so each must lead into the new cgroup."""
    hier = Hierarchy.discover()
    cg = hier.create(f"x{os.getpid()}-renew")
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        cg.set_limits(96 * MIB, 17)
        counters = cg.counter_files()
        procs = cg.procs_files()
        dirs = dict(cg.dirs)
        inodes = {c: os.fstat(fd).st_ino for c, fd in dirs.items()}
        kept = dict(cg._kept)
        cg.renew()
        assert cg.dirs == dirs and cg._kept == kept, "a descriptor moved"
        assert cg.counter_files() == counters and cg.procs_files() == procs
        for controller, fd in dirs.items():
            assert os.fstat(fd).st_ino != inodes[controller], f"{controller}: the old directory"
            assert os.get_inheritable(fd) is False
        mem = cg._mem()
        limit = "memory.max" if cg.v2 else "memory.limit_in_bytes"
        pids_dir = cg.dirs["" if cg.v2 else "pids"]
        assert int(cg._read(mem, limit)) == 96 * MIB
        assert cg._read(pids_dir, "pids.max").strip() == "17"
        for fd in procs:  # joining through the kept cgroup.procs lands in the new cgroup
            os.pwrite(fd, str(sleeper.pid).encode(), 0)
        assert any(p.endswith(f"/{cg.name}") for p in _cgroup_of(sleeper.pid))
        assert int(cg._read(pids_dir, "pids.current")) == 1
    finally:
        sleeper.kill()
        sleeper.wait()
        cg.remove()
        for fd in hier.parents.values():
            os.close(fd)


def test_a_kernel_that_keeps_no_peak_reports_it_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """cgroup v2 before Linux 5.19 has no memory.peak: the run's peak is unknown (None, null
    in JSON, "unknown" in the CLI's summary), not 0, in Python and in the C steps."""
    from execbox.cli import _summary
    from execbox.contract import Metrics, RunResult, Status
    from execbox.image import Image
    from execbox.sandbox.inside import linux

    parent = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    cg = Hierarchy(2, {"": parent}, {"": str(tmp_path)}, False).create("x-nopeak")
    files = {
        "cpu.stat": "usage_usec 5\n",
        "memory.events": "oom_kill 0\n",
        "memory.stat": "active_file 4096\ninactive_file 0\n",
    }
    for name, text in files.items():
        (tmp_path / "x-nopeak" / name).write_text(text)
    pipes = [os.pipe2(os.O_NONBLOCK) for _ in range(2)]
    try:
        cg.reset_memory_peak()
        assert cg.memory_peak() is None and not cg.renews
        counters = cg.counter_files()
        assert counters[3] == -1
        steps = linux.SlotSteps(
            f"{Image.load().libexec}/libexecbox-contain.so",
            counters,
            list(cg.dirs.values()),
            RuntimeError,
        )
        steps.reset_peak()
        left = steps.collect(pipes[0][0], pipes[1][0])
        assert left.memory_peak is None and left.cpu_ns == 5000
    finally:
        for pipe in pipes:
            for fd in pipe:
                os.close(fd)
        for name in files:
            (tmp_path / "x-nopeak" / name).unlink()
        cg.remove()
        os.close(parent)
    metrics = Metrics(wall_ms=1, cpu_ms=1, memory_peak_bytes=left.memory_peak)
    result = RunResult(run_id="r", status=Status.ok, metrics=metrics)
    assert json.loads(result.model_dump_json())["metrics"]["memory_peak_bytes"] is None
    _summary(result, None)
    assert "mem=unknown" in capsys.readouterr().err


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
