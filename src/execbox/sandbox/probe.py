"""What this host can enforce, what is missing, and how to fix it (`execbox doctor`)."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


def _try(name: str, fn: Callable[[], str], fix: str, required: bool = True) -> Check:
    try:
        return Check(name, True, fn(), required=required)
    except Exception as exc:  # noqa: BLE001 - every failure is a finding
        return Check(name, False, str(exc) or type(exc).__name__, fix, required)


def _in_fork(step: Callable[[], object], failed: str) -> None:
    """Run `step` in a fork (what it changes stays there); OSError(`failed`) when it raised."""
    pid = os.fork()
    if pid == 0:
        try:
            step()
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise OSError(failed)


def _namespaces() -> str:
    from . import _linux

    def step() -> None:
        _linux.unshare(_linux.CLONE_NEWNS | _linux.CLONE_NEWPID | _linux.CLONE_NEWNET
                       | _linux.CLONE_NEWIPC | _linux.CLONE_NEWUTS | _linux.CLONE_NEWCGROUP)
        _linux.mount("none", "/", None, _linux.MS_REC | _linux.MS_PRIVATE)

    _in_fork(step, "unshare(mount, pid, net, ipc, uts, cgroup) or a private mount failed")
    return "mount, pid, net, ipc, uts and cgroup namespaces"


def _cgroups() -> str:
    from .cgroup import Hierarchy

    h = Hierarchy.discover()
    swap = "memory+swap limited" if h.has_swap else "swap accounting off (RAM limit only)"
    return f"cgroup v{h.version} at {', '.join(sorted(h.parent_paths.values()))}; {swap}"


def _seccomp() -> str:
    from .seccomp import compile_filter

    with open("/proc/self/status") as fh:
        if "Seccomp:" not in fh.read():
            raise OSError("the kernel has no seccomp support")
    return f"libseccomp filter compiles ({len(compile_filter()) // 8} BPF instructions)"


def _pidfd() -> str:
    """Programs join init's namespaces through a pidfd of init, in one setns (Linux 5.8): a
    fork joins ours that way (its own already: nothing changes)."""
    from . import _linux

    def step() -> None:
        fd = os.pidfd_open(os.getppid())
        _linux.setns(fd, _linux.CLONE_NEWUTS | _linux.CLONE_NEWIPC | _linux.CLONE_NEWNET)

    _in_fork(step, "pidfd_open, or setns with a pidfd, failed")
    return "pidfd_open and setns with a pidfd work"


def _protected_hardlinks() -> str:
    """The session files API works as root inside a workspace the code controls; with
    protected hardlinks the code cannot link in files it does not own for root to act on."""
    with open("/proc/sys/fs/protected_hardlinks") as fh:
        value = fh.read().strip()
    if value == "0":
        raise OSError("fs.protected_hardlinks is 0")
    return f"fs.protected_hardlinks={value}"


def _image() -> str:
    from ..image import Image

    image = Image.load()
    if not image.python.exists():
        raise OSError(f"the image at {image.root} has no interpreter")
    return f"{image.digest[:19]}… python {image.python_version} at {image.root}"


def run_checks() -> list[Check]:
    checks = [
        Check("linux", platform.system() == "Linux", platform.platform(),
              "the default tier needs Linux; use a Linux host or VM"),
        Check("root", os.geteuid() == 0, f"euid {os.geteuid()}",
              "run execbox as root (it creates namespaces, mounts and cgroups)"),
        Check("python", sys.version_info >= (3, 11), sys.version.split()[0], "use Python 3.11+"),
    ]
    if not all(c.ok for c in checks):
        return checks
    checks += [
        _try("namespaces", _namespaces, "enable user/mount/pid/net namespaces in the kernel"),
        _try("cgroups", _cgroups,
             "mount cgroup v2 with memory and pids controllers, or cgroup v1 memory and pids"),
        _try("seccomp", _seccomp, "install libseccomp2 (apt-get install libseccomp2)"),
        _try("pidfd", _pidfd, "use Linux 5.8 or newer"),
        _try("hardlink protection", _protected_hardlinks,
             "sysctl -w fs.protected_hardlinks=1 (session file calls rely on it)",
             required=False),
        _try("runtime image", _image, "run `execbox image build`"),
    ]
    return checks
