"""Rootless mode as a real ordinary user: the test (as root) makes a throwaway user with
useradd, runs execbox as that user with runuser, and removes the user after. What `execbox
doctor` reports must match what that user can really do: make the jail's namespaces, and,
only with a cgroup v1 directory an administrator chowned to it, hold memory and pids limits.
Without one the executor is refused, naming what is missing and the explicit opt-in."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import execbox

pytestmark = [
    pytest.mark.rootless,
    pytest.mark.skipif(os.geteuid() != 0, reason="makes a user and cgroup directories: root"),
    pytest.mark.skipif(
        not (shutil.which("useradd") and shutil.which("runuser")), reason="needs useradd, runuser"
    ),
]

SRC = Path(execbox.__file__).resolve().parent.parent
V1 = Path("/sys/fs/cgroup")


@dataclass
class User:
    name: str
    uid: int
    home: Path
    python: str

    def run(
        self, *argv: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        base = {
            "PATH": "/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": str(self.home),
            "EXECBOX_HOME": str(self.home / "execbox"),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        return subprocess.run(
            ["runuser", "-u", self.name, "--", "env", "-i"]
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

    def doctor(self, env: dict[str, str] | None = None) -> dict[str, str]:
        """`execbox doctor` as this user: each check's line by its name."""
        done = self.run(self.python, "-m", "execbox.cli", "doctor", env=env)
        assert done.returncode == 2, done.stdout + done.stderr  # the jail is not landed yet
        lines = {}
        for line in done.stdout.splitlines():
            mark, _, rest = line.partition(" ")
            if mark in ("ok", "FAIL", "warn"):
                name = next(
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
                )
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
    subprocess.run(["useradd", "--no-create-home", "--home-dir", "/nonexistent", name], check=True)
    try:
        uid = int(subprocess.run(["id", "-u", name], capture_output=True, check=True).stdout)
        home = base / "home"
        home.mkdir(mode=0o700)
        (home / "secret.txt").write_text("the caller's own file\n")
        os.chown(home, uid, uid)
        os.chown(home / "secret.txt", uid, uid)
        subprocess.run(["chmod", "-R", "a+rX", str(venv)], check=True)
        found = User(name, uid, home, str(venv / "bin/python"))
        assert found.python_code("import os; print(os.geteuid())").strip() == str(uid)
        assert readable_tree(found), "the user cannot import execbox from its copy"
        yield found
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], check=False)
        subprocess.run(["userdel", name], check=True)
        shutil.rmtree(base)


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
            for child in sorted(p for p in path.iterdir() if p.is_dir()):
                child.rmdir()
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
    assert report["rootless jail"].startswith("FAIL")  # said, not hidden


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
    past = "SandboxUnavailable rootless mode: runs as an ordinary user are not in this release"
    assert executor_error(user, "allow_unenforced_limits=('memory', 'pids')").startswith(past)
    assert executor_error(user, env={"EXECBOX_ALLOW_UNENFORCED_LIMITS": "memory,pids"}).startswith(
        past
    )
    # Accepting one leaves the other refused, and named alone.
    said = executor_error(user, "allow_unenforced_limits=['memory']")
    assert said.startswith("SandboxUnavailable rootless mode cannot enforce the pids limit(s)")
    said = executor_error(user, "allow_unenforced_limits='memory,pid'")
    assert said.startswith("UsageError unknown limit(s) pid")
    done = user.run(
        user.python, "-m", "execbox.cli", "run", "--server", "none",
        "--allow-unenforced-limits", "memory,pids", "-",
    )  # fmt: skip
    assert done.returncode == 2 and "not in this release" in done.stderr, done.stderr
    report = user.doctor(env={"EXECBOX_ALLOW_UNENFORCED_LIMITS": "memory,pids"})
    assert (
        report["limit memory"].startswith("warn")
        and "accepted unenforced" in report["limit memory"]
    )


def test_a_delegated_v1_cgroup_holds_memory_and_pids(user: User, delegated: str) -> None:
    env = {"EXECBOX_CGROUP_ROOT": delegated}
    report = user.doctor(env)
    for limit in ("memory", "pids"):
        assert report[f"limit {limit}"].startswith(f"ok   limit {limit}"), report
        assert f"cgroup v1 at {V1}/{limit}{delegated}" in report[f"limit {limit}"]
    assert executor_error(user, env=env).startswith(
        "SandboxUnavailable rootless mode: runs as an ordinary user are not in this release"
    )
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
    assert done.returncode == 128 + 9, (done.returncode, done.stderr)  # runuser's SIGKILL
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
