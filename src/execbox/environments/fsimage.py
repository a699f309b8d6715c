"""The filesystem file the jail mounts a tree from (`<tree>.ext4`, beside it): ext4 made by
e2fsprogs' `mke2fs -d` from the tree, its own filesystem whose root is the tree, so nothing
(not even /proc/self/mountinfo) names the directory it was made from. No journal: it is
mounted read-only. FS_FORMAT names what goes into it; a change remakes every tree's file."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..errors import SandboxUnavailable
from ..image import FS_TYPE, fs_image_path
from . import manifest

FS_FORMAT = "1"
FS_BLOCK = 4096
# Where mke2fs is when the caller's PATH lacks the sbin directories (as a service's may).
SBIN = ("/usr/sbin", "/sbin")
MKE2FS_FIX = (
    "install e2fsprogs (Debian/Ubuntu: apt-get install e2fsprogs; Fedora/RHEL: dnf install "
    "e2fsprogs; Alpine: apk add e2fsprogs)"
)


def find_mke2fs() -> str | None:
    """The mke2fs a filesystem file is made with, or None."""
    return shutil.which("mke2fs", path=os.pathsep.join([os.environ.get("PATH", ""), *SBIN]))


def mountable(root: Path) -> Path:
    """The tree's filesystem file, made when it is missing or older than the tree's C parts."""
    fs = fs_image_path(root)
    meta = manifest.read(root)
    key = f"{FS_FORMAT}:{meta.get('native_sha256')}"
    if meta.get("fs_image") == key and fs.is_file():
        return fs
    mke2fs = find_mke2fs()
    if mke2fs is None:
        raise SandboxUnavailable(
            f"making the runtime image's filesystem needs mke2fs: {MKE2FS_FIX}"
        )
    blocks, inodes = _fs_size(root)
    tmp = fs.with_name(f".{fs.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    size_kib = (blocks * FS_BLOCK * 5 // 4 + inodes * 256 + (64 << 20)) >> 10
    done = subprocess.run(
        [
            mke2fs,
            "-q",
            "-t",
            FS_TYPE,
            "-O",
            "^has_journal,^resize_inode",
            "-m",
            "0",
            "-b",
            str(FS_BLOCK),
            "-N",
            str(inodes + 256),
            "-E",
            "root_owner=0:0",
            "-L",
            "execbox-env",
            "-d",
            str(root),
            str(tmp),
            f"{size_kib}k",
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise SandboxUnavailable(f"mke2fs failed for {root}: {done.stderr.strip()}")
    tmp.chmod(0o644)
    tmp.replace(fs)
    meta["fs_image"] = key
    manifest.write(root, meta)
    return fs


def _fs_size(root: Path) -> tuple[int, int]:
    """Blocks and inodes the tree takes in a filesystem of FS_BLOCK blocks."""
    blocks = inodes = 1
    for _dirpath, dirnames, filenames in os.walk(root):
        inodes += len(dirnames) + len(filenames)
        blocks += len(dirnames)
        for name in filenames:
            st = os.lstat(os.path.join(_dirpath, name))
            blocks += -(-st.st_size // FS_BLOCK)
    return blocks, inodes
