"""The server's end of a TCP connection sends each write at once (TCP_NODELAY): without it a
response's head and body left as two segments and the body waited for the client's delayed
ACK, ~40 ms on every request after a kept-alive connection's first few."""

from __future__ import annotations

import contextlib
import os
import socket
from urllib.parse import urlsplit

from tests.server.conftest import Api


def _server_end(peer: tuple[str, int]) -> socket.socket:
    """This process's socket whose peer is `peer` (the server runs on a thread here)."""
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        with contextlib.suppress(OSError):
            if sock.family == socket.AF_INET and sock.getpeername() == peer:
                return sock
        sock.close()
    raise AssertionError(f"no socket of this process has the peer {peer}")


def test_the_servers_end_of_a_connection_sets_no_delay(fake_api: Api) -> None:
    url = urlsplit(fake_api.url)
    assert url.hostname is not None and url.port is not None
    with socket.create_connection((url.hostname, url.port), timeout=10) as client:
        client.sendall(f"GET /healthz HTTP/1.1\r\nhost: {url.netloc}\r\n\r\n".encode())
        assert client.recv(65536).startswith(b"HTTP/1.1 200")
        with _server_end(client.getsockname()) as server_end:
            assert server_end.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
