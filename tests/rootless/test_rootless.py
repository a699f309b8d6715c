"""Rootless mode as a real ordinary user: the test (as root) makes a throwaway user with
useradd, runs execbox as that user with setpriv, and removes the user after. What `execbox
doctor` reports must match what that user can really do: make the jail's namespaces, run code
in them, and, only with a cgroup v1 directory an administrator chowned to it, hold memory and
pids limits. Without one the executor is refused, naming what is missing and the explicit
opt-in; with the opt-in, runs work with no cgroup. The hostile runs (kill(-1), a fork loop, a
memory hog) go only after a jail proof adapted to rootless mode (see `runs`)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import execbox
from execbox.environments import DEFAULT_NAME
from execbox.image import Image
from execbox.sandbox.inside.jail import RUN_UID, UID_FIRST

pytestmark = [
    pytest.mark.rootless,
    pytest.mark.skipif(os.geteuid() != 0, reason="makes a user and cgroup directories: root"),
    pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv"),
]

SRC = Path(execbox.__file__).resolve().parent.parent
V1 = Path("/sys/fs/cgroup")


@dataclass
class User:
    name: str | None  # None: a uid with no account (a guest whose /etc is read-only)
    uid: int
    home: Path
    python: str
    # A cgroup v2 directory root moves each of the user's programs into before it drops to the
    # user (as systemd starts a user's services in its delegated user@UID.service); None: stay.
    cgroup: Path | None = None

    @property
    def become(self) -> list[str]:
        """The command prefix that runs a program as this user, with no other group."""
        drop = ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups", "--"]
        if self.cgroup is None:
            return drop
        enter = 'echo $$ > "$0/cgroup.procs" && exec "$@"'
        return ["sh", "-c", enter, str(self.cgroup), *drop]

    def run(
        self, *argv: str, env: dict[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        base = {
            "PATH": "/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": str(self.home),
            "EXECBOX_HOME": str(self.home / "execbox"),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        return subprocess.run(
            [*self.become, "env", "-i"]
            + [f"{k}={v}" for k, v in (base | (env or {})).items()]
            + list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def python_code(self, code: str, env: dict[str, str] | None = None) -> str:
        """What `code` printed, as this user; its failure fails the test."""
        done = self.run(self.python, "-c", code, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def doctor(self, env: dict[str, str] | None = None, status: int = 2) -> dict[str, str]:
        """`execbox doctor` as this user (exiting `status`): each check's line by its name."""
        done = self.run(self.python, "-m", "execbox.cli", "doctor", env=env)
        assert done.returncode == status, done.stdout + done.stderr
        lines = {}
        for line in done.stdout.splitlines():
            mark, _, rest = line.partition(" ")
            if mark in ("ok", "FAIL", "warn"):
                name = next(
                    (
                        n
                        for n in (
                            "user namespaces",
                            "subordinate ids",
                            "rootless jail",
                            "limit cpu time",
                            "limit wall time",
                            "limit memory",
                            "limit pids",
                            "mode",
                            "linux",
                            "python",
                            "seccomp",
                            "limit disk",
                            "limit output",
                            "limit network",
                        )
                        if rest.strip().startswith(n)
                    ),
                    None,
                )
                if name is not None:  # a line of the runtime image's checks, say
                    lines[name] = line
        return lines


@pytest.fixture(scope="module")
def user() -> Iterator[User]:
    name = f"xbrl{os.getpid()}"
    # Not pytest's tmp_path: its root is root's alone.
    base = Path(tempfile.mkdtemp(prefix="execbox-rootless-"))
    base.chmod(0o755)
    # An interpreter the user can run that sees execbox and its packages: the venv's own may
    # sit under a root-only directory (a pyenv); the system one of the same version does not.
    if not os.access(f"/usr/bin/python{sysconfig.get_python_version()}", os.X_OK):
        pytest.skip(f"needs /usr/bin/python{sysconfig.get_python_version()}")
    venv = base / "venv"
    version = sysconfig.get_python_version()
    subprocess.run([f"/usr/bin/python{version}", "-m", "venv", "--without-pip", venv], check=True)
    site = subprocess.run(
        [venv / "bin/python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    src, packages = SRC, Path(sysconfig.get_path("purelib"))
    if not (_readable_by_nobody(src / "execbox") and _readable_by_nobody(packages)):
        # A clone under a root-only home (CI's): the user reads a copy of both.
        shutil.copytree(src / "execbox", base / "src" / "execbox")
        shutil.copytree(packages, base / "packages", symlinks=True)
        src, packages = base / "src", base / "packages"
        subprocess.run(["chmod", "-R", "a+rX", str(src), str(packages)], check=True)
    Path(site, "execbox-under-test.pth").write_text(f"{src}\n{packages}\n")
    account: str | None = name
    if shutil.which("useradd") and os.access("/etc/passwd", os.W_OK):
        subprocess.run(
            ["useradd", "--no-create-home", "--home-dir", "/nonexistent", name], check=True
        )
        uid = int(subprocess.run(["id", "-u", name], capture_output=True, check=True).stdout)
        subordinate_ranges(name, None)  # useradd may give it some: a test adds its own
    else:  # the cgroup v2 guest (tests/uml) binds the host's /etc read-only: a bare uid
        account, uid = None, 60000 + os.getpid() % 1000
        assert not any(u.pw_uid == uid for u in pwd.getpwall())
    try:
        home = base / "home"
        home.mkdir(mode=0o700)
        _give_image(home / "execbox", base)
        (home / "secret.txt").write_text("the caller's own file\n")
        subprocess.run(["chown", "-R", f"{uid}:{uid}", str(home)], check=True)
        subprocess.run(["chmod", "-R", "a+rX", str(venv)], check=True)
        found = User(account, uid, home, str(venv / "bin/python"))
        assert found.python_code("import os; print(os.geteuid())").strip() == str(uid)
        assert readable_tree(found), "the user cannot import execbox from its copy"
        yield found
    finally:
        subprocess.run(["pkill", "-KILL", "-U", str(uid)], check=False)
        if account is not None:
            subordinate_ranges(account, None)
            subprocess.run(["userdel", account], check=True)
        shutil.rmtree(base)


def subordinate_ranges(name: str, first: int | None, count: int = 65536) -> None:
    """Set `name`'s line in /etc/subuid and /etc/subgid to FIRST:COUNT (None: remove it),
    leaving every other line as it was."""
    for path in (Path("/etc/subuid"), Path("/etc/subgid")):
        lines = path.read_text().splitlines(keepends=True) if path.exists() else []
        kept = [line for line in lines if line.split(":", 1)[0] != name]
        if first is not None:
            kept.append(f"{name}:{first}:{count}\n")
        if kept != lines:
            tmp = path.with_name(path.name + ".execbox-test")
            tmp.write_text("".join(kept))
            tmp.chmod(0o644)
            tmp.replace(path)


def _give_image(execbox_home: Path, base: Path) -> None:
    """The runtime image this test's execbox uses, as the default environment of the user's
    EXECBOX_HOME: linked, or copied when the user could not read it (CI's root-only home)."""
    tree = Image.load().root
    if not _readable_by_nobody(tree / "lib"):
        copy = base / "tree"
        shutil.copytree(tree, copy, symlinks=True)
        subprocess.run(["chmod", "-R", "a+rX", str(copy)], check=True)
        tree = copy
    (execbox_home / "envs" / "trees").mkdir(parents=True)
    (execbox_home / "envs" / "names").mkdir()
    (execbox_home / "envs" / "trees" / tree.name).symlink_to(tree)
    (execbox_home / "envs" / "names" / DEFAULT_NAME).symlink_to(f"../trees/{tree.name}")


def _readable_by_nobody(path: Path) -> bool:
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    return subprocess.run([*drop, "test", "-r", str(path)], check=False).returncode == 0


def readable_tree(user: User) -> bool:
    return user.run(user.python, "-c", "import execbox.executor").returncode == 0


@pytest.fixture
def delegated(user: User) -> Iterator[str]:
    """cgroup v1 memory and pids directories an administrator made and chowned to `user`
    (removed after, with what the user made in them); the setting that names them."""
    if not (V1 / "memory/cgroup.procs").exists() or not (V1 / "pids/cgroup.procs").exists():
        pytest.skip("needs cgroup v1 memory and pids hierarchies")
    name = f"execbox-rootless-test-{os.getpid()}"
    made = []
    try:
        for controller in ("memory", "pids"):
            path = V1 / controller / name
            path.mkdir()
            made.append(path)
            for entry in (path, path / "cgroup.procs", path / "tasks"):
                os.chown(entry, user.uid, user.uid)
        yield f"/{name}"
    finally:
        for path in made:
            for parent, dirs, _files in os.walk(path, topdown=False):
                for child in dirs:
                    os.rmdir(os.path.join(parent, child))
            path.rmdir()


@pytest.fixture
def delegated_v2(user: User) -> Iterator[Path]:
    """A cgroup v2 subtree delegated to `user` as systemd delegates user@UID.service: root
    enables memory and pids down to it, chowns the directory and its cgroup.procs,
    cgroup.threads and cgroup.subtree_control (the kernel's delegation rules), and starts the
    user's programs in a leaf below it (`User.cgroup`); all removed after."""
    if not (V1 / "cgroup.subtree_control").exists():
        pytest.skip("needs cgroup v2 alone (make test-cgroup2 boots a kernel with it)")
    slices = [V1 / "user.slice", V1 / f"user.slice/user-{user.uid}.slice"]
    service = slices[-1] / f"user@{user.uid}.service"
    leaf = service / "app.scope"
    made = []
    try:
        for path in (*slices, service, leaf):
            path.mkdir()
            made.append(path)
        for path in slices:
            (path / "cgroup.subtree_control").write_text("+memory +pids")
        for path in (service, leaf):
            for entry in ("", "cgroup.procs", "cgroup.threads", "cgroup.subtree_control"):
                os.chown(path / entry, user.uid, user.uid)
        user.cgroup = leaf
        yield service
    finally:
        user.cgroup = None
        subprocess.run(["pkill", "-KILL", "-U", str(user.uid)], check=False)
        for path in reversed(made):
            for parent, dirs, _files in os.walk(path, topdown=False):
                for child in dirs:
                    os.rmdir(os.path.join(parent, child))
            path.rmdir()


EXECUTOR = (
    "import sys\n"
    "from execbox.executor import Executor\n"
    "from execbox.errors import ExecboxError\n"
    "try:\n"
    "    Executor({args})\n"
    "except ExecboxError as exc:\n"
    "    print(type(exc).__name__, exc)\n"
)


def executor_error(user: User, args: str = "", env: dict[str, str] | None = None) -> str:
    return user.python_code(EXECUTOR.format(args=args), env)


def test_doctor_says_rootless_mode_and_that_the_namespaces_work(user: User) -> None:
    report = user.doctor()
    assert "rootless mode" in report["mode"] and report["mode"].startswith("ok")
    assert report["user namespaces"].startswith("ok")
    # What doctor claims, done for real by that user: a user namespace and the jail's others.
    done = user.run(
        "unshare", "--user", "--map-root-user", "--mount", "--pid", "--net", "--ipc", "--uts",
        "--cgroup", "--fork", "--", "true",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert report["rootless jail"].startswith("ok")


def test_doctor_and_executor_without_a_delegated_cgroup(user: User) -> None:
    report = user.doctor()
    for limit in ("memory", "pids"):
        assert report[f"limit {limit}"].startswith("FAIL"), report
        assert "NOT enforced" in report[f"limit {limit}"]
        assert "EXECBOX_CGROUP_ROOT" in report[f"limit {limit}"]
    assert report["limit wall time"].startswith("ok")
    assert "per process only" in report["limit cpu time"]
    # Doctor's "not enforced" is what the user finds: it cannot make a cgroup of its own.
    own = user.python_code(
        "print([l.split(':')[2] for l in open('/proc/self/cgroup') if ':memory:' in l][0])"
    ).strip()
    done = user.run("mkdir", f"{V1}/memory{own}/mine")
    assert done.returncode != 0 and "Permission denied" in done.stderr
    said = executor_error(user)
    assert said.startswith("SandboxUnavailable rootless mode cannot enforce the memory and pids")
    assert "allow_unenforced_limits=('memory', 'pids')" in said
    assert "--allow-unenforced-limits memory,pids" in said
    assert "EXECBOX_ALLOW_UNENFORCED_LIMITS=memory,pids" in said
    done = user.run(user.python, "-m", "execbox.cli", "run", "--server", "none", "-")
    assert done.returncode == 2 and "cannot enforce the memory and pids" in done.stderr


def test_the_opt_in_is_explicit_and_by_name(user: User) -> None:
    assert executor_error(user, "allow_unenforced_limits=('memory', 'pids')") == ""
    assert executor_error(user, env={"EXECBOX_ALLOW_UNENFORCED_LIMITS": "memory,pids"}) == ""
    # Accepting one leaves the other refused, and named alone.
    said = executor_error(user, "allow_unenforced_limits=['memory']")
    assert said.startswith("SandboxUnavailable rootless mode cannot enforce the pids limit(s)")
    said = executor_error(user, "allow_unenforced_limits='memory,pid'")
    assert said.startswith("UsageError unknown limit(s) pid")
    done = user.run(
        "sh", "-c", f"echo 'print(6 * 7)' | {user.python} -m execbox.cli run --server none "
        "--allow-unenforced-limits memory,pids -",
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout == "42\n", done.stderr
    report = user.doctor(env={"EXECBOX_ALLOW_UNENFORCED_LIMITS": "memory,pids"}, status=0)
    assert (
        report["limit memory"].startswith("warn")
        and "accepted unenforced" in report["limit memory"]
    )


def test_a_delegated_v1_cgroup_holds_memory_and_pids(user: User, delegated: str) -> None:
    env = {"EXECBOX_CGROUP_ROOT": delegated}
    report = user.doctor(env, status=0)
    for limit in ("memory", "pids"):
        assert report[f"limit {limit}"].startswith(f"ok   limit {limit}"), report
        assert f"cgroup v1 at {V1}/{limit}{delegated}" in report[f"limit {limit}"]
    assert executor_error(user, env=env) == ""
    # Doctor's "enforced", checked as that user: a run cgroup made in the delegated directory,
    # limited, and joined, stops a bounded allocation past its memory and a fourth process.
    confine = (
        "import os, sys\n"
        f"base = '{V1}/{{}}{delegated}/run'\n"
        "for c, f, v in (('memory', 'memory.limit_in_bytes', 32 << 20), ('pids', 'pids.max', 3)):\n"
        "    os.mkdir(base.format(c))\n"
        "    open(base.format(c) + '/' + f, 'w').write(str(v))\n"
        "    open(base.format(c) + '/cgroup.procs', 'w').write(str(os.getpid()))\n"
    )
    done = user.run(
        user.python, "-c", confine + "b = bytearray(96 << 20); b[::4096] = b'x' * len(b[::4096])"
    )
    assert done.returncode == -9, (done.returncode, done.stderr)  # setpriv execs: SIGKILL
    oom = (V1 / "memory" / delegated.strip("/") / "run/memory.oom_control").read_text()
    assert "oom_kill 1" in oom.splitlines()  # killed by its cgroup's limit, nothing else
    for c in ("memory", "pids"):
        (V1 / c / delegated.strip("/") / "run").rmdir()
    procs = (
        "import subprocess, time\n"
        "kids = []\n"
        "try:\n"
        "    for _ in range(4):\n"
        "        kids.append(subprocess.Popen(['sleep', '5']))\n"
        "except OSError as exc:\n"
        "    print('refused after', len(kids), exc.errno)\n"
        "for k in kids:\n"
        "    k.kill(); k.wait()\n"
    )
    out = user.python_code(confine + procs, env)
    assert out.strip() == "refused after 2 11", out  # itself and two children: pids.max 3


# Run as the user: the adapted jail proof first (the run has a pid namespace of its own, the
# one mapped uid, a user namespace that maps it to the caller alone, no capability), and the
# requested runs only once it holds; one JSON line per result.
RUNS = """
import json, os, sys
from execbox.executor import Executor
from execbox.policy import load_profiles
req = json.loads(sys.stdin.read())
profiles = load_profiles()
profiles["net"] = profiles["data"].model_copy(update={"name": "net", "network_allow": ["*:*"]})
PROOF = (
    "import os\\n"
    "caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')]\\n"
    "print(os.getpid(), os.getuid(), *open('/proc/self/uid_map').read().split(), *caps)"
)
with Executor(cache=False, allow_unenforced_limits=req["allow"], profiles=profiles) as ex:
    proof = ex.run(PROOF)
    said = proof.stdout.split()
    maps = req.get("uid_map") or [[0x70000000, os.getuid(), 1]]
    run_uid = req.get("run_uid", 0x70000000)
    want = [str(run_uid)] + [str(n) for line in maps for n in line] + ["0" * 16]
    if not proof.ok or int(said[0]) > 3 or said[1:] != want:
        print(json.dumps({"unproven": proof.model_dump(mode="json")}))
        sys.exit(0)
    for item in req["runs"]:
        if item.get("session"):
            with ex.session() as session:
                done = session.run(item["code"])
            print(json.dumps(done.model_dump(mode="json")), flush=True)
            continue
        done = ex.run(
            item["code"],
            language=item.get("language", "python"),
            limits=item.get("limits"),
            network=item.get("network", "none"),
            profile="net" if "network" in item else "data",
        )
        print(json.dumps(done.model_dump(mode="json")), flush=True)
"""


def runs(
    user: User,
    items: list[dict[str, object]],
    allow: tuple[str, ...] = ("memory", "pids"),
    env: dict[str, str] | None = None,
    proof: dict[str, object] | None = None,
) -> list[dict[str, Any]]:
    """The results of `items` ({code, language, limits}) run through an Executor as `user`,
    once the jail is proven (a failed proof fails the test: nothing hostile ran). `proof`:
    the run's uid (`run_uid`) and `uid_map` lines the proof expects, when not the default
    (the caller's uid alone, mapped to UID_FIRST)."""
    done = subprocess.run(
        [*user.become, "env", "-i"]
        + [
            f"{k}={v}"
            for k, v in (
                {
                    "PATH": "/usr/bin:/bin",
                    "HOME": str(user.home),
                    "EXECBOX_HOME": str(user.home / "execbox"),
                }
                | (env or {})
            ).items()
        ]
        + [user.python, "-c", RUNS],
        input=json.dumps({"allow": list(allow), "runs": items} | (proof or {})),
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert results and "unproven" not in results[0], results
    assert len(results) == len(items), done.stderr
    return results


def test_runs_as_an_ordinary_user_without_a_cgroup(user: User) -> None:
    ok, exits, raises, network = runs(
        user,
        [
            {"code": "import sys\nprint('out')\nprint('err', file=sys.stderr)"},
            {"code": "raise SystemExit(3)"},
            {"code": "x = 1\n1 / 0"},
            {"code": "print(1)", "network": ["example.com"]},
        ],
    )
    assert ok["status"] == "ok" and ok["stdout"] == "out\n" and ok["stderr"] == "err\n"
    assert ok["metrics"]["memory_peak_bytes"] is None  # no cgroup: unknown, not 0
    assert ok["unenforced_limits"] == ["memory_mib", "pids"], ok
    assert exits["status"] == "error" and exits["exit_code"] == 3
    assert raises["status"] == "error" and raises["error"]["type"] == "ZeroDivisionError"
    assert raises["error"]["line"] == 2
    # An allowlist cannot be served here: said, not a bare EPERM.
    assert network["status"] == "sandbox_error", network
    assert "not available in rootless mode" in network["error"]["message"], network


def test_a_run_reaches_nothing_of_the_callers(user: User) -> None:
    """Outside its namespace the run IS the caller (one mapped uid): kill(-1) must reach none
    of the caller's processes, its files none of the caller's, its sockets no host port."""
    sleeper = subprocess.Popen([*user.become, "sleep", "120"])
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        time.sleep(0.2)  # setpriv has dropped to the user and exec'd sleep
        sleeping = subprocess.run(
            ["pgrep", "-U", str(user.uid), "-x", "sleep"], capture_output=True, text=True
        ).stdout.split()
        assert len(sleeping) == 1
        killed, files, net = runs(
            user,
            [
                {
                    "code": "import os, signal, time\nchild = os.fork()\nif child == 0:\n"
                    "    time.sleep(30)\n    os._exit(0)\ntime.sleep(0.1)\n"
                    "os.kill(-1, signal.SIGKILL)\n"
                    "print('child', os.WTERMSIG(os.waitpid(child, 0)[1]), 'run alive')"
                },
                {
                    "code": f"import os\nprint(os.path.exists({str(user.home)!r}))\n"
                    f"print(sorted(os.listdir('/')))\nopen({str(user.home / 'secret.txt')!r})"
                },
                {
                    "code": "import socket\n"
                    "print([l.split(':')[0].strip() for l in open('/proc/net/dev')][2:])\n"
                    f"socket.create_connection(('127.0.0.1', {port}), timeout=2)"
                },
            ],
        )
        assert sleeper.poll() is None  # the caller's own process survived
        assert os.path.exists(f"/proc/{sleeping[0]}")
        # Control: kill(-1) did kill, within the run's own pid namespace.
        assert killed["stdout"] == f"child {int(signal.SIGKILL)} run alive\n", killed
        assert files["stdout"].splitlines()[0] == "False"
        assert files["error"]["type"] == "FileNotFoundError", files
        assert net["stdout"] == "['lo']\n"
        assert net["error"]["type"] == "ConnectionRefusedError", net
    finally:
        sleeper.kill()
        sleeper.wait()
        listener.close()


def test_a_delegated_cgroup_holds_a_runs_memory_and_pids(user: User, delegated: str) -> None:
    env = {"EXECBOX_CGROUP_ROOT": delegated}
    fork_bomb = (
        "import os, time\nkids = 0\ntry:\n    for _ in range(200):\n"
        "        if os.fork() == 0:\n            time.sleep(5)\n            os._exit(0)\n"
        "        kids += 1\nexcept OSError as exc:\n    print('refused after', kids, exc.errno)"
    )
    memory, pids, peak = runs(
        user,
        [
            {
                "code": "b = bytearray(256 << 20)\nb[::4096] = b'x' * len(b[::4096])",
                "limits": {"memory_mib": 64},
            },
            {"code": fork_bomb, "limits": {"pids": 16}},
            {"code": "b = bytearray(32 << 20)\nb[::4096] = b'x' * len(b[::4096])"},
        ],
        allow=(),
        env=env,
    )
    assert memory["status"] == "memory_limit", memory
    refused = pids["stdout"].split()
    assert refused[:2] == ["refused", "after"] and int(refused[2]) < 16, pids
    assert refused[3] == "11"  # EAGAIN: the cgroup's pids.max
    assert peak["status"] == "ok" and peak["metrics"]["memory_peak_bytes"] >= 32 << 20
    for done in (memory, pids, peak):
        assert done["unenforced_limits"] == [], done  # held: none to report


def test_results_and_records_say_which_limits_did_not_hold(user: User) -> None:
    """Accepted unenforced, memory and pids are still in `limits` (what was asked for), and
    every result, session cell and record names them in `unenforced_limits`: the limits
    doctor reports as not enforced, and no others."""
    allow = {"EXECBOX_ALLOW_UNENFORCED_LIMITS": "memory,pids"}
    report = user.doctor(env=allow, status=0)
    not_held = [
        limit
        for limit in ("memory", "pids", "cpu time", "wall time", "disk", "output", "network")
        if "NOT enforced" in report[f"limit {limit}"]
    ]
    assert not_held == ["memory", "pids"], report
    done = user.run(
        "sh", "-c", f"echo 'print(6 * 7)' | {user.python} -m execbox.cli run --server none "
        "--allow-unenforced-limits memory,pids --json -",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["stdout"] == "42\n"
    assert result["unenforced_limits"] == ["memory_mib", "pids"], result
    assert result["limits"]["memory_mib"] == 512 and result["limits"]["pids"] == 64
    shown = user.run(user.python, "-m", "execbox.cli", "runs", "show", result["run_id"])
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["result"]["unenforced_limits"] == ["memory_mib", "pids"]
    # The summary on stderr says it too, not only the JSON.
    done = user.run(
        "sh", "-c", f"echo 'print(1)' | {user.python} -m execbox.cli run --server none -",
        env=allow,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "limits NOT enforced for this run: memory_mib, pids" in done.stderr, done.stderr
    (cell,) = runs(user, [{"code": "6 * 7", "session": True}])
    assert cell["status"] == "ok" and cell["session_id"], cell
    assert cell["unenforced_limits"] == ["memory_mib", "pids"], cell


@pytest.mark.timeout(900)  # under make test-cgroup2's user-mode Linux, calls are ~200x slower
def test_a_delegated_v2_cgroup_holds_memory_and_pids(user: User, delegated_v2: Path) -> None:
    """cgroup v2 delegation as a user session has it (the guest of make test-cgroup2): found
    by itself, no setting, reported as held by doctor, and holding a run's memory and pids."""
    report = user.doctor(status=0)
    for limit in ("memory", "pids"):
        assert report[f"limit {limit}"].startswith(f"ok   limit {limit}"), report
        assert f"cgroup v2 at {delegated_v2}" in report[f"limit {limit}"], report
    assert "whole run's CPU time" in report["limit cpu time"], report
    fork_bomb = (
        "import os, time\nkids = 0\ntry:\n    for _ in range(100):\n"
        "        if os.fork() == 0:\n            time.sleep(5)\n            os._exit(0)\n"
        "        kids += 1\nexcept OSError as exc:\n    print('refused after', kids, exc.errno)"
    )
    memory, pids = runs(
        user,
        [
            {
                "code": "b = bytearray(128 << 20)\nb[::4096] = b'x' * len(b[::4096])",
                "limits": {"memory_mib": 32},
            },
            {"code": fork_bomb, "limits": {"pids": 8}},
        ],
        allow=(),
    )
    assert memory["status"] == "memory_limit", memory
    assert memory["metrics"]["memory_peak_bytes"] is not None, memory  # read from its cgroup
    refused = pids["stdout"].split()
    assert refused[:2] == ["refused", "after"] and int(refused[2]) < 8, pids
    assert refused[3] == "11"  # EAGAIN: the run cgroup's pids.max
    assert memory["unenforced_limits"] == pids["unenforced_limits"] == []
    # The runs' cgroups were made in the delegated subtree, and removed.
    assert (delegated_v2 / "execbox").is_dir()
    assert not [p for p in (delegated_v2 / "execbox").iterdir() if p.is_dir()]


@pytest.fixture
def subordinate(user: User) -> Iterator[int]:
    """A /etc/subuid and /etc/subgid range for `user` (65536 ids far above the ranges useradd
    gives), removed after; the id runs map to, its last."""
    if not (shutil.which("newuidmap") and shutil.which("newgidmap")):
        pytest.fail(
            "needs newuidmap and newgidmap: apt-get install uidmap (make test-rootless does)"
        )
    assert user.name is not None
    first = 1_500_000_000 + (os.getpid() % 1000) * 65536
    subordinate_ranges(user.name, first)
    try:
        yield first + 65535
    finally:
        subordinate_ranges(user.name, None)


def test_with_subordinate_ids_a_run_is_not_the_caller(user: User, subordinate: int) -> None:
    """With /etc/subuid and /etc/subgid ranges a run's uid and gid map to the last
    subordinate ids: outside its namespace the run is not the caller, owns none of the
    caller's files (the image it runs from included) and cannot signal the caller's
    processes even where it could name them."""
    report = user.doctor(env={"EXECBOX_ALLOW_UNENFORCED_LIMITS": "memory,pids"}, status=0)
    assert f"runs map to uid {subordinate} and gid {subordinate}" in report["subordinate ids"]
    watch = (
        "import os, sys, time\n"
        "st = os.stat(sys.executable)\n"
        "print(os.getuid(), os.getgid(), st.st_uid, os.access(sys.executable, os.W_OK))\n"
        "sys.stdout.flush()\n"
        "time.sleep(4)\n"
    )
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(
            runs,
            user,
            [{"code": watch}, {"code": "print(open('/proc/self/gid_map').read().split())"}],
            proof={
                "run_uid": RUN_UID,
                "uid_map": [[UID_FIRST, user.uid, 1], [RUN_UID, subordinate, 1]],
            },
        )
        # The host's view of the run while it sleeps: its processes' host uid and gid.
        seen: list[str] = []
        deadline = time.monotonic() + 300
        while not seen and not pending.done() and time.monotonic() < deadline:
            seen = subprocess.run(
                ["pgrep", "-U", str(subordinate)], capture_output=True, text=True
            ).stdout.split()
            time.sleep(0.05)
        watched, gids = pending.result()
    assert seen, "no process of the subordinate uid while the run slept"
    assert watched["status"] == "ok", watched
    run_uid, run_gid, owner, writable = watched["stdout"].split()
    assert (run_uid, run_gid) == (str(RUN_UID), str(RUN_UID))
    # The image the run sees is not its own (here root's, so nobody's inside; a caller's
    # image would be UID_FIRST's), nor writable.
    assert owner != run_uid and writable == "False", watched
    # setpriv gave the caller gid = its uid; the run's gid maps to the subordinate gid.
    want = [str(UID_FIRST), str(user.uid), "1", str(RUN_UID), str(subordinate), "1"]
    assert gids["stdout"].strip() == str(want), gids
    # Nothing of the runs outlives them.
    assert not subprocess.run(["pgrep", "-U", str(subordinate)], capture_output=True).stdout


def test_subordinate_ids_with_a_delegated_cgroup(
    user: User, subordinate: int, delegated: str
) -> None:
    """The run's init joins its cgroup itself, before it leaves the caller's uid: a delegated
    cgroup still holds the limits of a run whose uid is a subordinate one."""
    memory, plain = runs(
        user,
        [
            {
                "code": "b = bytearray(256 << 20)\nb[::4096] = b'x' * len(b[::4096])",
                "limits": {"memory_mib": 64},
            },
            {"code": "import os\nprint(os.getuid())"},
        ],
        allow=(),
        env={"EXECBOX_CGROUP_ROOT": delegated},
        proof={
            "run_uid": RUN_UID,
            "uid_map": [[UID_FIRST, user.uid, 1], [RUN_UID, subordinate, 1]],
        },
    )
    assert memory["status"] == "memory_limit" and memory["unenforced_limits"] == [], memory
    assert plain["stdout"] == f"{RUN_UID}\n", plain


# add_key(2) by number (libc has no wrapper): "user" key `name` in the user keyring (-4).
ADD_KEY = (
    "import ctypes, platform\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "nr = {{'x86_64': 248, 'aarch64': 217}}[platform.machine()]\n"
    "got = libc.syscall(nr, b'user', b'{name}', b'payload', 7, ctypes.c_int(-4))\n"
    "assert got > 0, ctypes.get_errno()\n"
)


def test_a_run_cannot_list_the_callers_keys(user: User) -> None:
    """/proc/keys lists every key the viewer's uid may view, and a rootless run's uid is the
    caller's: the run's /proc masks it (root mode's separate uid would see none anyway)."""
    name = "execbox-test-caller-key-name"
    user.python_code(ADD_KEY.format(name=name))  # a key in the caller's user keyring
    # Control: the caller itself lists it.
    assert name in user.run("cat", "/proc/keys").stdout
    (listed,) = runs(
        user,
        [{"code": "import os\nfor f in ('keys', 'key-users'):\n"
                  "    if os.path.exists('/proc/' + f):\n"
                  "        print(open('/proc/' + f).read())"}],
    )  # fmt: skip
    assert listed["status"] == "ok", listed
    assert name not in listed["stdout"], listed["stdout"]
    assert listed["stdout"] == "\n\n"  # both there, and empty: masked, not missing
