"""`execbox doctor` and the executor in hosts that cannot sandbox for lack of privilege: root
without some capabilities (as in a container) and root of a user namespace. Each is made for
real in a child process; the diagnosis must name the cause and never blame the kernel."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Callable, Sequence

import pytest

from execbox.sandbox.host import capabilities, probe
from execbox.sandbox.inside import linux

EXECBOX = [sys.executable, "-m", "execbox.cli"]
REQUIRED = [cap.number for cap in capabilities.REQUIRED]


def _privileged_host() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    return capabilities.unavailable_reason()


pytestmark = pytest.mark.skipif(
    _privileged_host() is not None, reason=f"needs full root: {_privileged_host()}"
)


def _without(caps: Sequence[int]) -> Callable[[], None]:
    """A preexec_fn: drop `caps` from the bounding set, so the exec'd root never holds them
    (what `capsh --drop` and a container's missing --cap-add do)."""

    def drop() -> None:
        for cap in caps:
            linux.prctl(linux.PR_CAPBSET_DROP, cap)

    return drop


def _in_user_namespace() -> None:
    """A preexec_fn: become root of a new user namespace mapped to the host's root only (what
    `unshare --user --map-root-user` does)."""
    uid, gid = os.getuid(), os.getgid()
    linux.unshare(0x10000000)  # CLONE_NEWUSER
    with open("/proc/self/setgroups", "w") as fh:
        fh.write("deny")
    with open("/proc/self/uid_map", "w") as fh:
        fh.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as fh:
        fh.write(f"0 {gid} 1")


def cli(
    *args: str,
    preexec: Callable[[], None],
    stdin: bytes = b"",
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EXECBOX, *args],
        input=stdin.decode(),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=preexec,
    )


def _line(out: str, check: str) -> tuple[str, str]:
    """The line of `check` and its fix line (empty when there is none)."""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line[5:].startswith(check):
            fix = lines[i + 1] if i + 1 < len(lines) and "fix:" in lines[i + 1] else ""
            return line, fix
    raise AssertionError(f"no {check!r} line in:\n{out}")


def _blames_the_kernel(out: str) -> bool:
    text = out.replace("not the kernel", "")
    return "Linux 5.8" in text or "in the kernel" in text or "CONFIG_" in text


@pytest.mark.parametrize("cap", capabilities.REQUIRED, ids=str)
def test_doctor_names_the_missing_capability_and_not_the_kernel(
    cap: capabilities.Capability,
) -> None:
    proc = cli("doctor", preexec=_without([cap.number]))
    assert proc.returncode == 2, proc.stdout
    line, fix = _line(proc.stdout, "capabilities")
    assert line.startswith("FAIL") and str(cap) in line
    assert [c for c in capabilities.REQUIRED if str(c) in line] == [cap]  # that one only
    assert f"--cap-add {cap.name}" in fix or "without dropping" in fix
    assert not _blames_the_kernel(proc.stdout), proc.stdout


def test_doctor_words_each_failure_from_its_errno_in_an_unprivileged_container() -> None:
    # Docker's default set lacks these three: every probe that needs them fails with EPERM.
    dropped = [21, 12, 19]
    proc = cli("doctor", preexec=_without(dropped))
    assert proc.returncode == 2
    line, fix = _line(proc.stdout, "capabilities")
    for name in ("CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SYS_PTRACE"):
        assert name in line
    for check in ("namespaces", "pidfd"):
        line, fix = _line(proc.stdout, check)
        assert line.startswith("FAIL") and "EPERM" in line
        assert "not the kernel" in fix and "CAP_SYS_ADMIN" in fix
    assert not _blames_the_kernel(proc.stdout), proc.stdout


def test_run_without_a_capability_is_sandbox_unavailable_naming_it() -> None:
    # Without CAP_SETPCAP a run used to fail with a bare "prctl(24): Operation not permitted".
    proc = cli("run", "-", preexec=_without([8]), stdin=b"print(1)\n")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "CAP_SETPCAP" in proc.stderr and "execbox doctor" in proc.stderr
    assert "prctl" not in proc.stderr
    api = subprocess.run(
        [
            sys.executable,
            "-c",
            "import execbox\ntry:\n    execbox.Executor()\n"
            "except execbox.SandboxUnavailable as exc:\n    print(exc)\n",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_without([21]),
    )
    assert "CAP_SYS_ADMIN" in api.stdout and "execbox doctor" in api.stdout, api.stderr


def test_runs_need_no_capability_but_the_required_ones() -> None:
    others = [cap for cap in range(linux.cap_last_cap() + 1) if cap not in REQUIRED]
    proc = cli(
        "run",
        "-",
        "--json",
        "--no-cache",
        preexec=_without(others),
        stdin=b"import os; print(os.getuid())\n",
    )
    assert proc.returncode == 0, proc.stderr
    assert '"status":"ok"' in proc.stdout


def test_doctor_in_a_user_namespace_blames_the_namespace() -> None:
    proc = cli("doctor", preexec=_in_user_namespace)
    assert proc.returncode == 2
    line, fix = _line(proc.stdout, "user namespace")
    assert line.startswith("FAIL") and "uids 0-0 are host uids 0-0" in line
    line, fix = _line(proc.stdout, "pidfd")
    assert line.startswith("FAIL") and "EPERM" in line and "user namespace" in fix
    assert not _blames_the_kernel(proc.stdout), proc.stdout
    run = cli("run", "-", preexec=_in_user_namespace, stdin=b"print(1)\n")
    assert run.returncode == 2 and "user namespace" in run.stderr
    assert "execbox doctor" in run.stderr


@pytest.mark.parametrize(
    "code,fix",
    [
        (errno.ENOSYS, "Linux 5.8"),
        (errno.EINVAL, "Linux 5.8"),
        (errno.EPERM, "seccomp=unconfined"),  # capabilities held: a profile refused it
    ],
)
def test_pidfd_failure_is_worded_from_its_errno(
    code: int, fix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(fd: int, nstype: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(linux, "setns", refused)  # in the probe's fork too
    check = next(c for c in probe.run_checks() if c.name == "pidfd")
    assert not check.ok and errno.errorcode[code] in check.detail
    assert fix in check.fix
