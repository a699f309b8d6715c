"""The capabilities the sandbox's set-up uses, which of them this process lacks, and how to
grant them. Root in a container or after `capsh --drop` is root without some of them: the
kernel is fine, the privilege is missing, and the user needs to hear exactly that."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capability:
    number: int
    name: str  # as docker's and podman's --cap-add spell it, without CAP_
    used_for: str

    def __str__(self) -> str:
        return f"CAP_{self.name}"


# Each one is called for by the set-up (jail.py, native/*.c, the zygotes); a run fails without
# any of them (each was dropped in turn and a run tried). Others root holds are not needed.
REQUIRED = (
    Capability(21, "SYS_ADMIN", "namespaces, mounts, pivot_root and seccomp filters"),
    Capability(12, "NET_ADMIN", "bringing up loopback in the run's network namespace"),
    Capability(19, "SYS_PTRACE", "joining the namespaces of a slot's processes"),
    Capability(18, "SYS_CHROOT", "entering a slot's mount namespace"),
    Capability(8, "SETPCAP", "emptying the bounding set and locking the securebits"),
    Capability(7, "SETUID", "switching the run to its unprivileged uid"),
    Capability(6, "SETGID", "switching the run to its unprivileged gid, without groups"),
    Capability(5, "KILL", "killing the run's processes, which run under another uid"),
)


def _status_masks() -> dict[str, int]:
    masks = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("CapEff", "CapBnd"):
                masks[key] = int(value, 16)
    return masks


def missing() -> list[Capability]:
    """The required capabilities not in this process's effective set."""
    effective = _status_masks()["CapEff"]
    return [cap for cap in REQUIRED if not effective >> cap.number & 1]


def how_to_grant(caps: list[Capability]) -> str:
    """What to do about `caps` missing: grants for a container, or a start that keeps them."""
    bounding = _status_masks()["CapBnd"]
    adds = " ".join(f"--cap-add {cap.name}" for cap in caps)
    if all(bounding >> cap.number & 1 for cap in caps):
        # Still in the bounding set: this process was started without them (capsh, setpriv,
        # a service manager's CapabilityBoundingSet/AmbientCapabilities), not its container.
        return (
            "start execbox as root without dropping them (no capsh --drop, setpriv "
            "--inh-caps/--bounding-set, or systemd CapabilityBoundingSet that removes them)"
        )
    return (
        f"grant them to the container: docker run {adds} (podman run takes the same "
        "flags; Kubernetes: securityContext.capabilities.add), or run it --privileged"
    )


def user_namespace() -> str | None:
    """How this process's user namespace maps uids, when it is not the host's own."""
    try:
        with open("/proc/self/uid_map") as fh:
            ranges = [line.split() for line in fh if line.strip()]
    except OSError:
        return None
    if ranges == [["0", "0", "4294967295"]]:
        return None
    return ", ".join(
        f"uids {inside}-{int(inside) + int(count) - 1} are host uids "
        f"{outside}-{int(outside) + int(count) - 1}"
        for inside, outside, count in ranges
    )


def summary(caps: list[Capability]) -> str:
    """`caps` named, each with what the sandbox needs it for."""
    return "; ".join(f"{cap} ({cap.used_for})" for cap in caps)


def not_host_root() -> str | None:
    """Why root here cannot be the sandbox's root when it is root of a user namespace."""
    mapping = user_namespace()
    if mapping is None:
        return None
    return (
        f"root here is root of a user namespace ({mapping}), not the host's: the sandbox "
        "joins the host's pid namespace and works in its cgroups, which that root cannot"
    )


def unavailable_reason() -> str | None:
    """Why this process cannot run the sandbox, for lack of privilege; None when it can."""
    problem = not_host_root()
    if problem:
        return (
            f"{problem}; run execbox as the host's root, or in a container without a user "
            "namespace of its own"
        )
    try:
        lacking = missing()
    except OSError:  # no /proc: not Linux, which the set-up reports in its own words
        return None
    if lacking:
        return (
            f"root here lacks capabilities the sandbox needs: {summary(lacking)}; "
            f"{how_to_grant(lacking)}"
        )
    return None
