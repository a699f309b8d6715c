"""Slow and greedy clients, at the connection: uvicorn's HTTP/1.1 protocol (h11) with the
timeouts and the cap it lacks.

h11 waits for a request's headers and body as long as the client likes, and uvicorn caps
connections only server-wide; so a client that opens many connections and sends each a few
bytes now and then holds file descriptors and memory forever. Here a request's line and headers
must arrive within `header_timeout_s` of its first byte (or of the connection's opening, or of
the previous response), else 408 and the connection is closed; its body within `body_timeout_s`
of its headers, else the connection is closed; and one client address holds at most
`max_per_client` connections at once (more are answered 503 and closed).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def _raw_response(status: str, message: str) -> bytes:
    body = json.dumps({"error": {"code": "connection_refused" if status.startswith("503")
                                 else "request_timeout", "message": message}}).encode()
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


def guarded_protocol(header_timeout_s: float, body_timeout_s: float,
                     max_per_client: int) -> type[H11Protocol]:
    """An h11 protocol class for `uvicorn.Config(http=...)`, one per server: its connection
    counts are shared by the connections of that server only."""
    open_by_client: Counter[str] = Counter()

    class Guarded(H11Protocol):
        _timer: asyncio.TimerHandle | None = None
        _counted: str | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            host = self.client[0] if self.client else None
            if host is not None and max_per_client:
                if open_by_client[host] >= max_per_client:
                    self.transport.write(_raw_response(
                        "503 Service Unavailable",
                        f"this client already has {max_per_client} connections open (execbox "
                        "serve --max-connections-per-client); reuse one"))
                    self.transport.close()
                    return
                open_by_client[host] += 1
                self._counted = host
            self._arm(header_timeout_s, self._headers_late)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._counted is not None:
                open_by_client[self._counted] -= 1
                if not open_by_client[self._counted]:
                    del open_by_client[self._counted]
                self._counted = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            before = self.conn.their_state
            super().data_received(data)
            after = self.conn.their_state
            if after is h11.SEND_BODY and before is not h11.SEND_BODY:
                self._arm(body_timeout_s, self._body_late)
            elif after is not h11.SEND_BODY and before is h11.SEND_BODY or \
                    before is h11.IDLE and after is not h11.IDLE:
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                # The next request's headers are due too: keep-alive's own timeout covers
                # only a connection where nothing at all arrives.
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
                self.transport.write(_raw_response(
                    "408 Request Timeout", f"the request's headers did not arrive within "
                    f"{header_timeout_s:g} s (execbox serve --header-timeout)"))
                self.transport.close()

        def _body_late(self) -> None:
            self._timer = None
            if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
                self.transport.close()  # the app sees a disconnect; no answer can be framed

    return Guarded
