"""What a request must pass before the server reads its body, through a real server on
loopback: every authenticated request counts against its key's rate (404s and 422s too), an
unknown key is refused before any of its body is read, request bodies in flight have a
server-wide budget, and a stranger holding an address's connections does not lock a keyed
client of the same address out."""

from __future__ import annotations

import gc
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.probes import wait_until
from tests.server.conftest import Api, own_server, raw_connect, read_until_closed

# Claims about waits and admission under load: the machine to themselves (make test).
pytestmark = pytest.mark.serial

MIB = 1 << 20
UNKNOWN = "0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def api(fake_api: Api) -> Iterator[Api]:
    yield fake_api  # the claims here are the server's: the fake sandbox runs the code


def _head(path: str, key: str | None, length: int) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def _probe(url: str) -> httpx.Response:
    """GET /healthz on a connection of its own, closed after."""
    with httpx.Client(base_url=url) as probe:
        return probe.get("/healthz")


def _response(sock: socket.socket) -> bytes:
    """One whole response (headers and a Content-Length body) from a kept-alive connection."""
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(1 << 16)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(1 << 16)
    return head


def test_every_authenticated_request_counts_against_the_rate(api: Api) -> None:
    """422s (invalid bodies) and 404s (unknown runs and sessions) cost the server work too."""
    _, key = api.key("rate422", rpm=4)
    with api.http(key) as client:
        assert client.post("/v1/runs", json={"code": 5}).status_code == 422
        assert (
            client.post("/v1/runs", json={"code": "1", "limits": {"timeout_s": "no"}}).status_code
            == 422
        )
        assert client.get(f"/v1/sessions/{UNKNOWN}").status_code == 404
        assert client.get(f"/v1/sessions/{UNKNOWN}/files").status_code == 404
        refused = client.post("/v1/runs", json={"code": 5})
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "rate_limited"
        assert int(refused.headers["Retry-After"]) >= 1


def test_an_unknown_key_is_refused_before_its_body_is_read(api: Api) -> None:
    """The body is never read: the 401 comes while the client still owes all of it, and the
    connection is closed (nothing of a body sent later is buffered)."""
    with own_server(api.executor, max_request_bytes=32 * MIB) as (url, _):
        for key in (None, "ebx_not-a-key"):
            sock = raw_connect(url, _head("/v1/runs", key, 30 * MIB))
            try:
                started = time.monotonic()
                answer = read_until_closed(sock, 10)
                assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
                assert b"connection: close" in answer.lower()
                assert time.monotonic() - started < 5
            finally:
                sock.close()


def test_request_bodies_in_flight_have_a_server_wide_budget(api: Api) -> None:
    """Two keys each stall a body at their half of the budget: a third key's small request
    and the first key's second one are refused at once (503), and served once they close."""
    with own_server(
        api.executor, max_request_bytes=MIB, request_bodies_bytes=2 * MIB, body_timeout_s=60
    ) as (url, state):
        _, first = api.key("bodies")
        _, second = api.key("bodies")
        _, third = api.key("bodies")
        stalled = [
            raw_connect(url, _head("/v1/runs", key, MIB) + b'{"code": "') for key in (first, second)
        ]
        try:
            assert wait_until(lambda: state.bodies.used() == 2 * MIB, 30), "timed out"
            for key in (third, first):
                with httpx.Client(
                    base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30
                ) as client:
                    refused = client.put(f"/v1/sessions/{UNKNOWN}/files/a", content=b"x")
                assert refused.status_code == 503, refused.text
                assert refused.json()["error"]["code"] == "request_bodies_busy"
                assert refused.headers["Retry-After"] == "1"
        finally:
            for sock in stalled:
                sock.close()
        assert wait_until(lambda: state.bodies.used() == 0, 30), "timed out"
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {third}"}, timeout=30
        ) as client:
            assert client.put(f"/v1/sessions/{UNKNOWN}/files/a", content=b"x").status_code == 404


def test_a_stranger_at_the_connection_cap_does_not_lock_out_a_keyed_client(api: Api) -> None:
    """One address, two clients (NAT, a proxy, loopback): the stranger holds the cap's
    connections with half-sent headers; the keyed client's new connection evicts the oldest of
    them and is served, and the stranger never holds more than the cap."""
    with own_server(api.executor, max_connections_per_client=4, header_timeout_s=30) as (url, _):
        _, key = api.key("nat")
        half = b"GET /v1/runs HTTP/1.1\r\nHo"
        held = [raw_connect(url, half) for _ in range(4)]
        try:
            with api.http(key) as client:
                client.base_url = httpx.URL(url)
                for round_ in range(3):  # the stranger refills the cap before each request
                    time.sleep(0.2)
                    answer = client.post(
                        "/v1/runs", json={"code": "print(1)"}, headers={"Connection": "close"}
                    )
                    assert answer.status_code == 200, answer.text
                    assert answer.json()["stdout"] == "1\n"
                    assert read_until_closed(held[round_], 5).startswith(b"HTTP/1.1 503")
                    held.append(raw_connect(url, half))
            time.sleep(0.2)
            assert [read_until_closed(sock, 0.2) for sock in held[3:]] == [b""] * 4  # still waiting
        finally:
            for sock in held:
                sock.close()


def test_authenticated_connections_do_not_count_toward_the_cap(api: Api) -> None:
    with own_server(api.executor, max_connections_per_client=2) as (url, _):
        _, key = api.key("trusted")
        request = (
            f"GET /v1/sessions/{UNKNOWN} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\n\r\n"
        ).encode()
        keyed: list[socket.socket] = []
        try:
            for _ in range(4):  # every one is served and stays open (keep-alive)
                keyed.append(sock := raw_connect(url, request))
                assert _response(sock).startswith(b"HTTP/1.1 404")
            waiting = [raw_connect(url) for _ in range(2)]
            try:
                for sock in keyed:
                    sock.sendall(request)
                    assert _response(sock).startswith(b"HTTP/1.1 404")
            finally:
                for sock in waiting:
                    sock.close()
        finally:
            for sock in keyed:
                sock.close()


def test_without_auth_a_full_address_is_still_refused(api: Api) -> None:
    """Connections mid-request cannot be evicted: past the cap a new one is refused."""
    with own_server(api.executor, auth=False, max_connections_per_client=2, body_timeout_s=30) as (
        url,
        state,
    ):
        # PUT: the route awaits the body, so each holds its declared 100 bytes until closed.
        held = [
            raw_connect(url, _put_head(f"/v1/sessions/{UNKNOWN}/files/a", 100) + b"x")
            for _ in range(2)
        ]
        try:
            # Until the server has read both heads, their bytes wait in the kernel and the
            # connections look idle (evictable): the probe must come after.
            deadline = time.monotonic() + 10
            while state.bodies.used() < 200:
                assert time.monotonic() < deadline, "the server never read the held requests"
                time.sleep(0.01)
            refused = _probe(url)
            assert refused.status_code == 503 and "--max-connections" in refused.text
        finally:
            for sock in held:
                sock.close()


def _put_head(path: str, length: int) -> bytes:
    return (
        f"PUT {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS")) / 1024


def test_refused_bodies_are_let_go_at_once(api: Api) -> None:
    """Malformed 15 MiB bodies (422) on connections kept open: the server holds none of them
    after answering. Each failed request's frames held its body raw and parsed, in a cycle
    with the exception that only the collector (off here) frees."""
    body = b'{"code": "' + b"x" * (15 * MIB)  # not JSON: the decoder's error holds it too
    with own_server(api.executor, max_request_bytes=16 * MIB) as (url, _):
        _, key = api.key("invalid")
        gc.collect()
        gc.disable()
        kept: list[socket.socket] = []
        try:
            before = _rss_mib()
            for _ in range(8):
                kept.append(sock := raw_connect(url, _head("/v1/runs", key, len(body)) + body))
                assert _response(sock).startswith(b"HTTP/1.1 422")
            grown = _rss_mib() - before
        finally:
            gc.enable()
            for sock in kept:
                sock.close()
    assert grown < 60, f"the server kept {grown:.0f} MiB of refused bodies"


@pytest.mark.parametrize("key", [None, "ebx_not-a-key"])
def test_a_refusal_is_not_reset_by_the_body_left_unread(api: Api, key: str | None) -> None:
    """A refusal is answered before the body is read. A connection closed with received bytes
    still unread is reset, and a reset throws away whatever of the answer is not yet sent: the
    server shuts only its side, then reads and drops what still comes for a moment. The body
    here is more than the server reads ahead (64 KiB), so some of it is unread when it answers."""
    with own_server(api.executor, max_request_bytes=32 * MIB) as (url, _):
        body = b" " * MIB
        sock = raw_connect(url, _head("/v1/runs", key, len(body)))
        try:
            sock.settimeout(10)
            sock.sendall(body)  # a reset would fail this too
            answer = read_until_closed(sock, 10)  # raises ConnectionResetError on a reset
        finally:
            sock.close()
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert b"connection: close" in answer.lower()


def test_an_idle_connection_outlives_the_clients_pool_expiry() -> None:
    """The server keeps an idle kept-alive connection longer than httpx's pool does (both
    were 5 s): otherwise a request sent as the server closes the connection is lost
    (ReadError), as once seen in the MCP HTTP tests under load. MCP's server uses the same
    settings."""
    from execbox.server.background import config

    async def app(scope: object, receive: object, send: object) -> None: ...

    assert config(app).timeout_keep_alive > httpx.Limits().keepalive_expiry  # type: ignore[operator]
