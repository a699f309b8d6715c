"""Attack tests for JavaScript and bash runs: the jail and the limits are Python's.

Each hostile program runs through `jailed` (the jail proven first). Where an attack exists in
both languages it is parametrized over them.
"""

from __future__ import annotations

import time

import pytest

from execbox import Executor, Status

pytestmark = pytest.mark.hostile

SECRET = "EXECBOX_TEST_HOST_SECRET_" + "7f3a"


@pytest.fixture(autouse=True)
def _host_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXECBOX_LANG_TEST_SECRET", SECRET)


ENV_DUMP = {
    "javascript": "console.log(JSON.stringify(process.env))",
    "bash": "env",
}


@pytest.mark.parametrize("language", ["javascript", "bash"])
def test_host_environment_never_reaches_the_code(jailed: Executor, language: str) -> None:
    result = jailed.run(ENV_DUMP[language], language=language, env={"GIVEN": "yes"})
    assert result.status is Status.ok, result.stderr
    assert SECRET not in result.stdout
    assert "GIVEN" in result.stdout


HOST_FILES = {
    "javascript": (
        "const fs = require('fs');"
        "for (const p of ['/root', '/home', '/etc/shadow', process.argv0 + '/../../../etc/shadow'])"
        " { try { fs.readdirSync(p); console.log('LISTED ' + p) } catch (e) {"
        "   try { fs.readFileSync(p); console.log('READ ' + p) } catch (e2) { console.log(e2.code) } } }"
        "console.log(fs.readdirSync('/').sort().join(','))"
    ),
    "bash": "ls /root /home /etc/shadow 2>&1; ls / | tr '\\n' ','",
}


@pytest.mark.parametrize("language", ["javascript", "bash"])
def test_host_files_are_not_visible(jailed: Executor, language: str) -> None:
    result = jailed.run(HOST_FILES[language], language=language)
    assert result.status is Status.ok, result.stderr
    assert "LISTED" not in result.stdout and "READ" not in result.stdout
    assert "root:" not in result.stdout
    listing = result.stdout.strip().splitlines()[-1]
    assert "root" not in listing.split(",") and "home" not in listing.split(",")
    assert "work" not in listing.split(",")


PROC = {
    "javascript": (
        "const fs = require('fs');"
        "console.log(fs.readdirSync('/proc').filter((x) => /^\\d+$/.test(x)).join(','));"
        "console.log(fs.readFileSync('/proc/1/cmdline', 'latin1'))"
    ),
    "bash": "ls /proc | grep -E '^[0-9]+$' | tr '\\n' ','; echo; tr '\\0' ' ' < /proc/1/cmdline",
}


@pytest.mark.parametrize("language", ["javascript", "bash"])
def test_proc_shows_only_the_runs_own_processes(jailed: Executor, language: str) -> None:
    result = jailed.run(PROC[language], language=language)
    assert result.status is Status.ok, result.stderr
    pids = [p for p in result.stdout.splitlines()[0].split(",") if p]
    # A pid namespace of its own: init, the interpreter and the pipeline it ran to look.
    assert pids and all(int(p) <= 6 for p in pids), pids
    assert "execbox-init" in result.stdout


NETWORK = {
    "javascript": (
        "const s = require('net').connect(53, '1.1.1.1');"
        "s.on('error', (e) => console.log('ERR ' + e.code));"
        "s.on('connect', () => console.log('CONNECTED'))"
    ),
    "bash": "(exec 3<>/dev/tcp/1.1.1.1/53) 2>&1 && echo CONNECTED || echo REFUSED",
}


@pytest.mark.parametrize("language", ["javascript", "bash"])
def test_no_network(jailed: Executor, language: str) -> None:
    result = jailed.run(NETWORK[language], language=language)
    assert result.status is Status.ok, result.stderr
    assert "CONNECTED" not in result.stdout
    assert "ERR" in result.stdout or "REFUSED" in result.stdout


def test_v8_heap_bomb_is_memory_limit_not_error(jailed: Executor) -> None:
    code = "const a = []; for (;;) a.push(new Array(1e6).fill(1.5))"
    result = jailed.run(code, language="javascript", limits={"memory_mib": 128})
    assert result.status is Status.memory_limit, (result.error, result.stderr[-500:])


@pytest.mark.parametrize(
    "code",
    [
        "const b = []; for (;;) b.push(Buffer.alloc(64 << 20, 1))",
        "Buffer.alloc(3 * 1024 * 1024 * 1024, 1)",
    ],
)
def test_buffer_bomb_is_memory_limit(jailed: Executor, code: str) -> None:
    result = jailed.run(code, language="javascript", limits={"memory_mib": 128})
    assert result.status is Status.memory_limit, (result.error, result.stderr[-500:])


def test_child_process_bomb_is_held_by_pids(jailed: Executor) -> None:
    code = (
        "const cp = require('child_process'); let failed = null;"
        "for (let i = 0; i < 200 && !failed; i++) {"
        "  const r = cp.spawnSync('/usr/bin/sleep', ['0.5'], {timeout: 1});"
        "  const c = cp.spawn('/usr/bin/sleep', ['30']); c.on('error', (e) => { failed = e.code });"
        "}"
        "setTimeout(() => { console.log('FAILED ' + failed); process.exit(0) }, 500)"
    )
    result = jailed.run(code, language="javascript", limits={"pids": 32, "timeout_s": 10})
    assert result.status is Status.ok, (result.error, result.stderr[-500:])
    assert "FAILED EAGAIN" in result.stdout


def test_worker_threads_bomb_is_held_by_pids(jailed: Executor) -> None:
    code = (
        "const { Worker } = require('worker_threads'); let n = 0;"
        "try { for (;;) { new Worker('setInterval(() => {}, 1000)', { eval: true }); n++ } }"
        "catch (e) { console.log('STOPPED ' + e.code + ' ' + n); process.exit(0) }"
    )
    result = jailed.run(code, language="javascript", limits={"pids": 32, "timeout_s": 10})
    assert result.status is Status.ok, (result.error, result.stderr[-500:])
    assert "STOPPED ERR_WORKER_INIT_FAILED" in result.stdout
    assert int(result.stdout.split()[-1]) < 32


@pytest.mark.serial
def test_bash_fork_bomb_is_held_by_pids_and_leaves_nothing_behind(jailed: Executor) -> None:
    start = time.monotonic()
    result = jailed.run(
        ":(){ :|:& };:\nsleep 2", language="bash", limits={"pids": 32, "timeout_s": 3}
    )
    # The shell's own job may end at once (each copy backgrounds the next and returns), so the
    # shell sleeps while the copies grow into the pids limit: ok, or timeout on a slow machine.
    assert result.status in (Status.ok, Status.timeout), (result.error, result.stderr[-500:])
    assert time.monotonic() - start < 3 + 2
    assert "Resource temporarily unavailable" in result.stderr  # the pids limit held it
    after = jailed.run("echo ok", language="bash")  # and nothing of it outlived the run
    assert (after.status, after.stdout) == (Status.ok, "ok\n")


BUSY = {"javascript": "for (;;) {}", "bash": "while :; do :; done"}


@pytest.mark.serial
@pytest.mark.parametrize("language", ["javascript", "bash"])
def test_busy_loop_ends_in_cpu_limit(jailed: Executor, language: str) -> None:
    start = time.monotonic()
    result = jailed.run(BUSY[language], language=language, limits={"timeout_s": 5, "cpu_s": 1})
    assert result.status is Status.cpu_limit, result.error
    assert time.monotonic() - start < 4


IGNORING = {
    "javascript": "for (const s of ['SIGTERM', 'SIGINT', 'SIGHUP']) process.on(s, () => {});"
    "setInterval(() => {}, 1000)",
    "bash": "trap '' TERM INT HUP; while :; do sleep 0.1; done",
}


@pytest.mark.serial
@pytest.mark.parametrize("language", ["javascript", "bash"])
def test_ignored_signals_do_not_outlive_the_timeout(jailed: Executor, language: str) -> None:
    start = time.monotonic()
    result = jailed.run(IGNORING[language], language=language, limits={"timeout_s": 1})
    assert result.status is Status.timeout
    assert time.monotonic() - start < 3


DISK = {
    "javascript": "const fs = require('fs'); const b = Buffer.alloc(1 << 20, 1);"
    "for (;;) fs.appendFileSync('/workspace/fill', b)",
    "bash": "set -e; head -c 64M /dev/zero > /workspace/fill",
}


@pytest.mark.parametrize("language", ["javascript", "bash"])
def test_disk_fill_is_disk_limit(jailed: Executor, language: str) -> None:
    result = jailed.run(DISK[language], language=language, limits={"disk_mib": 16})
    assert result.status is Status.disk_limit, (result.error, result.stderr[-300:])


FLOOD = {
    "javascript": "const s = 'x'.repeat(1 << 16); for (;;) process.stdout.write(s)",
    "bash": "yes",
}


@pytest.mark.parametrize("language", ["javascript", "bash"])
def test_output_flood_is_output_limit(jailed: Executor, language: str) -> None:
    result = jailed.run(FLOOD[language], language=language, limits={"output_bytes": 1 << 20})
    assert result.status is Status.output_limit, result.error
    assert len(result.stdout.encode()) <= 1 << 20


def test_libuv_file_io_works_under_the_filter_and_io_uring_stays_refused(
    jailed: Executor,
) -> None:
    # Node's default libuv does file I/O on its thread pool (it worked: the filter let it);
    # a Node told to use io_uring is killed by the filter (SIGSYS), never let through.
    code = (
        "const cp = require('child_process');"
        'const probe = \'require("fs").readFile("/etc/hosts", (e, d) => console.log(e ? e.code : "READ"))\';'
        "for (const uring of ['0', '1']) {"
        "  const r = cp.spawnSync(process.execPath, ['-e', probe], { env: { UV_USE_IO_URING: uring } });"
        "  console.log(uring, String(r.stdout).trim(), r.signal);"
        "}"
    )
    result = jailed.run(code, language="javascript")
    assert result.status is Status.ok, (result.error, result.stderr[-300:])
    lines = result.stdout.splitlines()
    assert lines[0] == "0 READ null"
    assert lines[1] == "1  SIGSYS"


def test_a_normal_node_run_fits_the_default_pids(executor: Executor) -> None:
    code = (
        "const fs = require('fs'); const zlib = require('zlib');"
        "Promise.all([...Array(8)].map((_, i) => fs.promises.readFile('/etc/hosts')))"
        ".then(() => zlib.gzipSync(Buffer.alloc(1 << 20)))"
        ".then(() => console.log(fs.readdirSync('/proc/self/task').length))"
    )
    result = executor.run(code, language="javascript")
    assert result.status is Status.ok, (result.error, result.stderr[-300:])
    assert int(result.stdout) < 64 // 2
