"""The proxy on its own, on the host's loopback (no sandbox): what it does with the HTTP a
client sends it, byte by byte. The runs' view of it is in test_egress.py."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from execbox.network.allowlist import Allowlist
from execbox.network.proxy import Egress, EgressProxy, NetworkLimits
from tests.network.servers import Upstream


class Opened:
    def __init__(self, proxy: EgressProxy, egress: Egress, port: int) -> None:
        self.proxy, self.egress, self.port = proxy, egress, port
        self.limited: list[str] = []

    def send(self, data: bytes, *, wait_s: float = 5.0) -> bytes:
        """Send `data` on a new connection, half-close, read the answer to its end."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=wait_s) as sock:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


@pytest.fixture
def opened(upstream: Upstream) -> Iterator[Opened]:
    proxy = EgressProxy({"api.test": "127.0.0.1", "other.test": "127.0.0.1"})
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    limited: list[str] = []
    allow = Allowlist.parse([f"api.test:{upstream.http_port}", f"api.test:{upstream.https_port}"])
    egress = proxy.open(
        listener, allow, NetworkLimits(bytes=100_000, connections=5), limited.append
    )
    handle = Opened(proxy, egress, port)
    handle.limited = limited
    upstream.clear()
    yield handle
    proxy.end(egress)
    proxy.close()


def test_each_request_on_a_kept_alive_connection_is_decided_on_its_own(
    opened: Opened, upstream: Upstream
) -> None:
    port = upstream.http_port
    answer = opened.send(
        f"GET http://api.test:{port}/hello HTTP/1.1\r\nHost: api.test\r\n\r\n"
        f"GET http://other.test:{port}/hello HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n".encode()
    )
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert b"HTTP/1.1 403 " in answer  # the second, on the same connection
    assert upstream.seen() == [("GET", "/hello", f"api.test:{port}")]
    assert [e["verdict"] for e in opened.egress.log()] == ["allowed", "denied"]


def test_the_host_header_comes_from_the_url_not_the_client(
    opened: Opened, upstream: Upstream
) -> None:
    port = upstream.http_port
    opened.send(f"GET http://api.test:{port}/hello HTTP/1.1\r\nHost: evil.test\r\n\r\n".encode())
    assert upstream.seen() == [("GET", "/hello", f"api.test:{port}")]


def test_a_chunked_body_is_forwarded_framed_once(opened: Opened, upstream: Upstream) -> None:
    port = upstream.http_port
    answer = opened.send(
        f"POST http://api.test:{port}/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
        "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".encode()
    )
    # A Content-Length passed on beside the chunked framing would let a server that reads it
    # (as this one says it got none) take the body for something else.
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert answer.endswith(b"\r\n\r\necho hello content-length=None")


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /relative HTTP/1.1\r\nHost: api.test\r\n\r\n",
        b"GET https://api.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n",
        b"CONNECT api.test HTTP/1.1\r\nHost: api.test\r\n\r\n",
        "CONNECT api.test:\u00b2 HTTP/1.1\r\nHost: x\r\n\r\n".encode("latin-1"),
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET http://api.test/ HTTP/1.1\r\n" + b"X: " + b"a" * 20_000 + b"\r\n" * 2,
    ],
)
def test_requests_the_proxy_cannot_serve_get_400_and_reach_nothing(
    opened: Opened, upstream: Upstream, request_bytes: bytes
) -> None:
    answer = opened.send(request_bytes)
    assert answer.split(b" ")[1] in (b"400", b"431"), answer[:200]
    assert upstream.seen() == []


def test_the_byte_cap_cuts_a_tunnel_and_calls_the_limit_once(
    opened: Opened, upstream: Upstream
) -> None:
    port = upstream.http_port
    answer = opened.send(
        f"CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test\r\n\r\n"
        "GET /big?n=500000 HTTP/1.1\r\nHost: api.test\r\n\r\n".encode()
    )
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert len(opened.limited) == 1 and "limits.network_bytes" in opened.limited[0]
    [entry] = opened.egress.log()
    assert entry["bytes_up"] + entry["bytes_down"] <= 100_000


def test_ending_a_run_closes_its_listener_and_connections(
    opened: Opened, upstream: Upstream
) -> None:
    idle = socket.create_connection(("127.0.0.1", opened.port), timeout=5)
    time.sleep(0.1)  # accepted by the proxy
    opened.proxy.end(opened.egress)
    assert idle.recv(1) == b""  # the proxy's side is gone
    idle.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", opened.port), timeout=5)


def test_refused_requests_count_against_the_connection_cap(opened: Opened) -> None:
    """Bad targets are logged and counted like destinations: a flood of them ends the run
    instead of growing the host's log without bound."""
    for _ in range(7):
        opened.send(b"GET /relative HTTP/1.1\r\nHost: api.test\r\n\r\n")
    assert len(opened.limited) == 1 and "limits.network_connections" in opened.limited[0]
    assert len(opened.egress.log()) == 6  # the cap of 5, and the one past it


def test_a_long_host_is_refused_and_logged_cut(opened: Opened, upstream: Upstream) -> None:
    host = "a." * 2500 + "api.test"
    answer = opened.send(
        f"GET http://{host}:{upstream.http_port}/ HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    )
    assert answer.startswith(b"HTTP/1.1 403 ")
    [entry] = opened.egress.log()
    assert (entry["verdict"], entry["rule"]) == ("denied", "network.host")
    assert len(entry["host"]) <= 300 and len(entry["message"]) < 400


def test_one_run_holds_at_most_two_name_lookups_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lookups block threads of a pool every run shares: a run whose names resolve slowly
    (its wildcard domain's own DNS server) must not take them all."""
    import asyncio
    import threading

    import execbox.network.proxy as proxy_mod

    now, most = [0], [0]

    async def slow_resolve(name: str, port: int) -> tuple[object, ...]:
        now[0] += 1
        most[0] = max(most[0], now[0])
        await asyncio.sleep(0.3)
        now[0] -= 1
        raise OSError("no such name")

    monkeypatch.setattr(proxy_mod, "_resolve", slow_resolve)
    proxy = EgressProxy()
    listener = socket.create_server(("127.0.0.1", 0))
    limits = NetworkLimits(bytes=100_000, connections=50)
    egress = proxy.open(listener, Allowlist.parse(["*.slow.test"]), limits, lambda _m: None)
    handle = Opened(proxy, egress, listener.getsockname()[1])
    try:
        asks = [
            threading.Thread(
                target=handle.send,
                args=(f"GET http://n{i}.slow.test/ HTTP/1.1\r\nHost: x\r\n\r\n".encode(),),
            )
            for i in range(6)
        ]
        for ask in asks:
            ask.start()
        for ask in asks:
            ask.join()
    finally:
        proxy.end(egress)
        proxy.close()
    assert most[0] == 2
    assert [e["rule"] for e in egress.log()] == ["network.resolve"] * 6


def test_port_zero_is_port_zero_not_the_default(opened: Opened) -> None:
    opened.send(b"GET http://api.test:0/ HTTP/1.1\r\nHost: x\r\n\r\n")
    [entry] = opened.egress.log()
    assert (entry["port"], entry["rule"]) == (0, "network.port")
