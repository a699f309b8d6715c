"""`execbox doctor` checks what environments need of the host: mke2fs (to make a tree's
filesystem file) and loop devices (to mount it). Each failure's wording from made-up
observations, then one real doctor run."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from execbox.environments import doctor
from tests.conftest import sandbox_missing


def _oserror(code: int) -> OSError:
    return OSError(code, os.strerror(code))


@pytest.mark.parametrize(
    ("path", "version", "ok", "words"),
    [
        (None, None, False, ["not found", "apt-get install e2fsprogs", "dnf install e2fsprogs"]),
        ("/sbin/mke2fs", "mke2fs 1.42.9 (28-Dec-2013)", False, ["1.42.9", "1.43 or newer"]),
        ("/sbin/mke2fs", "", False, ["did not say its version", "install e2fsprogs"]),
        ("/sbin/mke2fs", "mke2fs 1.47.0 (5-Feb-2023)\n", True, ["/sbin/mke2fs", "1.47.0"]),
        ("/sbin/mke2fs", "mke2fs 1.43 (17-May-2016)", True, ["1.43"]),
    ],
)
def test_mke2fs_check_says_what_to_install(
    path: str | None, version: str | None, ok: bool, words: list[str]
) -> None:
    check = doctor.mke2fs_check(path, version)
    assert check.ok is ok and check.required
    text = f"{check.detail} {check.fix}"
    assert all(w in text for w in words), text
    assert bool(check.fix) is not ok


@pytest.mark.parametrize(
    ("code", "detail", "fix"),
    [
        (errno.ENOENT, "does not exist", ["modprobe loop", "--device /dev/loop-control"]),
        (errno.EACCES, "Permission denied", ["as root", "--device-cgroup-rule 'b 7:* rmw'"]),
        (errno.EPERM, "Operation not permitted", ["--device /dev/loop-control", "--privileged"]),
        (errno.ENOSPC, "no free loop device", ["losetup -D", "max_loop"]),
        (errno.EIO, "Input/output error", ["see the error"]),
    ],
)
def test_loop_control_check_says_what_to_grant(code: int, detail: str, fix: list[str]) -> None:
    check = doctor.loop_control_check(None, _oserror(code))
    assert not check.ok and check.required
    assert detail in check.detail and "/dev/loop-control" in check.detail
    assert all(w in check.fix for w in fix), check.fix
    good = doctor.loop_control_check(7, None)
    assert good.ok and "/dev/loop7" in good.detail and not good.fix


@pytest.mark.parametrize(
    ("code", "detail", "fix"),
    [
        (
            errno.ENOENT,
            "/dev/loop3 does not exist",
            ["mknod /dev/loop3 b 7 3", "--device /dev/loop3"],
        ),
        (errno.EACCES, "/dev/loop3: Permission denied", ["--device-cgroup-rule 'b 7:* rmw'"]),
        (errno.EPERM, "/dev/loop3: Operation not permitted", ["--privileged"]),
        (errno.EIO, "/dev/loop3: Input/output error", ["see the error"]),
    ],
)
def test_loop_device_check_says_what_to_grant(code: int, detail: str, fix: list[str]) -> None:
    check = doctor.loop_device_check(3, _oserror(code))
    assert not check.ok and detail in check.detail
    assert all(w in check.fix for w in fix), check.fix
    assert doctor.loop_device_check(3, None).ok
    untried = doctor.loop_device_check(None, None)  # loop-control gave no number
    assert not untried.ok and "loop-control" in untried.fix


def test_doctor_on_this_host_reports_mke2fs_and_loop_devices() -> None:
    if os.geteuid() != 0:
        sandbox_missing("loop devices need root")
    proc = subprocess.run(
        [sys.executable, "-m", "execbox.cli", "doctor"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = {line[5:].split()[0]: line for line in proc.stdout.splitlines() if line[:4].strip()}
    for name in ("mke2fs", "loop-control", "loop"):
        assert name in lines, proc.stdout
    assert lines["mke2fs"].startswith("ok") and "e2fsprogs" in lines["mke2fs"], proc.stdout
    assert lines["loop-control"].startswith("ok") and "/dev/loop" in lines["loop-control"]
    assert lines["loop"].startswith("ok") and "opens read-only" in lines["loop"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
