"""Attack tests for the resource limits: wall time, CPU, memory, pids, disk, output, stdin.

Every hostile program runs through `jailed`. Limits are kept small so the file runs fast; timing
assertions allow one second of slack over the limit (the whole run, fork to result, included).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import threading
import time

import pytest

from execbox import Executor, RunResult, Status
from execbox.sandbox.inside.cgroup import Hierarchy
from tests.probes import host_stats, peak_of, wait_until

pytestmark = [pytest.mark.hostile, pytest.mark.serial]

MIB = 1024 * 1024
SLACK_S = 1.0  # how far past the limit a run may end, set-up and teardown included
CPU_RUN_WALL_S = 5.0  # a 1 s CPU limit ends a run long before its 10 s wall limit


def timed(ex: Executor, code: str, **kw: object) -> tuple[RunResult, float]:
    start = time.monotonic()
    result = ex.run(code, **kw)  # type: ignore[arg-type]
    return result, time.monotonic() - start


def vm_rss() -> int:
    """Current resident set of this (test) process, in bytes."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def host_comms() -> set[str]:
    names = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as fh:
                    names.add(fh.read().strip())
            except OSError:
                pass
    return names


def comm_gone(token: str, timeout_s: float = 3.0) -> bool:
    """Poll: whether no host process is named `token` (a result comes before its run's
    teardown ends: a killed process can still show for a moment)."""
    return wait_until(lambda: token not in host_comms(), timeout_s, every_s=0.02)


def leftover_cgroups(ex: Executor, grace_s: float = 3.0) -> list[str]:
    """Run cgroups of this executor that are neither staged for a future run nor gone within
    `grace_s` (a supervisor removes its cgroup just after sending the result)."""
    prefix = host_stats(ex).slot_prefix  # the run cgroups of this executor are named with it
    deadline = time.monotonic() + grace_s
    while True:
        staged = host_stats(ex).idle_slots
        left = []
        for parent in Hierarchy.discover().parent_paths.values():
            left += [
                os.path.join(parent, n)
                for n in os.listdir(parent)
                if n.startswith(prefix) and n not in staged
            ]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def assert_limit(r: RunResult, status: Status, setting: str) -> None:
    assert r.status is status, r
    assert r.error is not None, r
    assert setting in r.error.message, r.error


# ---- wall time -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        pytest.param("while True:\n    pass\n", id="busy-loop"),
        pytest.param("import time\ntime.sleep(100)\n", id="sleep"),
        pytest.param(
            "import signal\n"
            "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
            "    signal.signal(s, signal.SIG_IGN)\n"
            "while True:\n"
            "    pass\n",
            id="ignores-term-int-hup",
        ),
        pytest.param(
            "import signal, time\n"
            "signal.pthread_sigmask(signal.SIG_BLOCK, set(signal.Signals) - {signal.SIGKILL,"
            " signal.SIGSTOP})\n"
            "while True:\n"
            "    time.sleep(0.01)\n",
            id="blocks-every-signal",
        ),
        pytest.param(
            "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\n", id="stops-itself"
        ),
    ],
)
def test_program_exceeding_wall_time_is_stopped_within_a_second_with_status_timeout(
    jailed: Executor, code: str
) -> None:
    r, wall = timed(jailed, code, limits={"timeout_s": 1, "cpu_s": 30})
    assert_limit(r, Status.timeout, "timeout_s")
    assert r.error is not None and "1 s" in r.error.message
    assert r.signal == "SIGKILL" and r.exit_code is None
    assert wall < 1.0 + SLACK_S, wall
    assert 950 <= r.metrics.wall_ms < 1000 + SLACK_S * 1000, r.metrics


def test_forked_grandchild_busy_loop_is_killed_when_the_run_times_out(jailed: Executor) -> None:
    token = "ebgc" + secrets.token_hex(5)
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        open('/proc/self/comm', 'w').write({token!r})\n"
        "        while True:\n"
        "            pass\n"
        "    os._exit(0)\n"
        "time.sleep(100)\n"
    )
    r, wall = timed(jailed, code, limits={"timeout_s": 1, "cpu_s": 30})
    assert_limit(r, Status.timeout, "timeout_s")
    assert wall < 1.0 + SLACK_S, wall
    assert comm_gone(token)
    assert leftover_cgroups(jailed) == []


def test_daemonized_grandchild_dies_when_the_program_exits(jailed: Executor) -> None:
    token = "ebdm" + secrets.token_hex(5)
    code = (
        "import os, sys\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        open('/proc/self/comm', 'w').write({token!r})\n"
        "        os.close(1); os.close(2)\n"
        "        while True:\n"
        "            pass\n"
        "    os._exit(0)\n"
        "os.wait()\n"
        "print('parent done')\n"
    )
    r, wall = timed(jailed, code, limits={"timeout_s": 5})
    assert r.status is Status.ok, r
    assert r.stdout == "parent done\n"
    assert wall < 2.0, wall
    assert comm_gone(token)
    assert leftover_cgroups(jailed) == []


# ---- CPU time --------------------------------------------------------------------------------

BUSY_THREADS = (
    "import threading\n"
    "def spin():\n"
    "    while True:\n"
    "        pass\n"
    "for _ in range(2):\n"
    "    threading.Thread(target=spin).start()\n"
    "spin()\n"
)
BUSY_PROCESSES = "import os\nos.fork()\nwhile True:\n    pass\n"
BUSY_CHILD_ONLY = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    while True:\n"
    "        pass\n"
    "_, status = os.waitpid(pid, 0)\n"
    "sys.exit(f'child ended with {status}')\n"
)


@pytest.mark.parametrize(
    "code",
    [
        pytest.param("while True:\n    pass\n", id="busy-loop"),
        pytest.param(BUSY_THREADS, id="three-threads"),
        pytest.param(BUSY_PROCESSES, id="two-processes"),
    ],
)
def test_cpu_limit_ends_the_run_with_status_cpu_limit_long_before_the_wall_limit(
    jailed: Executor, code: str
) -> None:
    r, wall = timed(jailed, code, limits={"cpu_s": 1, "timeout_s": 10})
    assert_limit(r, Status.cpu_limit, "cpu_s")
    assert r.error is not None and "1 s" in r.error.message
    # Promptness is the CPU overshoot; wall time only has to be well short of the wall limit,
    # since on a loaded machine 1 s of CPU takes longer than 1 s of wall time.
    assert wall < CPU_RUN_WALL_S, wall
    assert 950 <= r.metrics.cpu_ms < 2500, r.metrics


def test_cpu_limit_hit_by_a_child_is_reported_as_cpu_limit_every_time(jailed: Executor) -> None:
    # The child meets two enforcers at about the same moment: the supervisor's cgroup check
    # (SIGKILL of the whole run) and the child's own RLIMIT_CPU (SIGXCPU of the child alone).
    # Whichever wins, the run used its whole CPU allowance and must say cpu_limit.
    outcomes = []
    for _ in range(4):
        r, wall = timed(jailed, BUSY_CHILD_ONLY, limits={"cpu_s": 1, "timeout_s": 10})
        outcomes.append((r.status.value, r.exit_code, r.signal, r.stderr.strip(), r.metrics.cpu_ms))
        assert wall < CPU_RUN_WALL_S, wall
    assert all(o[0] == "cpu_limit" for o in outcomes), outcomes
    assert all(o[4] < 2500 for o in outcomes), outcomes


def test_cpu_limit_counts_cpu_time_of_children_that_already_exited(jailed: Executor) -> None:
    # Each child burns 0.3 s of CPU and exits; the parent only waits. Ten children = 3 s of CPU.
    code = (
        "import os, time\n"
        "for _ in range(10):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        end = time.process_time() + 0.3\n"
        "        while time.process_time() < end:\n"
        "            pass\n"
        "        os._exit(0)\n"
        "    os.waitpid(pid, 0)\n"
        "print('all children ran')\n"
    )
    r, wall = timed(jailed, code, limits={"cpu_s": 1, "timeout_s": 10})
    assert_limit(r, Status.cpu_limit, "cpu_s")
    assert "all children ran" not in r.stdout
    assert wall < CPU_RUN_WALL_S, wall
    assert r.metrics.cpu_ms < 2500, r.metrics


# ---- memory ----------------------------------------------------------------------------------

MEMORY_LIMIT = 64


def _user_mode_linux() -> bool:
    """Under user-mode Linux (tests/uml) page faults cost ~50x more: wall bounds need slack."""
    with open("/proc/cpuinfo") as fh:
        return "User Mode Linux" in fh.read()


@pytest.mark.parametrize(
    "code",
    [
        pytest.param(
            "chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 20))\n",
            id="bytearray-chunks",
        ),
        pytest.param(
            "b = bytearray()\nwhile True:\n    b += b'x' * (1 << 20)\n",
            id="bytearray-growth",
        ),
        pytest.param(
            "import numpy as np\na = np.ones(100_000_000)\nprint(a.sum())\n",
            id="numpy",
        ),
        pytest.param(
            "import mmap\n"
            "m = mmap.mmap(-1, 512 << 20)\n"
            "for i in range(0, len(m), 4096):\n"
            "    m[i] = 1\n",
            id="anonymous-mmap",
        ),
    ],
)
def test_allocating_past_memory_mib_gives_memory_limit_and_peak_near_the_limit(
    jailed: Executor, code: str
) -> None:
    r, wall = timed(jailed, code, limits={"memory_mib": MEMORY_LIMIT, "timeout_s": 10})
    assert_limit(r, Status.memory_limit, "memory_mib")
    assert r.error is not None and f"{MEMORY_LIMIT} MiB" in r.error.message
    limit = MEMORY_LIMIT * MIB
    assert 0.85 * limit <= peak_of(r) <= limit, r.metrics
    assert wall < (20.0 if _user_mode_linux() else 5.0), wall


def test_child_process_eating_memory_gives_memory_limit(jailed: Executor) -> None:
    code = (
        "import os, sys\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    hog = []\n"
        "    while True:\n"
        "        hog.append(bytearray(1 << 20))\n"
        "_, status = os.waitpid(pid, 0)\n"
        "sys.exit(f'child ended with {status}')\n"
    )
    r = jailed.run(code, limits={"memory_mib": MEMORY_LIMIT, "timeout_s": 10})
    assert_limit(r, Status.memory_limit, "memory_mib")
    assert peak_of(r) >= 0.85 * MEMORY_LIMIT * MIB, r.metrics
    assert "child ended with 9" in r.stderr  # SIGKILL from the OOM killer, as the parent saw it


def test_files_in_tmpfs_count_against_the_memory_limit(jailed: Executor) -> None:
    # /dev/shm, /tmp and /workspace each hold disk_mib; together 3 x 56 MiB > memory_mib=64.
    code = (
        "for d in ('/dev/shm', '/tmp', '/workspace'):\n"
        "    for i in range(7):\n"
        "        with open(f'{d}/f{i}', 'wb') as fh:\n"
        "            fh.write(b'x' * (8 << 20))\n"
        "print('wrote 168 MiB', flush=True)\n"
    )
    r = jailed.run(
        code,
        limits={"memory_mib": MEMORY_LIMIT, "disk_mib": 64, "timeout_s": 10, "artifact_bytes": 0},
    )
    assert_limit(r, Status.memory_limit, "memory_mib")
    assert r.stdout == ""
    assert peak_of(r) <= MEMORY_LIMIT * MIB, r.metrics


# ---- pids ------------------------------------------------------------------------------------

FORK_BOMB = (
    "import os, time\n"
    "me = os.getpid()\n"
    "failure = None\n"
    "made = 0\n"
    "while True:\n"
    "    try:\n"
    "        pid = os.fork()\n"
    "    except OSError as exc:\n"
    "        failure = exc\n"
    "        break\n"
    "    if pid == 0:\n"
    "        continue  # every child keeps forking too\n"
    "    made += 1\n"
    "if os.getpid() != me:\n"
    "    time.sleep(60)\n"
    "    os._exit(0)\n"
    "print(type(failure).__name__, failure.errno, made, flush=True)\n"
)


def test_fork_bomb_is_contained_by_pids_and_the_program_sees_eagain(jailed: Executor) -> None:
    r, wall = timed(jailed, FORK_BOMB, limits={"pids": 16, "timeout_s": 10})
    assert r.status is Status.ok, r
    name, errno_, made = r.stdout.split()
    assert (name, errno_) == ("BlockingIOError", "11"), r.stdout
    assert 0 <= int(made) < 16
    assert wall < 5.0, wall
    assert leftover_cgroups(jailed) == []
    # The machine is fine afterwards: a new run starts, in a fresh namespace with its own pids.
    after = jailed.run(
        "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))",
        limits={"pids": 16},
    )
    assert after.status is Status.ok, after
    assert json.loads(after.stdout) == [1, 2]


def test_fork_bomb_that_never_ends_is_stopped_by_the_timeout(jailed: Executor) -> None:
    code = (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    r, wall = timed(jailed, code, limits={"pids": 16, "timeout_s": 1, "cpu_s": 60})
    assert_limit(r, Status.timeout, "timeout_s")
    assert wall < 1.0 + SLACK_S, wall
    assert leftover_cgroups(jailed) == []


def test_thread_bomb_is_contained_and_the_program_sees_cant_start_new_thread(
    jailed: Executor,
) -> None:
    code = (
        "import threading, time\n"
        "made = 0\n"
        "try:\n"
        "    while True:\n"
        "        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "        made += 1\n"
        "except RuntimeError as exc:\n"
        "    print(exc, made, sep='|', flush=True)\n"
    )
    r, wall = timed(jailed, code, limits={"pids": 16, "timeout_s": 10})
    assert r.status is Status.ok, r
    message, made = r.stdout.strip().split("|")
    assert message == "can't start new thread"
    assert 0 < int(made) < 16
    assert wall < 5.0, wall


# ---- disk ------------------------------------------------------------------------------------


@pytest.mark.parametrize("directory", ["/workspace", "/tmp", "/dev/shm"])
def test_one_file_past_disk_mib_gives_disk_limit(jailed: Executor, directory: str) -> None:
    code = (
        f"with open('{directory}/big', 'wb') as fh:\n"
        "    while True:\n"
        "        fh.write(b'x' * (1 << 20))\n"
    )
    r = jailed.run(code, limits={"disk_mib": 8, "artifact_bytes": 0})
    assert_limit(r, Status.disk_limit, "disk_mib")
    assert r.error is not None and "8 MiB" in r.error.message
    assert r.exit_code == 1


@pytest.mark.parametrize("directory", ["/workspace", "/tmp", "/dev/shm"])
def test_many_files_past_disk_mib_give_disk_limit(jailed: Executor, directory: str) -> None:
    code = (
        "i = 0\n"
        "while True:\n"
        f"    with open(f'{directory}/part{{i}}', 'wb') as fh:\n"
        "        fh.write(b'x' * (1 << 20))\n"
        "    i += 1\n"
    )
    r = jailed.run(code, limits={"disk_mib": 8, "artifact_bytes": 0})
    assert_limit(r, Status.disk_limit, "disk_mib")
    assert r.error is not None and directory in r.error.message
    assert "No space left on device" in r.stderr


@pytest.mark.parametrize("directory", ["/workspace", "/tmp"])
def test_program_that_handles_a_full_disk_sees_enospc(jailed: Executor, directory: str) -> None:
    code = (
        "import errno\n"
        "written = 0\n"
        "try:\n"
        "    for i in range(100):\n"
        f"        with open(f'{directory}/part{{i}}', 'wb') as fh:\n"
        "            fh.write(b'x' * (1 << 20))\n"
        "        written += 1\n"
        "except OSError as exc:\n"
        "    print(errno.errorcode[exc.errno], written)\n"
    )
    r = jailed.run(code, limits={"disk_mib": 8, "artifact_bytes": 0})
    assert r.status is Status.ok, r
    code_name, written = r.stdout.split()
    assert code_name == "ENOSPC"
    assert 6 <= int(written) <= 8


def test_huge_sparse_file_is_neither_created_big_nor_copied(jailed: Executor) -> None:
    code = (
        "import errno, os\n"
        "fd = os.open('sparse', os.O_WRONLY | os.O_CREAT)\n"
        "for name, call in (('pwrite', lambda: os.pwrite(fd, b'x', 20 << 30)),\n"
        "                   ('ftruncate', lambda: os.ftruncate(fd, 20 << 30)),\n"
        "                   ('fallocate', lambda: os.posix_fallocate(fd, 0, 20 << 30))):\n"
        "    try:\n"
        "        call()\n"
        "        print(name, 'ok')\n"
        "    except OSError as exc:\n"
        "        print(name, errno.errorcode[exc.errno])\n"
        "print('size', os.fstat(fd).st_size)\n"
    )
    rss_before = vm_rss()
    r, wall = timed(jailed, code, limits={"disk_mib": 8})
    assert r.status is Status.ok, r
    # RLIMIT_FSIZE = disk_mib: no file can get an apparent size past the disk limit.
    assert r.stdout.splitlines() == [
        "pwrite EFBIG",
        "ftruncate EFBIG",
        "fallocate EFBIG",
        "size 0",
    ], r.stdout
    assert all(a.size <= 8 * MIB for a in r.artifacts)
    assert wall < 3.0, wall
    assert vm_rss() - rss_before < 50 * MIB


def test_sparse_file_bigger_than_the_artifact_budget_is_skipped_not_read(jailed: Executor) -> None:
    code = (
        "with open('sparse', 'wb') as fh:\n"
        "    fh.seek((7 << 20) - 1)\n"
        "    fh.write(b'x')\n"
        "with open('small.txt', 'w') as fh:\n"
        "    fh.write('kept')\n"
    )
    r, wall = timed(jailed, code, limits={"disk_mib": 8, "artifact_bytes": 1 * MIB})
    assert r.status is Status.ok, r
    assert [a.path for a in r.artifacts] == ["small.txt"]
    assert r.artifacts_truncated is True
    assert wall < 3.0, wall


# ---- output ----------------------------------------------------------------------------------

CAP = 64 * 1024


@pytest.mark.parametrize(
    "code",
    [
        pytest.param("print('x' * 10**8)\n", id="one-huge-print"),
        pytest.param(
            "import sys\nchunk = b'x' * 65536\nwhile True:\n    sys.stdout.buffer.write(chunk)\n",
            id="endless-loop",
        ),
        pytest.param(
            "import os\nchunk = b'x' * 65536\nwhile True:\n    os.write(1, chunk)\n",
            id="raw-fd-writes",
        ),
    ],
)
def test_stdout_flood_gives_output_limit_and_the_host_keeps_only_the_cap(
    jailed: Executor, code: str
) -> None:
    rss_before = vm_rss()
    r, wall = timed(jailed, code, limits={"output_bytes": CAP, "timeout_s": 20})
    rss_growth = vm_rss() - rss_before
    assert_limit(r, Status.output_limit, "output_bytes")
    assert str(CAP) in r.error.message  # type: ignore[union-attr]
    assert r.stdout_truncated is True and r.stderr_truncated is False
    assert len(r.stdout) == CAP and set(r.stdout) == {"x"}
    assert rss_growth < 50 * MIB, rss_growth
    assert wall < 5.0, wall


def test_stderr_flood_gives_output_limit_and_only_stderr_is_truncated(jailed: Executor) -> None:
    code = (
        "import sys\nprint('before', flush=True)\nwhile True:\n    sys.stderr.write('e' * 4096)\n"
    )
    rss_before = vm_rss()
    r, wall = timed(jailed, code, limits={"output_bytes": CAP, "timeout_s": 20})
    assert_limit(r, Status.output_limit, "output_bytes")
    assert r.stderr_truncated is True and r.stdout_truncated is False
    assert r.stdout == "before\n"
    assert len(r.stderr) == CAP and set(r.stderr) == {"e"}
    assert vm_rss() - rss_before < 50 * MIB
    assert wall < 5.0, wall


def test_flood_from_a_grandchild_that_keeps_stdout_open_still_ends(jailed: Executor) -> None:
    code = (
        "import os, sys\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    while True:\n"
        "        os.write(1, b'y' * 65536)\n"
        "os.wait()\n"
    )
    r, wall = timed(jailed, code, limits={"output_bytes": CAP, "timeout_s": 20})
    assert_limit(r, Status.output_limit, "output_bytes")
    assert len(r.stdout) == CAP
    assert wall < 5.0, wall


def test_output_of_exactly_output_bytes_is_not_truncated(executor: Executor) -> None:
    r = executor.run(f"import sys\nsys.stdout.write('z' * {CAP})\n", limits={"output_bytes": CAP})
    assert r.status is Status.ok, r
    assert r.stdout_truncated is False and len(r.stdout) == CAP


def test_output_one_byte_past_output_bytes_is_truncated(executor: Executor) -> None:
    r = executor.run(
        f"import sys\nsys.stdout.write('z' * {CAP + 1})\n", limits={"output_bytes": CAP}
    )
    assert_limit(r, Status.output_limit, "output_bytes")
    assert r.stdout_truncated is True and len(r.stdout) == CAP


def test_stdout_callback_sees_at_most_the_cap(jailed: Executor) -> None:
    seen: list[bytes] = []
    r = jailed.run(
        "while True:\n    print('x' * 1000)\n", limits={"output_bytes": CAP}, on_stdout=seen.append
    )
    assert r.status is Status.output_limit, r
    assert sum(map(len, seen)) == CAP
    assert b"".join(seen).decode() == r.stdout


# ---- stdin -----------------------------------------------------------------------------------


def test_twenty_mib_of_stdin_arrives_whole(executor: Executor) -> None:
    data = os.urandom(20 * MIB)
    code = (
        "import hashlib, sys\n"
        "data = sys.stdin.buffer.read()\n"
        "print(len(data), hashlib.sha256(data).hexdigest())\n"
    )
    r = executor.run(code, stdin=data, limits={"timeout_s": 20})
    assert r.status is Status.ok, r
    assert r.stdout.split() == [str(len(data)), hashlib.sha256(data).hexdigest()]


def test_stdin_the_program_never_reads_does_not_hang_the_run(jailed: Executor) -> None:
    r, wall = timed(
        jailed, "print('ignored stdin')\n", stdin=b"s" * (20 * MIB), limits={"timeout_s": 10}
    )
    assert r.status is Status.ok, r
    assert r.stdout == "ignored stdin\n"
    assert wall < 3.0, wall


def test_program_closing_stdin_early_does_not_hang_the_run(jailed: Executor) -> None:
    code = "import os, sys\nprint(len(os.read(0, 10)))\nos.close(0)\nprint('closed')\n"
    r, wall = timed(jailed, code, stdin=b"s" * (20 * MIB), limits={"timeout_s": 10})
    assert r.status is Status.ok, r
    assert r.stdout == "10\nclosed\n"
    assert wall < 3.0, wall


# ---- encoding --------------------------------------------------------------------------------


def test_invalid_utf8_on_stdout_and_stderr_gives_valid_json_with_replacement_chars(
    jailed: Executor,
) -> None:
    code = (
        "import sys\n"
        "sys.stdout.buffer.write(b'a\\xff\\xfeb\\xc3')\n"
        "sys.stderr.buffer.write(b'\\xed\\xa0\\x80err')\n"
    )
    r = jailed.run(code)
    assert r.status is Status.ok, r
    assert r.stdout == "a\ufffd\ufffdb\ufffd"
    assert r.stderr.endswith("err") and "\ufffd" in r.stderr
    decoded = json.loads(r.model_dump_json())
    assert decoded["stdout"] == r.stdout
    assert decoded["stderr"] == r.stderr


def _rss_of_children(parent: int) -> int:
    worst = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
        except OSError:
            continue
        if fields.get("PPid", "").strip() == str(parent) and "VmRSS" in fields:
            worst = max(worst, int(fields["VmRSS"].split()[0]) * 1024)
    return worst


def test_flooding_the_report_pipes_costs_the_supervisor_bounded_memory(jailed: Executor) -> None:
    # The program holds the write ends of its report pipes; filling them as fast as it can must
    # not grow the supervisor (which lives outside the run's cgroup) without bound.
    code = (
        "import os, stat, time\n"
        "fds = [int(f) for f in os.listdir('/proc/self/fd') if int(f) > 2]\n"
        "def fifo(f):\n"
        "    try:\n"
        "        return stat.S_ISFIFO(os.fstat(f).st_mode)\n"
        "    except OSError:  # the descriptor listdir used, closed by now\n"
        "        return False\n"
        "fds = [f for f in fds if fifo(f)]\n"
        "for f in fds:\n"
        "    os.set_blocking(f, False)\n"
        "junk = b'A' * 65536\n"
        "end = time.time() + 2.5\n"
        "while time.time() < end:\n"
        "    for f in fds:\n"
        "        try:\n"
        "            os.write(f, junk)\n"
        "        except BlockingIOError:\n"
        "            pass\n"
        "print('flooded')\n"
    )
    zygote = host_stats(jailed).zygote_pid
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_of_children(zygote))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        r = jailed.run(code, limits={"memory_mib": 32, "timeout_s": 4})
    finally:
        done.set()
        sampler.join()
    assert r.status is Status.ok and r.stdout == "flooded\n", r
    assert peak[0] < 250 * MIB, f"a supervisor grew to {peak[0] / MIB:.0f} MiB"
