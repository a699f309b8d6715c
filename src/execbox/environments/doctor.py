"""What environments need of the host, for `execbox doctor`: mke2fs to make a tree's
filesystem file, and loop devices to mount it (`/dev/loop-control` to find a free one, the
device's node to open). Each check is a function of what was observed, so its wording is tested
with the observations made up; `checks()` observes this host."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import subprocess

from ..sandbox.host.loop import LOOP_CTL_GET_FREE
from ..sandbox.host.probe import Check
from .fsimage import MKE2FS_FIX, find_mke2fs

CONTROL = "/dev/loop-control"
MKE2FS_MIN = (1, 43)  # `mke2fs -d`: fill the filesystem from a directory
# A container is given loop devices by its device cgroup (block major 7, loop-control is
# char 10:237) and by nodes in its /dev; --privileged gives both.
GRANT_CONTROL = (
    "run execbox as root; in a container, grant the device: docker run --device "
    "/dev/loop-control --device-cgroup-rule 'b 7:* rmw' (or --privileged)"
)
_DENIED = (errno.EACCES, errno.EPERM)


def mke2fs_check(path: str | None, version: str | None) -> Check:
    """`path`: where mke2fs is (None: nowhere); `version`: what `mke2fs -V` said."""
    if path is None:
        return Check("mke2fs", False, "mke2fs not found on PATH, /usr/sbin or /sbin", MKE2FS_FIX)
    found = re.search(r"(\d+)\.(\d+)(?:\.\d+)?", version or "")
    if found is None:
        return Check(
            "mke2fs",
            False,
            f"{path} did not say its version ({(version or '').strip()!r})",
            f"{MKE2FS_FIX}, 1.43 or newer",
        )
    if (int(found[1]), int(found[2])) < MKE2FS_MIN:
        return Check(
            "mke2fs",
            False,
            f"{path} is e2fsprogs {found[0]}, older than 1.43 (no `mke2fs -d`)",
            f"{MKE2FS_FIX}, 1.43 or newer",
        )
    return Check("mke2fs", True, f"{path} (e2fsprogs {found[0]})")


def loop_control_check(free: int | None, error: OSError | None) -> Check:
    """`free`: the device number /dev/loop-control gave; `error`: why it gave none."""
    if error is None and free is not None:
        return Check("loop-control", True, f"{CONTROL} gives free loop devices (/dev/loop{free})")
    code = error.errno if error is not None else None
    detail = f"{CONTROL}: {error.strerror if error and error.strerror else error}"
    if code == errno.ENOENT:
        return Check(
            "loop-control",
            False,
            f"{CONTROL} does not exist",
            "load the kernel's loop driver (modprobe loop); in a container, pass the device: "
            "docker run --device /dev/loop-control --device-cgroup-rule 'b 7:* rmw' "
            "(or --privileged)",
        )
    if code in _DENIED:
        return Check("loop-control", False, detail, GRANT_CONTROL)
    if code in (errno.ENOSPC, errno.ENODEV, errno.ENXIO):
        return Check(
            "loop-control",
            False,
            f"{detail} (no free loop device)",
            "detach unused loop devices (losetup -D) or allow more (the loop module's "
            "max_loop, or the kernel's loop.max_loop= boot option)",
        )
    return Check("loop-control", False, detail, f"see the error; {GRANT_CONTROL}")


def loop_device_check(number: int | None, error: OSError | None) -> Check:
    """`number`: the free device /dev/loop-control gave (None: it gave none); `error`: why
    /dev/loop<number> did not open read-only."""
    if number is None:
        return Check(
            "loop devices", False, f"not tried: {CONTROL} gave no device", "see loop-control"
        )
    node = f"/dev/loop{number}"
    if error is None:
        return Check("loop devices", True, f"{node} opens read-only")
    code = error.errno
    if code == errno.ENOENT:
        return Check(
            "loop devices",
            False,
            f"{node} does not exist: the kernel made the device but this /dev has no node for "
            "it (a container's /dev is not the host's)",
            f"make the nodes (mknod {node} b 7 {number}, for each number the kernel hands out) "
            f"or pass them: docker run --device {node} ... (or --privileged)",
        )
    if code in _DENIED:
        return Check(
            "loop devices",
            False,
            f"{node}: {error.strerror}",
            "run execbox as root; in a container, allow loop devices in its device cgroup: "
            "docker run --device-cgroup-rule 'b 7:* rmw' (or --privileged)",
        )
    return Check("loop devices", False, f"{node}: {error.strerror or error}", "see the error")


def checks() -> list[Check]:
    """This host's mke2fs, /dev/loop-control and loop devices."""
    mke2fs = find_mke2fs()
    version = None
    if mke2fs is not None:
        done = subprocess.run([mke2fs, "-V"], capture_output=True, text=True)
        version = done.stderr + done.stdout
    free, control_error = _free_loop_device()
    device_error = None if free is None else _open_error(f"/dev/loop{free}")
    return [
        mke2fs_check(mke2fs, version),
        loop_control_check(free, control_error),
        loop_device_check(free, device_error),
    ]


def _free_loop_device() -> tuple[int | None, OSError | None]:
    """The number of a free loop device, as the zygotes ask for one (the kernel may add it)."""
    try:
        fd = os.open(CONTROL, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return None, exc
    try:
        return fcntl.ioctl(fd, LOOP_CTL_GET_FREE), None
    except OSError as exc:
        return None, exc
    finally:
        os.close(fd)


def _open_error(path: str) -> OSError | None:
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
    except OSError as exc:
        return exc
    return None
