"""Inside the jail: run JavaScript (the machine's Node) and bash by replacing the contained
program process with the interpreter.

The program process is forked from the light program zygote straight into its slot and is
contained there before it waits for its code (cgroup, pid/ipc/mount/net/uts namespaces, its
own uid, no capabilities, no_new_privs, seccomp). An execve keeps every one of those, so a
JavaScript or bash run is jailed exactly as a Python run is; only the code that runs differs.
This is the unstaged way, taken by requests a staged interpreter cannot serve (`staged`).

The code goes to the interpreter in a memfd (never a file in the workspace, which would become
an artifact); Node runs `runner.js` (read once, by the zygote, from execbox's package) that
compiles it as `main.js` and reports an uncaught error on the error pipe as `runner` does.
Bash runs it with `-c` and `$0` main.sh (so its messages say "main.sh: line N"); a `set -e`
failure is reported with its line through traps set from a BASH_ENV memfd.
The interpreters are found under /usr, which every slot's root binds read-only.
Standard library only.
"""

from __future__ import annotations

import os
from typing import NoReturn

LANGUAGES = ("python", "javascript", "bash")
EXEC_LANGUAGES = ("javascript", "bash")
# Where a slot's root can see them (it binds /usr; /bin is a link to usr/bin on merged systems).
SEARCH = ("/usr/local/bin", "/usr/bin")
NODE_MIN_MAJOR = 20
# Node's libuv threads (fs, dns, crypto) on top of V8's: a normal run fits the default pids.
UV_THREADPOOL_SIZE = "4"
# Bash takes the code as one argument below this; the kernel refuses a longer one (E2BIG).
MAX_ARGUMENT_BYTES = 120 * 1024

_RUNNER_JS = os.path.join(os.path.dirname(__file__), "runner.js")
_SESSION_JS = os.path.join(os.path.dirname(__file__), "session.js")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


# Read once, in the zygote: the jail does not show the package. A session's cells are served by
# session.js, which a staged Node runs when its request says so: one script, so it is there.
# In a function of its own: `-e` runs a classic script, whose top-level names a session's cells
# (scripts in the same context) would share, and could not declare again.
NODE_RUNNER = f"(function () {{\n{_read(_RUNNER_JS)}\n{_read(_SESSION_JS)}\n}})();\n"

# Sourced by bash before the code (BASH_ENV): an ERR trap notes the line of a failure under
# `set -e`, and the EXIT trap reports it when the shell exits with that failure's status.
# A staged bash (`staged`) hands on "<done fd> <token>" in __EXECBOX_REPORT: the EXIT trap of
# the shell itself (not a subshell's) then closes stdio and reports the exit status there, as
# runner.py does, before bash tears down (else it comes from the zygote, later: a code's own
# EXIT trap or exec). Each trap's body runs with stderr on /dev/null, so the code's `set -x`
# does not trace it; what they read is set here, so the code's `set -u` does not stop them.
_BASH_PRELUDE = """\
__execbox_r=$__EXECBOX_REPORT __execbox_p=$$ __execbox_l=
unset BASH_ENV __EXECBOX_REPORT
trap '{ __execbox_s=$? __execbox_l=$LINENO; [[ $- == *e* ]] || __execbox_l=; } 2>/dev/null' ERR
trap '{ __execbox_x=$?; if [[ -n $__execbox_l && $__execbox_x == "$__execbox_s" ]]; then \
printf '"'"'{"type":"CommandFailed","message":"a command failed with exit status %s under \
set -e","line":%s,"column":null,"traceback":null}'"'"' "$__execbox_x" "$__execbox_l" \
>&{err_fd}; fi; if [[ -n $__execbox_r && $BASHPID == "$__execbox_p" ]]; then \
exec 0<&- 1>&- 2>&-; printf -v __execbox_b '"'"'\\\\x%02x'"'"' $((__execbox_x & 255)); \
printf "%s$__execbox_b" "${__execbox_r#* }" >&"${__execbox_r%% *}"; fi; } 2>/dev/null' EXIT
"""


def find(name: str) -> str | None:
    """The interpreter `name` as a slot sees it, or None when the jail has none."""
    for directory in SEARCH:
        path = os.path.join(directory, name)
        if os.access(path, os.X_OK):
            return os.path.realpath(path)
    return None


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)  # inherited by the interpreter: no MFD_CLOEXEC
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def bash_prelude(err_fd: int) -> int:
    """A memfd (inherited across exec) of the BASH_ENV prelude reporting to `err_fd`."""
    return _memfd("prelude.sh", _BASH_PRELUDE.replace("{err_fd}", str(err_fd)).encode())


def argv(
    language: str, code: str, err_fd: int, memory_bytes: int
) -> tuple[list[str], dict[str, str]]:
    """The interpreter's argv and the variables it gets beyond the run's environment."""
    if language == "javascript":
        node = find("node")
        if node is None:
            raise OSError("javascript runs need node in /usr/bin or /usr/local/bin")
        code_fd = _memfd("main.js", code.encode("utf-8", "surrogatepass"))
        # V8's heap limit above the cgroup's: a heap that outgrows the run's memory is the
        # cgroup's OOM kill (status memory_limit), never a V8 abort reported as an error.
        heap_mib = max(64, 2 * memory_bytes >> 20)
        return [
            node,
            f"--max-old-space-size={heap_mib}",
            "-e",
            NODE_RUNNER,
            str(code_fd),
            str(err_fd),
        ], {"UV_THREADPOOL_SIZE": UV_THREADPOOL_SIZE}
    if language == "bash":
        bash = find("bash")
        if bash is None:
            raise OSError("bash runs need bash in /usr/bin or /usr/local/bin")
        extra = {"BASH_ENV": f"/proc/self/fd/{bash_prelude(err_fd)}"}
        data = code.encode("utf-8", "surrogatepass")
        if len(data) <= MAX_ARGUMENT_BYTES and b"\0" not in data:  # an argument ends at NUL
            return [bash, "-c", "--", code, "main.sh"], extra  # "--": code may start with "-"
        return [bash, f"/proc/self/fd/{_memfd('main.sh', data)}"], extra
    raise ValueError(f"no interpreter for language {language!r}")


def exec_code(
    language: str, code: str, env: dict[str, str], err_fd: int, memory_bytes: int
) -> NoReturn:
    """Become the interpreter of `language` running `code`; raises OSError if it cannot."""
    args, extra = argv(language, code, err_fd, memory_bytes)
    os.set_inheritable(err_fd, True)
    os.execve(args[0], args, {**env, **extra})  # the request may not set these (contract)
