"""Inside the jail: a staged interpreter, started ahead of its request and waiting for its code.

A program of the "javascript" zygote (`protocol.SLOT_KINDS`) is forked into its slot and
contained there as every program is (cgroup, namespaces, its own uid, no capabilities,
no_new_privs, seccomp, stdio); then, before it says it waits for its code, it sets the
rlimits a run may ask for at most and execs Node running `runner.js` in its staged mode. Node
loads all it needs, writes `protocol.PARKED` on the exit-report pipe and blocks reading the
request (the REQ frame the host or the supervisor writes, as a Python program reads it) from
its go pipe. So Node's start is paid off the request path, under all the run's limits, and a
staged Node serves exactly one run: its slot stages a fresh one for the next.

What a request sets is applied by the runner before the code runs: the environment
(`process.env` is replaced by the request's). What takes effect only when Node starts
(NODE_OPTIONS, the locale, ...: `routing.EXEC_TIME_ENV`) cannot be applied to a started Node:
a request that sets one runs in a light slot whose program execs Node with it
(`interpreters`), the unstaged way. The rlimits that depend on the request (CPU seconds, file size) are set at their
largest here: the supervisor's cgroup CPU watch and the scratch tmpfs' size are what enforce
a run's CPU and disk limits (for Python too the rlimits are a backstop only); the memory and
pids limits are the cgroup's, applied before the code is sent.
Standard library only.
"""

from __future__ import annotations

import os
from typing import NoReturn

from . import interpreters, jail

LANGUAGES = ("javascript", "bash")  # a program zygote of each (`protocol.SLOT_KINDS`)
# The largest CPU time and disk a request may ask for (contract.Limits: cpu_s, disk_mib).
MAX_CPU_S = 3600.0
MAX_DISK_BYTES = 65536 << 20
# V8's heap limit above the largest memory limit (contract.Limits.memory_mib): a heap that
# outgrows the run's memory is the cgroup's OOM kill (memory_limit), never a V8 abort.
NODE_HEAP_MIB = 2 * 65536
_STAGED_SPEC = jail.RunSpec(
    timeout_s=MAX_CPU_S,
    cpu_s=MAX_CPU_S,
    memory_bytes=0,  # the cgroup's
    pids=0,  # the cgroup's
    disk_bytes=MAX_DISK_BYTES,
    output_bytes=0,
    artifact_bytes=0,
    artifact_files=0,
)


# A staged bash ($1 go, $2 err, $3 done, $4 setup, $5 the prelude's memfd): it says it waits,
# reads its request (`protocol.go_frame`; in the C locale, where a character is a byte), makes
# the request's variables its exported ones and execs bash on the code as the unstaged way
# does (`interpreters.argv`: `-c` with $0 main.sh, the prelude as BASH_ENV, which reports the
# exit status on the done pipe), so whatever bash reads as it starts comes from the request.
# What the exec keeps is the program's jail. Its own variables are named `__execbox_*`, which
# a request's variable cannot shadow (`routing.bash_env_stages`): else env {"code": ...} would
# replace the code and a variable named like one it unsets would not reach the code.
STAGED_BASH = r"""
__execbox_go=$1 __execbox_done=$3 __execbox_setup=$4
printf P >&"$__execbox_done"
IFS= read -r -d '' -u "$__execbox_go" __execbox_token || exit 0
fail() { printf 'program set-up: staged bash: %s' "$1" >&"$__execbox_setup"; exit 127; }
IFS= read -r -d '' -u "$__execbox_go" __execbox_count && [[ $__execbox_count =~ ^[0-9]+$ ]] ||
  fail 'a request, not that'
__execbox_vars=()
for ((__execbox_i = 0; __execbox_i < __execbox_count; __execbox_i++)); do
  IFS= read -r -d '' -u "$__execbox_go" '__execbox_vars[__execbox_i]' ||
    fail 'the request ended early'
done
IFS= read -r -d '' -u "$__execbox_go" __execbox_size && [[ $__execbox_size =~ ^[0-9]+$ ]] ||
  fail 'a request, not that'
__execbox_code=
((__execbox_size == 0)) ||
  IFS= read -r -N "$__execbox_size" -u "$__execbox_go" __execbox_code
((${#__execbox_code} == __execbox_size)) || fail 'the request ended early'
export -n PWD OLDPWD SHLVL
for __execbox_v in "${__execbox_vars[@]}"; do
  export "$__execbox_v" || fail "cannot set ${__execbox_v%%=*}"
done
export BASH_ENV=/proc/self/fd/$5 __EXECBOX_REPORT="$__execbox_done $__execbox_token"
exec {__execbox_go}<&- {__execbox_setup}>&-
unset __execbox_go __execbox_done __execbox_setup __execbox_token __execbox_count
unset __execbox_vars __execbox_i __execbox_v __execbox_size
exec "$BASH" -c -- "$__execbox_code" main.sh
"""


def exec_staged(language: str, go_r: int, err_w: int, setup_w: int, done_w: int) -> NoReturn:
    """Become the staged interpreter of `language`, which waits on `go_r` for its request;
    raises OSError (or JailError) if it cannot."""
    if language == "bash":
        _exec_staged_bash(go_r, err_w, setup_w, done_w)
    if language != "javascript":
        raise ValueError(f"no staged interpreter for language {language!r}")
    node = interpreters.find("node")
    if node is None:
        raise OSError("javascript runs need node in /usr/bin or /usr/local/bin")
    jail.set_rlimits(_STAGED_SPEC)
    fds = (go_r, err_w, done_w, setup_w)
    for fd in fds:
        os.set_inheritable(fd, True)
    args = [
        node,
        f"--max-old-space-size={NODE_HEAP_MIB}",
        "-e",
        interpreters.NODE_RUNNER,
        "staged",
        *map(str, fds),
    ]
    os.execve(node, args, {"UV_THREADPOOL_SIZE": interpreters.UV_THREADPOOL_SIZE})


def _exec_staged_bash(go_r: int, err_w: int, setup_w: int, done_w: int) -> NoReturn:
    bash = interpreters.find("bash")
    if bash is None:
        raise OSError("bash runs need bash in /usr/bin or /usr/local/bin")
    jail.set_rlimits(_STAGED_SPEC)
    prelude = interpreters.bash_prelude(err_w)
    fds = (go_r, err_w, done_w, setup_w)
    for fd in fds:
        os.set_inheritable(fd, True)
    args = [bash, "--norc", "--noprofile", "-c", STAGED_BASH, "staged", *map(str, (*fds, prelude))]
    os.execve(bash, args, {})
