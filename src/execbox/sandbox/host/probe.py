"""What this host can enforce, what is missing, and how to fix it (`execbox doctor`)."""

from __future__ import annotations

import errno
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass

from . import capabilities, rootless


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


def in_fork(step: Callable[[], object], failed: str) -> None:
    """Run `step` in a fork (what it changes stays there); OSError with the errno of the call
    that failed (and `failed` as its text), so the finding is worded from its real cause."""
    pid = os.fork()
    if pid == 0:
        try:
            step()
            os._exit(0)
        except OSError as exc:
            os._exit(exc.errno if exc.errno and 0 < exc.errno < 255 else 255)
        except BaseException:  # noqa: BLE001
            os._exit(255)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 255 or code < 0:
        raise OSError(failed)
    if code != 0:
        raise OSError(code, f"{failed}: {errno.errorcode.get(code, code)} ({os.strerror(code)})")


def _cause(exc: BaseException, kernel_fix: str, what: str) -> str:
    """The fix for a failed privileged call, from its errno: a missing privilege (EPERM,
    EACCES), something the kernel lacks (ENOSYS, EINVAL), or else the error itself."""
    code = exc.errno if isinstance(exc, OSError) else None
    if code in (errno.EPERM, errno.EACCES):
        lacking = capabilities.missing()
        if lacking:
            return (
                f"not the kernel: this process lacks {', '.join(map(str, lacking))} "
                "(see capabilities)"
            )
        if capabilities.user_namespace():
            return "not the kernel: root here is root of a user namespace (see user namespace)"
        return (
            f"not the kernel: {what} was refused although the capabilities are held, so a "
            "seccomp or LSM profile refuses it; in a container: --security-opt "
            "seccomp=unconfined --security-opt apparmor=unconfined (or --privileged)"
        )
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return kernel_fix
    return f"{what} failed for another reason than privilege or kernel support: see the error"


def _checked(name: str, fn: Callable[[], str], kernel_fix: str, what: str) -> Check:
    """`_try` for a privileged call: its fix is worded from the errno it failed with."""
    try:
        return Check(name, True, fn())
    except Exception as exc:  # noqa: BLE001 - every failure is a finding
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return Check(name, False, detail or type(exc).__name__, _cause(exc, kernel_fix, what))


def _capabilities() -> str:
    lacking = capabilities.missing()
    if lacking:
        raise OSError(f"missing {capabilities.summary(lacking)}")
    return "held: " + ", ".join(str(cap) for cap in capabilities.REQUIRED)


def _user_namespace() -> str:
    problem = capabilities.not_host_root()
    if problem:
        raise OSError(problem)
    return "the host's own (uid 0 is the host's root)"


def enter_jail_namespaces() -> None:
    """Unshare the namespaces a run's jail has, and make its mounts private (in a fork)."""
    from ..inside import linux

    linux.unshare(
        linux.CLONE_NEWNS
        | linux.CLONE_NEWPID
        | linux.CLONE_NEWNET
        | linux.CLONE_NEWIPC
        | linux.CLONE_NEWUTS
        | linux.CLONE_NEWCGROUP
    )
    linux.mount("none", "/", None, linux.MS_REC | linux.MS_PRIVATE)


def _namespaces() -> str:
    in_fork(
        enter_jail_namespaces,
        "unshare(mount, pid, net, ipc, uts, cgroup) or a private mount failed",
    )
    return "mount, pid, net, ipc, uts and cgroup namespaces"


def _cgroups() -> str:
    from ..inside.cgroup import Hierarchy

    h = Hierarchy.discover()
    swap = "memory+swap limited" if h.has_swap else "swap accounting off (RAM limit only)"
    return f"cgroup v{h.version} at {', '.join(sorted(h.parent_paths.values()))}; {swap}"


def _seccomp() -> str:
    from ..inside.seccomp import compile_filter

    with open("/proc/self/status") as fh:
        if "Seccomp:" not in fh.read():
            raise OSError("the kernel has no seccomp support")
    return f"libseccomp filter compiles ({len(compile_filter()) // 8} BPF instructions)"


def _pidfd() -> str:
    """Programs join init's namespaces through a pidfd of init, in one setns (Linux 5.8): a
    fork joins ours that way (its own already: nothing changes)."""
    from ..inside import linux

    def step() -> None:
        fd = os.pidfd_open(os.getppid())
        linux.setns(fd, linux.CLONE_NEWUTS | linux.CLONE_NEWIPC | linux.CLONE_NEWNET)

    in_fork(step, "pidfd_open, or setns with a pidfd, failed")
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
    from ...image import Image

    image = Image.load()
    if not image.python.exists():
        raise OSError(f"the image at {image.root} has no interpreter")
    return f"{image.digest[:19]}… python {image.python_version} at {image.root}"


def run_checks() -> list[Check]:
    checks = [
        Check(
            "linux",
            platform.system() == "Linux",
            platform.platform(),
            "the default tier needs Linux; use a Linux host or VM",
        ),
        Check("python", sys.version_info >= (3, 11), sys.version.split()[0], "use Python 3.11+"),
    ]
    if not all(c.ok for c in checks):
        return checks
    if rootless.is_rootless():
        return checks + rootless_checks()
    checks.insert(1, Check("root", True, "euid 0"))
    checks += [
        _try("capabilities", _capabilities, capabilities.how_to_grant(capabilities.missing())),
        _try(
            "user namespace",
            _user_namespace,
            "run execbox as the host's root, or in a container that is not in a user "
            "namespace of its own (docker/podman without --userns, not rootless)",
        ),
        _checked(
            "namespaces",
            _namespaces,
            "enable mount, pid, net, ipc, uts and cgroup namespaces in the kernel "
            "(CONFIG_NAMESPACES and its *_NS options)",
            "unshare or mount",
        ),
        _try(
            "cgroups",
            _cgroups,
            "mount cgroup v2 with memory and pids controllers, or cgroup v1 memory and pids",
        ),
        _try("seccomp", _seccomp, "install libseccomp2 (apt-get install libseccomp2)"),
        _checked("pidfd", _pidfd, "use Linux 5.8 or newer (setns with a pidfd)", "setns"),
        _try(
            "hardlink protection",
            _protected_hardlinks,
            "sysctl -w fs.protected_hardlinks=1 (session file calls rely on it)",
            required=False,
        ),
        _try("runtime image", _image, "run `execbox image build`"),
    ]
    return checks


def rootless_checks() -> list[Check]:
    """An ordinary user's host: what rootless mode needs, and exactly which limits hold."""
    allowed = rootless.parse_allowed(os.environ.get(rootless.ALLOW_ENV))
    delegation = rootless.delegated_cgroup()
    sub = rootless.subordinate()
    checks = [
        Check(
            "mode",
            True,
            f"rootless mode (euid {os.geteuid()}): a user namespace stands in for root",
        ),
        _try(
            "user namespaces",
            rootless.user_namespaces,
            "allow unprivileged user namespaces (sysctl user.max_user_namespaces=N > 0; "
            "Debian kernel.unprivileged_userns_clone=1; Ubuntu "
            "kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile)",
        ),
        Check(
            "subordinate ids",
            True,
            (
                f"runs map to uid {sub.uid} and gid {sub.gid} (the last of your /etc/subuid "
                "and /etc/subgid ranges, by newuidmap and newgidmap): outside its namespace "
                "a run is not you and owns none of your files"
                if sub
                else "none (no /etc/subuid and /etc/subgid range, or no newuidmap and "
                "newgidmap: Debian's uidmap): a run's uid maps to yours, so outside its "
                "namespace it is you (pid and mount namespaces and seccomp keep it from your "
                "processes and files)"
            ),
            required=False,
        ),
    ]
    for limit, holds, how in rootless.limits(delegation):
        accepted = limit in allowed
        checks.append(
            Check(
                f"limit {limit}",
                holds,
                how + (f" (accepted unenforced by {rootless.ALLOW_ENV})" if accepted else ""),
                f"delegate a cgroup and set {rootless.CGROUP_ROOT_ENV}, or accept it "
                f"unenforced: --allow-unenforced-limits {limit}",
                required=not accepted,
            )
        )
    checks += [
        _try("seccomp", _seccomp, "install libseccomp2 (apt-get install libseccomp2)"),
        Check(
            "rootless jail",
            True,
            "the zygotes in a user namespace of their own (as your uid there) and a pid "
            "namespace of theirs; the image's tree bound read-only, a private /run",
        ),
    ]
    return checks
