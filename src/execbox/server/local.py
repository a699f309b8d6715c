"""The server's local socket: a Unix socket beside the run records that `execbox run` on the same
machine finds and sends its runs to, so a CLI run skips starting a sandbox (seconds) and costs
milliseconds.

A Unix socket, not the loopback port: its file's permissions (0600, the server's user) decide
who may connect, so the CLI needs no API key, while the TCP port keeps asking every caller for
one. A connection on it runs as the tenant 'local' only when the peer's kernel-reported uid is
the server's own (or root): a socket file made reachable by mistake still lets no one else in.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..homedir import home

SOCKET_NAME = "serve.sock"
LOCAL_PEER_KEY = "execbox.local_peer"  # the scope's mark: this request came on the local socket
# sun_path holds 108 bytes, the terminating NUL included.
MAX_SOCKET_PATH = 107


class SocketTaken(UsageError):
    """Another server answers on the socket."""


def default_socket_path() -> Path:
    """Where `execbox serve` listens and `execbox run` looks: the execbox home's serve.sock."""
    return home() / SOCKET_NAME


def bind_local_socket(path: Path) -> socket.socket:
    """A Unix stream socket bound at `path`, readable and writable by this user only. A stale
    socket file of this user's (no server answers) is replaced; a live one, or another user's,
    is SocketTaken (another server, or one this user must not remove or stand in for)."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise UsageError(
            f"the local socket path {path} is longer than {MAX_SOCKET_PATH} bytes; "
            "give a shorter one with --socket"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None:
        if not stat.S_ISSOCK(mode):
            raise UsageError(f"{path} exists and is not a socket; remove it or give --socket")
        owner = path.lstat().st_uid
        if owner != os.geteuid():
            raise SocketTaken(
                f"{path} is a socket of uid {owner}'s, not this user's: another user's server "
                "(or one it left); give this one --socket PATH or --no-socket"
            )
        if _answers(path):
            raise SocketTaken(
                f"another execbox serve listens on {path}; stop it, or give this one "
                "--socket PATH or --no-socket"
            )
        try:
            path.unlink()
        except OSError as exc:
            raise UsageError(f"cannot remove the stale socket {path}: {exc}") from exc
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # no moment where the file is open to others
    try:
        sock.bind(os.fspath(path))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {path}: {exc}") from exc
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    return sock


def _answers(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(os.fspath(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def remove_local_socket(path: Path, inode: int) -> None:
    """Remove the socket file if it is still the one this server made (`inode`): a newer
    server may have replaced it."""
    try:
        if path.lstat().st_ino == inode:
            path.unlink()
    except FileNotFoundError:
        pass


def local_peer(transport: Any) -> bool:
    """True for a connection on a Unix socket from this process's user (or root)."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family != socket.AF_UNIX:
        return False
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return False
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid in (os.geteuid(), 0)
