"""A session's files API, done by the supervisor (root) inside the session's /workspace.

The workspace belongs to untrusted code that may be running at the same moment, so every path
is walked one component at a time with directory descriptors and O_NOFOLLOW: a symlink planted
anywhere on the path is never followed, and a FIFO or device is never opened for its content.
Files written here are created under a temporary name, owned by the sandbox user, and renamed
into place (a rename replaces a link, it never writes through one).
Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from typing import Any

from . import artifacts

ROOT = "/workspace"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class FileOpError(Exception):
    """A files API call the caller can fix (no such file, not a regular file, disk full)."""


@contextlib.contextmanager
def _call(verb: str, path: str) -> Iterator[None]:
    """Any OS error of the call becomes its FileOpError: code left running in the session may
    change the workspace between any two system calls here, and that is its doing, not a
    failure of the sandbox."""
    try:
        yield
    except OSError as exc:
        raise FileOpError(
            f"cannot {verb} {path!r}: {os.strerror(exc.errno or 0)} (the "
            "workspace changed during the call; is code in the session "
            "changing it?)"
        ) from exc


def _parts(path: str) -> list[str]:
    parts = path.split("/")
    if (
        not path
        or path.startswith("/")
        or any(p in ("", ".", "..") for p in parts)
        or "\x00" in path
    ):
        raise FileOpError(f"{path!r} is not a clean relative path inside /workspace")
    return parts


def _open_parent(parts: list[str], uid: int | None) -> int:
    fd = os.open(ROOT, _DIR_FLAGS)
    try:
        for part in parts[:-1]:
            if uid is not None:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    os.chown(part, uid, uid, dir_fd=fd, follow_symlinks=False)
                except FileExistsError:
                    pass
            try:
                sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise FileOpError(
                    f"{part!r} on the path is not a directory ({os.strerror(exc.errno or 0)})"
                ) from exc
            os.close(fd)
            fd = sub
        return fd
    except BaseException:
        os.close(fd)
        raise


def write(path: str, data: bytes, uid: int) -> dict[str, Any]:
    """Write `data` at `path`, owned by the program's `uid` (its directories too)."""
    with _call("write", path):
        return _write(path, data, uid)


def _write(path: str, data: bytes, uid: int) -> dict[str, Any]:
    parts = _parts(path)
    parent = _open_parent(parts, uid)
    tmp = f".execbox-upload-{os.urandom(6).hex()}"
    try:
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
            dir_fd=parent,
        )
        try:
            os.fchown(fd, uid, uid)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError as exc:
            os.close(fd)
            _discard(tmp, parent)
            if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
                raise FileOpError(
                    f"no room for {path!r} ({len(data)} bytes) in the session's "
                    "workspace; raise limits.disk_mib"
                ) from exc
            raise
        st = os.fstat(fd)
        os.close(fd)
        try:
            os.rename(tmp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
        except OSError as exc:
            _discard(tmp, parent)
            raise FileOpError(f"cannot write {path!r}: {os.strerror(exc.errno or 0)}") from exc
    finally:
        os.close(parent)
    return {"path": path, "size": st.st_size, "inode": st.st_ino, "mtime_ns": st.st_mtime_ns}


def _discard(tmp: str, parent: int) -> None:
    # The session's code may already have removed or replaced it; the call's error is what
    # matters, not the clean-up's.
    with contextlib.suppress(OSError):
        os.unlink(tmp, dir_fd=parent)


@contextlib.contextmanager
def _existing(path: str) -> Iterator[tuple[int, str, os.stat_result]]:
    """(parent directory fd, name, lstat) of an existing entry; FileOpError when missing."""
    parts = _parts(path)
    try:
        parent = _open_parent(parts, None)
    except FileNotFoundError as exc:
        raise FileOpError(f"no file {path!r} in the session's workspace") from exc
    try:
        try:
            st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError as exc:
            raise FileOpError(f"no file {path!r} in the session's workspace") from exc
        yield parent, parts[-1], st
    finally:
        os.close(parent)


def read(path: str, limit: int) -> bytes:
    with _call("read", path), _existing(path) as (parent, name, st):
        if not stat.S_ISREG(st.st_mode):
            raise FileOpError(
                f"{path!r} is not a regular file (links, FIFOs and devices are never read)"
            )
        if st.st_size > limit:
            raise FileOpError(f"{path!r} is {st.st_size} bytes, over the {limit}-byte cap")
        data = artifacts.read_regular(parent, name, st, limit)
        if data is None:
            raise FileOpError(f"{path!r} changed while it was read; try again")
        return data


def remove(path: str) -> None:
    with _call("remove", path), _existing(path) as (parent, name, st):
        if stat.S_ISDIR(st.st_mode):
            try:
                os.rmdir(name, dir_fd=parent)
            except OSError as exc:
                raise FileOpError(
                    f"cannot remove directory {path!r}: {os.strerror(exc.errno or 0)}"
                ) from exc
        else:  # unlinking a link removes the link, never its target
            os.unlink(name, dir_fd=parent)


def listing(max_files: int, max_bytes: int) -> tuple[list[dict[str, Any]], bool]:
    """Every regular file, hashed in chunks (no bytes kept; a file with many links is read
    once), at most `max_bytes` read in all."""
    with _call("list", "."):
        found, truncated = artifacts.collect(ROOT, set(), max_files, max_bytes, keep_data=False)
    return [
        {"path": f.path, "size": f.size, "sha256": f.sha256, "mime_type": f.mime_type}
        for f in found
    ], truncated
