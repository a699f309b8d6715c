"""Loop devices for the runtime image's filesystem file (see `environments.seal`).

The zygotes mount the image from a block device, not by binding its directory: a bind's
/proc/self/mountinfo line names the directory it came from, a filesystem's own root is "/".
One device per image file serves every host on the machine (they share its page cache); it is
read-only and clears itself once nothing has it open or mounted (see `keep_mounted`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import threading
from pathlib import Path

from .errors import HostError

LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A  # Linux 5.8
LOOP_GET_STATUS64 = 0x4C05
LO_FLAGS_READ_ONLY = 1
LO_FLAGS_AUTOCLEAR = 4
# struct loop_info64: device, inode, rdevice, offset, sizelimit, number, encrypt type, key
# size, flags, file name[64], crypt name[64], key[32], init[2].
INFO64 = struct.Struct("=QQQQQIIII64s64s32s2Q")
# struct loop_config: the backing fd, block size, a loop_info64 and 8 reserved u64.
CONFIG = struct.Struct(f"=II{INFO64.size}s64x")
ATTACH_TRIES = 16  # another process may take the free device between asking and configuring


class LoopDevice:
    """An open loop device reading one file; `path` is what to mount."""

    def __init__(self, fd: int, number: int) -> None:
        self.fd = fd
        self.path = f"/dev/loop{number}"

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# Per image file (device, inode): a mount namespace, held open, in which it is mounted.
_kept: dict[tuple[int, int], int] = {}
_kept_lock = threading.Lock()


def keep_mounted(image: Path, pid: int) -> None:
    """Keep the filesystem of `image`, which process `pid` has mounted, mounted for as long as
    this process lives: a host started later mounts the same superblock, whose cache is warm,
    instead of reading every module it imports through a fresh loop device. Held by the first
    host's mount namespace (a descriptor of it); it goes when this process exits."""
    st = os.stat(image)
    with _kept_lock:
        if (st.st_dev, st.st_ino) in _kept:
            return
        try:
            _kept[(st.st_dev, st.st_ino)] = os.open(
                f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC
            )
        except OSError as exc:
            raise HostError(f"hold the zygotes' mount namespace: {exc}") from exc


def attach(image: Path) -> LoopDevice:
    """A read-only loop device reading `image`: one already attached to it, or a new one."""
    shared = _attached(os.path.realpath(image))
    if shared is not None:
        return shared
    backing = os.open(image, os.O_RDONLY | os.O_CLOEXEC)
    try:
        flags = LO_FLAGS_READ_ONLY | LO_FLAGS_AUTOCLEAR
        info = INFO64.pack(0, 0, 0, 0, 0, 0, 0, 0, flags, b"", b"", b"", 0, 0)
        config = CONFIG.pack(backing, 0, info)
        ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
        try:
            for _ in range(ATTACH_TRIES):
                number = fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)
                fd = os.open(f"/dev/loop{number}", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    fcntl.ioctl(fd, LOOP_CONFIGURE, config)
                except OSError as exc:
                    os.close(fd)
                    if exc.errno == errno.EBUSY:
                        continue
                    raise
                return LoopDevice(fd, number)
        finally:
            os.close(ctl)
    except OSError as exc:
        raise HostError(f"attach a loop device to the runtime image's filesystem: {exc}") from exc
    finally:
        os.close(backing)
    raise HostError(f"no free loop device after {ATTACH_TRIES} tries")


def _attached(path: str) -> LoopDevice | None:
    """An attached, read-only loop device reading the file at `path`, held open. The kernel
    names a backing file replaced since (a rebuilt image) "... (deleted)": never a match."""
    try:
        names = os.listdir("/sys/block")
    except OSError:
        return None
    for name in names:
        if not (name.startswith("loop") and _backing_file(name) == path):
            continue
        try:
            fd = os.open(f"/dev/{name}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            status = bytearray(INFO64.size)
            fcntl.ioctl(fd, LOOP_GET_STATUS64, status)
            # Held open now, it cannot clear itself (one being cleared answers ENXIO); read
            # again, it was not cleared and attached to another file in between.
            if INFO64.unpack(status)[8] & LO_FLAGS_READ_ONLY and _backing_file(name) == path:
                return LoopDevice(fd, int(name.removeprefix("loop")))
        except OSError:
            pass
        os.close(fd)
    return None


def _backing_file(name: str) -> str | None:
    try:
        with open(f"/sys/block/{name}/loop/backing_file") as fh:
            return fh.read().rstrip("\n")
    except OSError:
        return None
