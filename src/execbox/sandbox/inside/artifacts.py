"""Collect the regular files a run created or changed under /workspace, within the caps.

Runs in the supervisor once the program has ended and the rest of the run has been killed
(background processes may still be dying; what they wrote is whatever they had written). Walks with directory file
descriptors and O_NOFOLLOW, looks at entries with lstat only, never follows a link, never opens
a FIFO, socket or device, never reads a file larger than the remaining byte budget (a 20 GiB
sparse file costs one lstat). Names are kept as the kernel gives them; bytes that are not UTF-8
are escaped as `\\xNN` when the name is turned into text.
Standard library only.
"""

from __future__ import annotations

import codecs
import hashlib
import itertools
import mimetypes
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

MAX_DEPTH = 64
MAX_PATH_BYTES_TOTAL = 8 << 20  # sum of reported path lengths: bounds the result's metadata
MAX_ENTRIES = 100_000  # entries looked at per run, all directories together
_MIME = mimetypes.MimeTypes()  # the built-in table only: the same answer on every host
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF8", "image/gif"),
    (b"%PDF-", "application/pdf"),
    (b"PK\x03\x04", "application/zip"),
)


@dataclass
class Collected:
    path: str
    size: int
    sha256: str
    mime_type: str
    data: bytes


def display_name(parts: list[str]) -> str:
    """The path as text, reversibly: a backslash becomes `\\\\` and a byte that is not UTF-8
    becomes `\\xNN`, so distinct names stay distinct and the result is always valid JSON."""
    raw = "/".join(parts).encode("utf-8", "surrogateescape").replace(b"\\", b"\\\\")
    return raw.decode("utf-8", "backslashreplace")


def guess_mime(name: str, head: bytes) -> str:
    for magic, mime in _MAGIC:
        if head.startswith(magic):
            return mime
    guessed = _MIME.guess_type(name, strict=False)[0]
    if guessed:
        return guessed
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
        return "text/plain"
    except UnicodeDecodeError:
        return "application/octet-stream"


def _open_regular(dir_fd: int, name: str, expect: os.stat_result) -> int | None:
    """An fd of the regular file `name` that lstat saw (never a link, FIFO or device)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (expect.st_dev, expect.st_ino):
        os.close(fd)
        return None
    return fd


def _chunks(fd: int, limit: int) -> Iterator[bytes]:
    """The file's bytes in chunks, at most `limit` + 1 of them (one more tells it is larger)."""
    left = min(os.fstat(fd).st_size, limit) + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return
        left -= len(chunk)
        yield chunk


def read_regular(dir_fd: int, name: str, expect: os.stat_result, limit: int) -> bytes | None:
    fd = _open_regular(dir_fd, name, expect)
    if fd is None:
        return None
    try:
        data = b"".join(_chunks(fd, limit))
        return data if len(data) <= limit else None
    finally:
        os.close(fd)


FileState = tuple[int, int, int]  # inode, size, modification time (ns)


def state_key(name: str) -> bytes:
    """A fixed-size key for a path in `seen`: memory does not grow with path lengths."""
    return hashlib.blake2b(name.encode("utf-8", "surrogateescape"), digest_size=16).digest()


def _hash_regular(
    dir_fd: int, name: str, expect: os.stat_result, limit: int
) -> tuple[str, bytes] | None:
    """(sha256, first 4 KiB) of a regular file, read in chunks, nothing kept."""
    fd = _open_regular(dir_fd, name, expect)
    if fd is None:
        return None
    try:
        digest, head, size = hashlib.sha256(), b"", 0
        for chunk in _chunks(fd, limit):
            if len(head) < 4096:
                head += chunk[: 4096 - len(head)]
            digest.update(chunk)
            size += len(chunk)
        return None if size > limit else (digest.hexdigest(), head)
    finally:
        os.close(fd)


# Complex on purpose: one pass over the workspace, every cap checked where a file is seen.
def collect(  # noqa: C901
    root: str,
    skip: set[tuple[int, int]],
    max_files: int,
    max_bytes: int,
    seen: dict[bytes, FileState] | None = None,
    keep_data: bool = True,
    dirs: list[str] | None = None,
) -> tuple[list[Collected], bool]:
    """Return (artifacts in path order, truncated). `skip` holds the inputs' (dev, inode).

    With `seen` (a session's workspace between cells), files whose state is unchanged since the
    last call are left out, and `seen` is replaced by the state of every regular file now.
    Without `keep_data`, files are hashed in chunks and their bytes not kept (a listing), and a
    file with several links is read once. `dirs`, when given, gets every directory walked."""
    found: list[Collected] = []
    now: dict[bytes, FileState] = {}
    hashed: dict[tuple[int, int], tuple[str, bytes]] = {}  # (dev, inode) -> sha256, head
    truncated = False
    budget = max_bytes
    path_budget = MAX_PATH_BYTES_TOTAL
    scanned = 0
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)

    # Complex on purpose: the tree walk of that pass; split, the caps would be too.
    def walk(dir_fd: int, prefix: list[str], depth: int) -> bool:  # noqa: C901
        """Return False to stop the whole walk."""
        nonlocal budget, path_budget, truncated, scanned
        try:
            with os.scandir(dir_fd) as it:
                # Never list more than the scan budget, however large the directory.
                entries = sorted(
                    itertools.islice(it, MAX_ENTRIES - scanned + 1), key=lambda e: e.name
                )
        except OSError:
            return True
        for entry in entries:
            scanned += 1
            if scanned > MAX_ENTRIES:
                truncated = True
                return False
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            parts = prefix + [entry.name]
            if stat.S_ISDIR(st.st_mode):
                if depth >= MAX_DEPTH:
                    truncated = True
                    continue
                if dirs is not None:
                    dirs.append(display_name(parts))
                try:
                    sub = os.open(
                        entry.name,
                        os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                        dir_fd=dir_fd,
                    )
                except OSError:
                    continue
                try:
                    if not walk(sub, parts, depth + 1):
                        return False
                finally:
                    os.close(sub)
            elif stat.S_ISREG(st.st_mode):
                if (st.st_dev, st.st_ino) in skip:
                    continue
                name = display_name(parts)
                if seen is not None:
                    state = (st.st_ino, st.st_size, st.st_mtime_ns)
                    key = state_key(name)
                    now[key] = state
                    if seen.get(key) == state:
                        continue
                if len(found) >= max_files:
                    truncated = True
                    return False
                if st.st_size > budget or len(name) > path_budget:
                    truncated = True
                    continue
                if not keep_data:
                    ident = (st.st_dev, st.st_ino)
                    if ident not in hashed:
                        digest = _hash_regular(dir_fd, entry.name, st, budget)
                        if digest is None:
                            continue
                        hashed[ident] = digest
                        budget -= st.st_size
                    path_budget -= len(name)
                    sha, head = hashed[ident]
                    found.append(Collected(name, st.st_size, sha, guess_mime(name, head), b""))
                    continue
                data = read_regular(dir_fd, entry.name, st, budget)
                if data is None:
                    continue
                budget -= len(data)
                path_budget -= len(name)
                found.append(
                    Collected(
                        name,
                        len(data),
                        hashlib.sha256(data).hexdigest(),
                        guess_mime(name, data[:4096]),
                        data,
                    )
                )
            # links, FIFOs, sockets and devices are never artifacts
        return True

    try:
        walk(root_fd, [], 0)
    finally:
        os.close(root_fd)
    if seen is not None:
        seen.clear()
        seen.update(now)
    return found, truncated
