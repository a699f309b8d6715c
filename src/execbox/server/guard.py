"""Slow and greedy clients, at the connection: uvicorn's HTTP/1.1 protocol (h11) with the
timeouts and the cap it lacks.

h11 waits for a request's headers and body as long as the client likes, and uvicorn caps
connections only server-wide; so a client that opens many connections and sends each a few
bytes now and then holds file descriptors and memory forever. Here a request's line and headers
must arrive within `header_timeout_s` of its first byte (or of the connection's opening), else
408 and the connection is closed; its body within `body_timeout_s` of its headers, else the
connection is closed. An idle kept-alive connection closes silently at keep-alive's timeout.

One client address holds at most `max_per_client` connections that have not yet made an
authenticated request (a key's owner may share the address with strangers: NAT, a proxy,
loopback). At the cap, a new connection evicts that address's oldest connection still waiting
for a request's headers; only if none waits is the new one refused (503). So a client that
holds connections with half-sent headers only churns its own, and a keyed client, which sends
its request as it connects, gets in; once authenticated, a connection no longer counts (each
costs its key a request of its per-minute rate, and idles out with keep-alive's timeout).

A request refused before its body is read (a bad key, an admin key, a quota, a body too large)
is answered and its connection closed while the client may still be sending. A socket closed
with received bytes unread is reset, and a reset throws away whatever of the answer the kernel
has not sent yet, so the client can see "connection reset" instead of the refusal. Such a
connection is closed as HTTP servers have long done it ("lingering close"): only the server's
side is shut, and what still arrives is read and dropped for at most `LINGER_S` and
`LINGER_BYTES`, or until the client closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections import defaultdict
from typing import Any

import h11
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from .limits import TRUST_KEY
from .local import LOCAL_PEER_KEY, local_peer

LINGER_S = 2.0
LINGER_BYTES = 8 << 20


def _no_delay(transport: asyncio.BaseTransport) -> None:
    """Send each write at once. asyncio sets TCP_NODELAY only on sockets made with
    IPPROTO_TCP, and uvicorn's (proto 0) are not: a response's head and body then went out as
    two segments and the body waited for the client's delayed ACK (~40 ms a request)."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _raw_response(status: str, message: str) -> bytes:
    body = json.dumps(
        {
            "error": {
                "code": "connection_refused" if status.startswith("503") else "request_timeout",
                "message": message,
            }
        }
    ).encode()
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


# Complex on purpose: a class factory: the protocol's overrides share the server's counts.
def guarded_protocol(  # noqa: C901
    header_timeout_s: float,
    body_timeout_s: float,
    max_per_client: int,
) -> type[H11Protocol]:
    """An h11 protocol class for `uvicorn.Config(http=...)`, one per server: its connection
    counts are shared by the connections of that server only."""
    # Per address, its connections not yet authenticated, oldest first (dicts keep order).
    anonymous: defaultdict[str, dict[Guarded, None]] = defaultdict(dict)

    class Guarded(H11Protocol):
        _timer: asyncio.TimerHandle | None = None
        _counted: str | None = None

        _lingering: _Lingering | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            _no_delay(transport)
            self._lingering = _Lingering(transport, self)
            self.transport = self._lingering  # type: ignore[assignment]
            if local_peer(transport):
                self.app = _local(self.app)
            host = self.client[0] if self.client else None
            if host is not None and max_per_client:
                waiting = anonymous[host]
                if len(waiting) >= max_per_client and not _evict_one(waiting):
                    self.transport.write(
                        _raw_response(
                            "503 Service Unavailable",
                            f"this client already has {max_per_client} connections open that "
                            "have not authenticated (execbox serve --max-connections-per-client); "
                            "reuse one",
                        )
                    )
                    self.transport.close()
                    return
                waiting[self] = None
                self._counted = host
                self.app = _marked(self.app, self._trusted)
            self._arm(header_timeout_s, self._headers_late)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._lingering is not None:
                self._lingering.lost()
            self._trusted()
            super().connection_lost(exc)

        def _trusted(self) -> None:
            """An authenticated request came (or the connection ended): stop counting it."""
            if self._counted is not None:
                waiting = anonymous[self._counted]
                waiting.pop(self, None)
                if not waiting:
                    del anonymous[self._counted]
                self._counted = None

        def waiting_for_headers(self) -> bool:
            return (
                self.conn.their_state is h11.IDLE
                and not self.transport.is_closing()
                and (self.cycle is None or self.cycle.response_complete)
            )

        def data_received(self, data: bytes) -> None:
            if self._lingering is not None and self._lingering.dropping(len(data)):
                return
            before = self.conn.their_state
            super().data_received(data)
            after = self.conn.their_state
            if after is h11.SEND_BODY and before is not h11.SEND_BODY:
                self._arm(body_timeout_s, self._body_late)
            elif before is h11.IDLE and after is h11.IDLE and self._timer is None:
                self._arm(header_timeout_s, self._headers_late)  # a kept-alive one's first byte
            elif (
                after is not h11.SEND_BODY
                and before is h11.SEND_BODY
                or before is h11.IDLE
                and after is not h11.IDLE
            ):
                self._disarm()

        def eof_received(self) -> None:
            if self._lingering is not None and self._lingering.active:
                return  # the client is done sending: asyncio closes on a falsy answer
            super().eof_received()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # An idle kept-alive connection is keep-alive's to close, silently: a 408 sent
            # unasked could be read as the answer to a request the client sends meanwhile.
            # The next request's headers are due from its first byte (or now, if buffered).
            if (
                self.conn.their_state is h11.IDLE
                and not self.transport.is_closing()
                and self.conn.trailing_data[0]
            ):
                self._arm(header_timeout_s, self._headers_late)

        def _arm(self, delay: float, late: Any) -> None:
            self._disarm()
            self._timer = self.loop.call_later(delay, late)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _headers_late(self) -> None:
            self._timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.write(
                    _raw_response(
                        "408 Request Timeout",
                        f"the request's headers did not arrive within "
                        f"{header_timeout_s:g} s (execbox serve --header-timeout)",
                    )
                )
                self.transport.close()

        def _body_late(self) -> None:
            self._timer = None
            if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
                self.transport.close()  # the app sees a disconnect; no answer can be framed

    return Guarded


class _Lingering:
    """The connection's transport as uvicorn sees it, with a lingering close: closed after a
    complete answer while the request's body is still due, it shuts only the server's side and
    drops what still arrives (see the module's docstring). Everything else is the transport's."""

    def __init__(self, transport: asyncio.Transport, protocol: H11Protocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._timer: asyncio.TimerHandle | None = None
        self._left = LINGER_BYTES
        self.active = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.active or self._transport.is_closing()

    def close(self) -> None:
        if self.active:
            return
        cycle = self._protocol.cycle
        transport = self._transport
        if (
            self._protocol.conn.their_state is h11.SEND_BODY
            and cycle is not None
            and cycle.response_complete
            and not transport.is_closing()
            and transport.can_write_eof()
        ):
            self.active = True
            transport.write_eof()  # after the answer still buffered: the client reads it all
            transport.resume_reading()  # uvicorn pauses reading a body nobody reads
            self._timer = self._protocol.loop.call_later(LINGER_S, transport.close)
            return
        transport.close()

    def dropping(self, size: int) -> bool:
        """True when `size` bytes arrived while lingering (dropped; closed past the cap)."""
        if not self.active:
            return False
        self._left -= size
        if self._left < 0:
            self._transport.close()
        return True

    def lost(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _evict_one(waiting: dict[Any, None]) -> bool:
    """Close the oldest of `waiting` still waiting for a request's headers; False if none."""
    for conn in waiting:
        if conn.waiting_for_headers():
            conn.transport.write(
                _raw_response(
                    "503 Service Unavailable",
                    "closed for a newer connection from the same "
                    "address: it has too many that have not sent a request",
                )
            )
            conn.transport.close()
            conn._trusted()  # noqa: SLF001 - no longer counted: it is closing
            return True
    return False


def _local(app: ASGIApp) -> ASGIApp:
    """`app`, with each request's scope marked as come from the server's own user on the local
    socket (`limits.Admission` then asks it for no key)."""

    async def local(scope: Scope, receive: Receive, send: Send) -> None:
        scope[LOCAL_PEER_KEY] = True
        await app(scope, receive, send)

    return local


def _marked(app: ASGIApp, trusted: Any) -> ASGIApp:
    """`app`, with the connection's callback for `limits.Admission` in each request's scope."""

    async def marked(scope: Scope, receive: Receive, send: Send) -> None:
        scope[TRUST_KEY] = trusted
        await app(scope, receive, send)

    return marked
