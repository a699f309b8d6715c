"""The proxy's listening socket, made inside a run's network namespace.

A run slot's supervisor stays in the network namespace its staged run will use until the run
has ended, so a socket made in the supervisor's namespace (joined through its pidfd) is one
the run can reach on its loopback, and nothing else can. The host makes it, in a short-lived
thread of its own: `setns` changes only the calling thread's namespace, and the thread ends
with the call, so no other thread of the host ever runs in a run's namespace. The socket
stays in the namespace it was made in whatever its owner does later; the host's proxy only
accepts on it, and dials out from its own namespace.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading

CLONE_NEWNET = 0x40000000
BACKLOG = 64
_libc = ctypes.CDLL(None, use_errno=True)


def listen_in(pidfd: int) -> socket.socket:
    """A TCP socket listening on 127.0.0.1 (a port the kernel picks) in the network namespace
    of the process `pidfd` refers to. OSError when the namespace cannot be joined."""
    made: list[socket.socket | BaseException] = []

    def make() -> None:
        try:
            if _libc.setns(pidfd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns into the run's network namespace: {os.strerror(err)}")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("127.0.0.1", 0))
                sock.listen(BACKLOG)
            except BaseException:
                sock.close()
                raise
            made.append(sock)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            made.append(exc)

    thread = threading.Thread(target=make, name="execbox-netns-listen", daemon=True)
    thread.start()
    thread.join()
    result = made[0]
    if isinstance(result, BaseException):
        raise result
    return result
