"""Rootless mode: execbox as an ordinary user (no root, no capabilities).

A user namespace the caller makes stands in for root: inside it the mount, pid, net, ipc, uts
and cgroup namespaces, the pivot root, the seccomp allow list, no_new_privs and rlimits are
the same calls as in root mode. What an ordinary user cannot make is a cgroup: memory and
pids limits hold only in a cgroup delegated to the user (cgroup v2 as systemd's user session
delegates `user@UID.service`, or v1 `memory` and `pids` directories an administrator chowned
to the user), named by EXECBOX_CGROUP_ROOT. Without one, a run is refused unless the caller
accepts those limits unenforced, by name (`Executor(allow_unenforced_limits=...)`,
`--allow-unenforced-limits`, EXECBOX_ALLOW_UNENFORCED_LIMITS): never a silent fallback.

Uids: with subordinate ranges (/etc/subuid and /etc/subgid, newuidmap and newgidmap) every
run's uid and gid map to the last subordinate uid and gid, not the caller's (the zygotes
keep the caller's, to read the image and make run cgroups): a file or process of the caller's
the run could reach it does not own, and what it writes in a bound path the caller owns not.
With no range only the caller's uid maps: the run IS the caller outside the namespace, and
what keeps it from the caller's processes and files is the pid namespace (it sees and signals
only its own), the mount namespace (no host path but /usr and the read-only image) and the
seccomp filter (no ptrace, no namespace or mount calls). That is the threat-model difference
from root mode, where the run's uid owns nothing on the host.
"""

from __future__ import annotations

import os
import pwd
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

CGROUP_ROOT_ENV = "EXECBOX_CGROUP_ROOT"
ALLOW_ENV = "EXECBOX_ALLOW_UNENFORCED_LIMITS"
CGROUP_LIMITS = ("memory", "pids")  # the limits only a cgroup enforces for a whole run
CLONE_NEWUSER = 0x10000000
SUBUID = "/etc/subuid"
SUBGID = "/etc/subgid"


def is_rootless() -> bool:
    return os.geteuid() != 0


def parse_allowed(value: str | Iterable[str] | None) -> frozenset[str]:
    """The limits a caller accepts unenforced, from "memory,pids" or a sequence of names;
    ValueError names an unknown one (a typo must not pass for consent)."""
    if value is None:
        return frozenset()
    names = value.split(",") if isinstance(value, str) else list(value)
    allowed = frozenset(n.strip() for n in names if n.strip())
    unknown = sorted(allowed - set(CGROUP_LIMITS))
    if unknown:
        raise ValueError(
            f"unknown limit(s) {', '.join(unknown)} in allow_unenforced_limits: "
            f"only {', '.join(CGROUP_LIMITS)} can go unenforced"
        )
    return allowed


@dataclass
class Delegation:
    """The cgroup directories this user may manage, per controller, and why others are not."""

    setting: str | None  # EXECBOX_CGROUP_ROOT as given
    version: int | None = None
    paths: dict[str, str] = field(default_factory=dict)  # limit -> its cgroup directory
    missing: dict[str, str] = field(default_factory=dict)  # limit -> why it is not delegated

    def holds(self, limit: str) -> bool:
        return limit in self.paths


def _cgroup_mounts() -> dict[str, str]:
    """Controller ("" for the v2 hierarchy) -> its mount point."""
    found: dict[str, str] = {}
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fstype, _source, opts = (right.split() + ["", "", ""])[:3]
            point = left.split()[4]
            if fstype == "cgroup2":
                found.setdefault("", point)
            elif fstype == "cgroup":
                for opt in opts.split(","):
                    if opt in CGROUP_LIMITS:
                        found[opt] = point
    return found


def _own_cgroup(controller: str) -> str:
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _hid, controllers, path = line.rstrip("\n").split(":", 2)
            if controller in (controllers.split(",") if controllers else [""]):
                return path
    return "/"


def _manageable(path: str) -> str | None:
    """Why this user cannot make run cgroups in `path` and move processes into them, or None."""
    if not os.path.isdir(path):
        return f"{path} does not exist"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{path} is not writable by uid {os.geteuid()}"
    procs = os.path.join(path, "cgroup.procs")
    if not os.access(procs, os.W_OK):
        return f"{procs} is not writable by uid {os.geteuid()}"
    return None


def _v2_delegated(mount: str, setting: str | None) -> tuple[str | None, str]:
    """(the delegated v2 directory, or None; why not): the one named, else the highest
    ancestor of our own cgroup this user owns (a systemd user session's user@UID.service)."""
    if setting is not None:
        path = mount + "/" + setting.strip("/")
    else:
        parts = [p for p in _own_cgroup("").split("/") if p]
        path = ""
        for depth in range(1, len(parts) + 1):
            candidate = mount + "/" + "/".join(parts[:depth])
            try:
                owner = os.stat(candidate).st_uid
            except OSError:  # our cgroup namespace's root is not the mount's
                break
            if owner == os.geteuid():
                path = candidate
                break
        if not path:
            return None, (
                f"no cgroup of this process is owned by uid {os.geteuid()} (no delegation: "
                f"log in through a systemd user session, or set {CGROUP_ROOT_ENV})"
            )
    why = _manageable(path)
    if why:
        return None, why
    if not os.access(os.path.join(path, "cgroup.subtree_control"), os.W_OK):
        return None, f"{path}/cgroup.subtree_control is not writable by uid {os.geteuid()}"
    return path, ""


def delegated_cgroup(env: Mapping[str, str] | None = None) -> Delegation:
    """Which of memory and pids a cgroup delegated to this user can enforce."""
    env = os.environ if env is None else env
    setting = env.get(CGROUP_ROOT_ENV) or None
    found = Delegation(setting)
    mounts = _cgroup_mounts()
    v1 = {c: mounts[c] for c in CGROUP_LIMITS if c in mounts}
    if v1:
        found.version = 1
        for limit in CGROUP_LIMITS:
            if limit not in v1:
                found.missing[limit] = f"no cgroup v1 {limit} hierarchy is mounted"
            elif setting is None:
                found.missing[limit] = (
                    f"no delegated cgroup: {CGROUP_ROOT_ENV} is not set (an administrator "
                    f"makes {v1[limit]}/NAME, chowns it to uid {os.geteuid()}, and you set "
                    f"{CGROUP_ROOT_ENV}=/NAME)"
                )
            else:
                path = v1[limit] + "/" + setting.strip("/")
                why = _manageable(path)
                if why:
                    found.missing[limit] = why
                else:
                    found.paths[limit] = path
        return found
    if "" in mounts:
        found.version = 2
        v2_path, why = _v2_delegated(mounts[""], setting)
        if v2_path is None:
            found.missing = dict.fromkeys(CGROUP_LIMITS, why)
            return found
        path = v2_path
        with open(os.path.join(path, "cgroup.controllers")) as fh:
            available = fh.read().split()
        for limit in CGROUP_LIMITS:
            if limit in available:
                found.paths[limit] = path
            else:
                found.missing[limit] = f"the {limit} controller is not delegated to {path}"
        return found
    found.missing = dict.fromkeys(CGROUP_LIMITS, "no cgroup hierarchy is mounted")
    return found


def refusal(delegation: Delegation, allowed: frozenset[str]) -> str | None:
    """Why runs are refused here (limits no cgroup enforces, not accepted unenforced)."""
    unenforced = [limit for limit in CGROUP_LIMITS if not delegation.holds(limit)]
    refused = [limit for limit in unenforced if limit not in allowed]
    if not refused:
        return None
    causes = "; ".join(f"{limit}: {delegation.missing[limit]}" for limit in refused)
    names = ",".join(unenforced)
    return (
        f"rootless mode cannot enforce the {' and '.join(refused)} limit(s) of a run ({causes}). "
        f"Delegate a cgroup and set {CGROUP_ROOT_ENV}, or accept running without them: "
        f"Executor(allow_unenforced_limits={tuple(unenforced)!r}), "
        f"`execbox run --allow-unenforced-limits {names}` or {ALLOW_ENV}={names}"
    )


def user_namespaces() -> str:
    """Whether this user can make a user namespace and, inside it, the jail's namespaces and
    a private mount tree (tried in a fork); OSError says what stops it and where."""
    from ..inside import linux
    from .probe import enter_jail_namespaces, in_fork

    for knob, off in (
        ("/proc/sys/kernel/unprivileged_userns_clone", "0"),
        ("/proc/sys/user/max_user_namespaces", "0"),
        ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1"),
    ):
        try:
            with open(knob) as fh:
                value = fh.read().strip()
        except OSError:
            continue
        if value == off:
            name = knob.removeprefix("/proc/sys/").replace("/", ".")
            raise OSError(f"{name} is {value}: unprivileged user namespaces are disabled")
    uid, gid = os.geteuid(), os.getegid()

    def step() -> None:
        linux.unshare(CLONE_NEWUSER)
        for name, value in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1")):
            with open(f"/proc/self/{name}", "w") as fh:
                fh.write(value)
        with open("/proc/self/gid_map", "w") as fh:
            fh.write(f"0 {gid} 1")
        enter_jail_namespaces()

    in_fork(step, "a user namespace, or the jail's namespaces inside it, failed")
    return "a user namespace, and in it mount, pid, net, ipc, uts and cgroup namespaces"


def _first_range(path: str, uid: int) -> tuple[int, int] | None:
    """This user's first range in /etc/subuid or /etc/subgid (by name or uid): (first, count)."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = ""
    try:
        with open(path) as fh:
            for line in fh:
                owner, _, rest = line.strip().partition(":")
                first, _, count = rest.partition(":")
                if owner in (name, str(uid)) and first.isdigit() and count.isdigit():
                    if int(count) > 0:
                        return int(first), int(count)
    except OSError:
        return None
    return None


@dataclass(frozen=True)
class Subordinate:
    """The host ids a rootless run's uid and gid map to: the last of the user's subordinate
    ranges, mapped by newuidmap and newgidmap (setuid root, they check /etc/subuid and
    /etc/subgid), so that the run is not the caller outside its namespace. The last, not the
    first: rootless podman maps a container's uid 1 (daemon) to the first."""

    uid: int
    gid: int
    newuidmap: str
    newgidmap: str


def subordinate() -> Subordinate | None:
    """The ids runs map to, when this user has both a /etc/subuid and a /etc/subgid range and
    newuidmap and newgidmap are installed (Debian's `uidmap`); None: the caller's own."""
    tools = shutil.which("newuidmap"), shutil.which("newgidmap")
    uids = _first_range(SUBUID, os.geteuid())
    gids = _first_range(SUBGID, os.geteuid())
    if tools[0] is None or tools[1] is None or uids is None or gids is None:
        return None
    last_uid, last_gid = uids[0] + uids[1] - 1, gids[0] + gids[1] - 1
    return Subordinate(last_uid, last_gid, tools[0], tools[1])


def limits(delegation: Delegation) -> list[tuple[str, bool, str]]:
    """(limit, holds, how or why not) for every limit of a run, in rootless mode."""
    rows = []
    for limit in CGROUP_LIMITS:
        if delegation.holds(limit):
            rows.append((limit, True, f"cgroup v{delegation.version} at {delegation.paths[limit]}"))
        else:
            rows.append((limit, False, "NOT enforced: " + delegation.missing[limit]))
    # v1 counts CPU time in cpuacct, which the delegation named here does not cover.
    cpu = (
        "RLIMIT_CPU per process; the whole run's CPU time from the delegated cgroup's cpu.stat"
        if delegation.version == 2 and delegation.holds("memory")
        else "RLIMIT_CPU per process only (no delegated cgroup counts the whole run's CPU time)"
    )
    rows += [
        ("cpu time", True, cpu),
        ("wall time", True, "the supervisor kills the run's pid namespace"),
        ("disk", True, "tmpfs sizes in the run's mount namespace, RLIMIT_FSIZE"),
        ("output", True, "counted and cut by the supervisor"),
        ("network", True, "a network namespace of its own with loopback only"),
    ]
    return rows


NPROC_NOTE = (
    "RLIMIT_NPROC is not a substitute for pids: it counts every process of the run's host "
    "uid, which with one mapped uid is the caller's own processes too"
)
