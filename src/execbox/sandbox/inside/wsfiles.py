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
import shutil
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
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise FileOpError(
                f"cannot {verb} {path!r}: no room in the session's workspace (its bytes, or "
                "its count of files and directories); raise limits.disk_mib"
            ) from exc
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


def remove_tree(path: str) -> None:
    """Remove `path` and, when it is a directory, all it holds: links, FIFOs and devices are
    removed, never followed or opened (shutil.rmtree's walk by directory descriptors)."""
    with _call("remove", path), _existing(path) as (parent, name, st):
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=parent)
            return
        try:
            shutil.rmtree(name, dir_fd=parent)
        except RecursionError as exc:  # a tree nested deeper than the interpreter recurses
            raise FileOpError(
                f"{path!r} is nested too deeply to remove in one call: remove a part first"
            ) from exc


def make_dir(path: str, uid: int) -> bool:
    """Make the directory `path` and its parents, owned by the program's `uid`: True when
    made, False when it was a directory already; FileOpError when something else is there."""
    with _call("make a directory at", path):
        parts = _parts(path)
        parent = _open_parent(parts, uid)
        try:
            try:
                os.mkdir(parts[-1], 0o755, dir_fd=parent)
            except FileExistsError:
                # mkdir never follows a link at the last component: lstat says what is there.
                st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    return False
                raise FileOpError(f"{path!r} exists and is not a directory") from None
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise FileOpError(
                        f"no room for the directory {path!r} in the session's workspace; "
                        "raise limits.disk_mib"
                    ) from exc
                raise
            os.chown(parts[-1], uid, uid, dir_fd=parent, follow_symlinks=False)
            return True
        finally:
            os.close(parent)


def rename(source: str, target: str, uid: int) -> list[tuple[str, str]]:
    """Move the entry at `source` (a file, link or directory, never followed) to `target`,
    replacing a file or an empty directory there; `target`'s parents are made, owned by
    `uid`. Returns (old, new) paths of the regular files moved, for the caller's records."""
    with _call("rename", source), _existing(source) as (src_dir, src_name, st):
        if target == source or target.startswith(source + "/"):
            if target == source:
                return []
            raise FileOpError(f"cannot move {source!r} into itself ({target!r})")
        parts = _parts(target)
        dst_dir = _open_parent(parts, uid)
        try:
            moved = (
                [(source, target)]
                if stat.S_ISREG(st.st_mode)
                else [
                    (f"{source}/{rel}", f"{target}/{rel}")
                    for rel in _files_under(src_dir, src_name)
                ]
                if stat.S_ISDIR(st.st_mode)
                else []
            )
            try:
                os.rename(src_name, parts[-1], src_dir_fd=src_dir, dst_dir_fd=dst_dir)
            except OSError as exc:
                raise FileOpError(
                    f"cannot move {source!r} to {target!r}: {os.strerror(exc.errno or 0)}"
                ) from exc
        finally:
            os.close(dst_dir)
    return moved


def _files_under(parent: int, name: str) -> list[str]:
    """The regular files below a directory (relative paths, links not followed), at most
    `artifacts.MAX_ENTRIES` entries looked at."""
    found: list[str] = []
    budget = artifacts.MAX_ENTRIES

    def walk(dir_fd: int, prefix: str, depth: int) -> None:
        nonlocal budget
        with os.scandir(dir_fd) as entries:
            for entry in entries:
                budget -= 1
                if budget < 0:
                    return
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    found.append(prefix + entry.name)
                elif stat.S_ISDIR(st.st_mode) and depth < artifacts.MAX_DEPTH:
                    sub = os.open(entry.name, _DIR_FLAGS, dir_fd=dir_fd)
                    try:
                        walk(sub, prefix + entry.name + "/", depth + 1)
                    finally:
                        os.close(sub)

    top = os.open(name, _DIR_FLAGS, dir_fd=parent)
    try:
        walk(top, "", 0)
    finally:
        os.close(top)
    return found


def listing(max_files: int, max_bytes: int) -> tuple[list[dict[str, Any]], list[str], bool]:
    """Every regular file, hashed in chunks (no bytes kept; a file with many links is read
    once), at most `max_bytes` read in all; and every directory, empty ones included."""
    dirs: list[str] = []
    with _call("list", "."):
        found, truncated = artifacts.collect(
            ROOT, set(), max_files, max_bytes, keep_data=False, dirs=dirs
        )
    files = [
        {"path": f.path, "size": f.size, "sha256": f.sha256, "mime_type": f.mime_type}
        for f in found
    ]
    return files, dirs, truncated
