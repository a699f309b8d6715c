"""Staged Node and bash processes (`sandbox.inside.staged`): a javascript or bash slot's
interpreter is started and contained before its request, serves exactly one run, and nothing of
that run reaches the next.
"""

from __future__ import annotations

import json
import os

import pytest

import execbox
from execbox import Executor, Status
from execbox.routing import interpreter_kind
from execbox.sandbox.inside import interpreters
from tests.probes import alive, host_internals, host_stats, wait_until

STAGE_WAIT_S = 60.0  # a loaded machine may take seconds to start Node


def staged_nodes(prefix: str, interpreter: bytes = b"node") -> list[int]:
    """The pids of staged Node (or bash) processes waiting in slots whose cgroup names start
    with `prefix` (this test process's executor's)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                args = fh.read().split(b"\0")
            with open(f"/proc/{entry}/cgroup") as fh:
                cgroup = fh.read()
        except OSError:
            continue
        staged = os.path.basename(args[0]) == interpreter and b"staged" in args
        if staged and f"/{prefix}" in cgroup:
            found.append(int(entry))
    return found


def cgroup_limits(pid: int) -> tuple[str, str]:
    """The memory and pids limits of the cgroup of `pid` (cgroup v2, or v1's controllers)."""
    with open(f"/proc/{pid}/cgroup") as fh:
        paths = {}
        for line in fh.read().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    if "memory" in paths:
        memory = f"/sys/fs/cgroup/memory{paths['memory']}/memory.limit_in_bytes"
        pids = f"/sys/fs/cgroup/pids{paths['pids']}/pids.max"
    else:
        memory = f"/sys/fs/cgroup{paths['']}/memory.max"
        pids = f"/sys/fs/cgroup{paths['']}/pids.max"
    with open(memory) as m, open(pids) as p:
        return m.read().strip(), p.read().strip()


def wait_staged(ex: Executor) -> list[int]:
    prefix = host_stats(ex).slot_prefix
    assert wait_until(lambda: staged_nodes(prefix), STAGE_WAIT_S, every_s=0.05), (
        "no staged Node process appeared"
    )
    assert wait_until(lambda: host_stats(ex).staged["javascript"] > 0, STAGE_WAIT_S)
    return staged_nodes(prefix)


def test_javascript_runs_in_a_node_started_before_its_request(jailed_one_slot: Executor) -> None:
    jailed_one_slot.run("1", language="javascript")
    prefix = host_stats(jailed_one_slot).slot_prefix
    wait_until(lambda: staged_nodes(prefix), STAGE_WAIT_S)  # none where Node starts per run
    result = jailed_one_slot.run("console.log(process.uptime())", language="javascript")
    assert result.status is Status.ok, result.stderr
    # Node had been up longer than the whole run took: it started before the request came.
    assert float(result.stdout) * 1000 > result.metrics.wall_ms, result


def test_a_waiting_node_is_contained_and_under_the_slots_limits(
    jailed_one_slot: Executor,
) -> None:
    # The last run's memory and pids limits stay applied for the slot's next program.
    jailed_one_slot.run("1", language="javascript", limits={"memory_mib": 96, "pids": 40})
    pids = wait_staged(jailed_one_slot)
    for pid in pids:
        with open(f"/proc/{pid}/status") as fh:
            status = dict(line.split(":", 1) for line in fh.read().splitlines())
        memory_max, pids_max = cgroup_limits(pid)
        with open(f"/proc/{pid}/limits") as fh:
            cpu_limit = next(ln for ln in fh if ln.startswith("Max cpu time")).split()[3]
        assert status["Seccomp"].strip() == "2", status  # the filter, before any code
        assert status["NoNewPrivs"].strip() == "1"
        assert status["CapEff"].strip() == "0000000000000000"
        assert status["Uid"].split()[0] != "0"
        assert (memory_max, pids_max) == (str(96 << 20), "40")
        assert cpu_limit != "unlimited"


LEAVE_TRACES = """
globalThis.leaked = 'global';
process.env.LEAKED = 'env';
require('fs').writeFileSync('/tmp/leaked', 'file');
require('child_process').spawn('sleep', ['60'], { detached: true, stdio: 'ignore' }).unref();
setTimeout(() => {}, 1);
console.log(process.pid);
"""

FIND_TRACES = """
const fs = require('fs');
const procs = fs.readdirSync('/proc').filter((p) => /^\\d+$/.test(p));
const sleeping = procs.filter((p) => {
  try { return fs.readFileSync(`/proc/${p}/cmdline`, 'utf8').startsWith('sleep'); }
  catch { return false; }
});
console.log(JSON.stringify({
  global: typeof globalThis.leaked,
  env: process.env.LEAKED ?? null,
  file: fs.existsSync('/tmp/leaked'),
  sleeping: sleeping.length,
}));
"""


def test_nothing_of_a_js_run_reaches_the_next(jailed_one_slot: Executor) -> None:
    first = jailed_one_slot.run(LEAVE_TRACES, language="javascript")
    assert first.status is Status.ok, first.stderr
    wait_staged(jailed_one_slot)  # the one slot's next Node
    second = jailed_one_slot.run(FIND_TRACES, language="javascript")
    assert second.status is Status.ok, second.stderr
    assert json.loads(second.stdout) == {
        "global": "undefined",
        "env": None,
        "file": False,
        "sleeping": 0,
    }


def test_the_env_a_run_asks_for_is_the_env_its_code_sees(jailed_one_slot: Executor) -> None:
    code = "console.log(JSON.stringify(process.env))"
    for env in ({"GIVEN": "yes", "PATH": "/opt/x:/usr/bin"}, {"OTHER": "1"}):
        wait_staged(jailed_one_slot)
        result = jailed_one_slot.run(code, language="javascript", env=env)
        assert result.status is Status.ok, result.stderr
        assert json.loads(result.stdout) == {**env, "UV_THREADPOOL_SIZE": "4"}


def test_env_node_reads_as_it_starts_takes_effect(jailed: Executor) -> None:
    result = jailed.run(
        "console.log(Error.stackTraceLimit)",
        language="javascript",
        env={"NODE_OPTIONS": "--stack-trace-limit=3"},
    )
    assert result.status is Status.ok, result.stderr
    assert result.stdout == "3\n"


def test_exit_listeners_run_before_the_exit_status_is_reported(jailed: Executor) -> None:
    code = "process.on('exit', () => { console.log('bye'); process.exitCode = 4 })"
    result = jailed.run(code, language="javascript")
    assert result.stdout == "bye\n"
    assert result.exit_code == 4


def test_python_runs_start_no_node_or_bash_and_close_leaves_none_staged() -> None:
    with execbox.Executor(
        cache=False, pool_size=2, rotate_after_runs=None, rotate_after_s=None
    ) as ex:
        assert ex.run("print(1)").stdout == "1\n"
        host = host_internals(ex)
        assert "javascript" not in host.started_programs()
        assert "bash" not in host.started_programs()
        assert staged_nodes(host.slot_prefix) == []
        assert ex.run("console.log(1)", language="javascript").stdout == "1\n"
        assert "javascript" in host.started_programs()
        assert ex.run("echo 1", language="bash").stdout == "1\n"
        assert "bash" in host.started_programs()
        pids = wait_staged(ex) + wait_staged_bash(ex)
    assert wait_until(lambda: not any(alive(pid) for pid in pids), 10.0), pids


def test_a_run_with_few_pids_does_not_break_the_next_run_of_its_slot(
    jailed_one_slot: Executor,
) -> None:
    """A run's limits stay applied for the slot's next Node; Node cannot start its threads
    under pids=4, so the next run (through a server, another tenant's) failed in set-up."""
    few = jailed_one_slot.run("console.log(1)", language="javascript", limits={"pids": 4})
    assert few.status is Status.ok, few.stderr
    after = jailed_one_slot.run("console.log(2)", language="javascript")
    assert after.status is Status.ok, after.error
    assert after.stdout == "2\n"
    # The few pids still bind a run that asks for them.
    bomb = "for (let i = 0; i < 8; i++) require('child_process').spawn('sleep', ['5'])"
    held = jailed_one_slot.run(bomb, language="javascript", limits={"pids": 4})
    assert held.status is Status.error and "EAGAIN" in held.stderr, held


def wait_staged_bash(ex: Executor) -> list[int]:
    prefix = host_stats(ex).slot_prefix
    assert wait_until(lambda: staged_nodes(prefix, b"bash"), STAGE_WAIT_S, every_s=0.05), (
        "no staged bash appeared"
    )
    assert wait_until(lambda: host_stats(ex).staged["bash"] > 0, STAGE_WAIT_S)
    return staged_nodes(prefix, b"bash")


def test_bash_runs_in_a_bash_started_before_its_request(jailed_one_slot: Executor) -> None:
    jailed_one_slot.run("true", language="bash")
    waiting = wait_staged_bash(jailed_one_slot)
    assert len(waiting) == 1, waiting  # the one bash slot's
    result = jailed_one_slot.run("echo $0; echo $BASH_EXECUTION_STRING", language="bash")
    assert (result.status, result.stdout) == (
        Status.ok,
        "main.sh\necho $0; echo $BASH_EXECUTION_STRING\n",
    )
    # It served the run (then its slot's init was killed), and only that one.
    assert wait_until(lambda: not alive(waiting[0]), 10.0)


def test_a_waiting_bash_is_contained_and_under_the_slots_limits(
    jailed_one_slot: Executor,
) -> None:
    jailed_one_slot.run("true", language="bash", limits={"memory_mib": 96, "pids": 40})
    for pid in wait_staged_bash(jailed_one_slot):
        with open(f"/proc/{pid}/status") as fh:
            status = dict(line.split(":", 1) for line in fh.read().splitlines())
        assert status["Seccomp"].strip() == "2", status
        assert status["NoNewPrivs"].strip() == "1"
        assert status["CapEff"].strip() == "0000000000000000"
        assert status["Uid"].split()[0] != "0"
        assert cgroup_limits(pid) == (str(96 << 20), "40")
        with open(f"/proc/{pid}/environ", "rb") as fh:
            assert fh.read() == b""  # nothing of a request yet


def test_nothing_of_a_bash_run_reaches_the_next(jailed_one_slot: Executor) -> None:
    first = "export LEAKED=env; leaked=var; f() { :; }; echo file > /tmp/leaked\n"
    first += "(setsid sleep 60 >/dev/null 2>&1 &); trap 'echo trapped' EXIT; echo $$"
    result = jailed_one_slot.run(first, language="bash")
    assert result.status is Status.ok, result.stderr
    wait_staged_bash(jailed_one_slot)
    check = "echo ${LEAKED-none} ${leaked-none} $(type -t f || echo none)"
    check += " $([[ -e /tmp/leaked ]] && echo file || echo none) $(pgrep -c sleep)"
    second = jailed_one_slot.run(check, language="bash")
    assert (second.stdout, second.stderr) == ("none none none none 0\n", "")


ODD_VALUE = "a\nb = c 'd' \"e\" $f -x ü\t"


def test_a_staged_bash_hands_on_the_env_and_code_exactly(jailed_one_slot: Executor) -> None:
    code = "  printf '%s|' \"$GIVEN\" \"$ODD\" 'ü é'\nenv -0 | sort -z | tr '\\0' '\\n'\n\n"
    jailed_one_slot.run("true", language="bash")  # the bash zygote starts at its first run
    for env in ({"GIVEN": "yes", "PATH": "/opt/x:/usr/bin", "ODD": ODD_VALUE}, {}):
        wait_staged_bash(jailed_one_slot)
        result = jailed_one_slot.run(code, language="bash", env=env)
        assert result.status is Status.ok, result.stderr
        shown = f"{env.get('GIVEN', '')}|{env.get('ODD', '')}|ü é|"
        listed = sorted([f"{k}={v}" for k, v in env.items()] + ["PWD=/workspace", "SHLVL=1"])
        assert result.stdout == shown + "".join(f"{v}\n" for v in listed + ["_=/usr/bin/env"])


# The staged bash script's own variables before they were named `__execbox_*`.
SCRIPT_NAMES = "code token count vars i v size go_fd done_fd setup_fd".split()


def test_a_request_variable_cannot_replace_the_code_or_be_dropped(
    jailed_one_slot: Executor,
) -> None:
    # env {"code": ...} ran that instead of the code; the others were unset before the exec.
    env = {name: f"request {name}" for name in SCRIPT_NAMES} | {"code": "echo INJECTED"}
    jailed_one_slot.run("true", language="bash")  # the bash zygote starts at its first run
    wait_staged_bash(jailed_one_slot)
    shown = "".join(f'echo "${{{name}-unset}}"\n' for name in SCRIPT_NAMES)
    result = jailed_one_slot.run("echo the code\n" + shown, language="bash", env=env)
    assert result.status is Status.ok, result.stderr
    assert result.stdout == "the code\n" + "".join(f"{env[n]}\n" for n in SCRIPT_NAMES)
    assert interpreter_kind("bash", {"__execbox_code": "x"}, "ls") == "light"


# Past the staged way's 120 KiB of code: the same request, run the unstaged way.
UNSTAGED_PAD = "\n#" + "x" * (interpreters.MAX_ARGUMENT_BYTES + 1) + "\n"


@pytest.mark.parametrize(
    "env",
    [
        {"SHLVL": "7"},  # a staged bash's exec lowered it by one: the code saw 7, not 8
        {"BIG": "a" * 200_000},  # exec's E2BIG was the code's exit status 126
        {f"V{i}": "x" * 1000 for i in range(3000)},
    ],
    ids=["SHLVL", "one-too-long", "all-too-long"],
)
def test_a_staged_bash_runs_a_request_as_the_unstaged_way_does(
    jailed_one_slot: Executor, env: dict[str, str]
) -> None:
    code = 'echo "$SHLVL ${#BIG}"'
    jailed_one_slot.run("true", language="bash")
    wait_staged_bash(jailed_one_slot)
    staged, unstaged = (
        jailed_one_slot.run(c, language="bash", env=env) for c in (code, code + UNSTAGED_PAD)
    )
    seen = [(r.status, r.exit_code, r.stdout, r.stderr, r.error) for r in (staged, unstaged)]
    assert seen[0] == seen[1]


def test_env_bash_reads_as_it_starts_takes_effect(jailed: Executor) -> None:
    # Readonly in a started bash, so a staged one could not pass it: the unstaged way runs it.
    result = jailed.run("echo hi", language="bash", env={"SHELLOPTS": "xtrace"})
    assert (result.status, result.stdout) == (Status.ok, "hi\n")
    assert result.stderr.endswith("+ echo hi\n"), result.stderr
    result = jailed.run("echo $BASHOPTS", language="bash", env={"BASHOPTS": "globstar"})
    assert "globstar" in result.stdout.split(":"), result.stderr


def test_a_staged_bash_takes_the_long_way_too(jailed_one_slot: Executor) -> None:
    # Input files and other limits: the supervisor writes the request, not the host.
    jailed_one_slot.run("true", language="bash")  # the bash zygote starts at its first run
    waiting = wait_staged_bash(jailed_one_slot)
    result = jailed_one_slot.run(
        'cat in.txt; echo "$GIVEN"',
        language="bash",
        env={"GIVEN": "yes"},
        files={"in.txt": b"data\n"},
        limits={"memory_mib": 200},
    )
    assert (result.status, result.stdout) == (Status.ok, "data\nyes\n"), result.stderr
    assert wait_until(lambda: not alive(waiting[0]), 10.0)


@pytest.mark.parametrize(("code", "status"), [("exit 0", 0), ("exit 255", 255), ("exit 300", 44)])
def test_a_staged_bash_reports_its_exit_status_as_a_byte(
    jailed: Executor, code: str, status: int
) -> None:
    # The code's bash reports its status on the done pipe itself (one byte after the token).
    result = jailed.run(f"echo out; echo err >&2; {code}", language="bash")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", status)


def test_bash_requests_a_started_bash_cannot_serve_as_they_are_go_unstaged() -> None:
    assert interpreter_kind("bash", {"GIVEN": "1", "PATH": "/usr/bin", "TZ": "UTC"}, "ls") == "bash"
    for env in ({"SHELLOPTS": "xtrace"}, {"BASH_XTRACEFD": "2"}, {"LC_ALL": "C"}, {"IFS": ","}):
        assert interpreter_kind("bash", env, "ls") == "light", env
    assert interpreter_kind("bash", {"A-B": "1"}, "ls") == "light"
    assert interpreter_kind("bash", {}, "echo a\0b") == "light"
    limit = interpreters.MAX_ARGUMENT_BYTES
    assert interpreter_kind("bash", {}, "#" * limit) == "bash"
    assert interpreter_kind("bash", {}, "#" * (limit + 1)) == "light"
    assert interpreter_kind("bash", {}, "é" * (limit // 2 + 1)) == "light"  # bytes, not characters
