"""The hot path between a caller and a node's host: a TCP connection of their own.

Ray places the hosts, leases them and says when a node is gone; a run (and a session's cell)
then goes to its host over a plain socket instead of a Ray actor call, which would wake
Ray's submission, gRPC and task-pool threads on each side for every run. A caller's thread
writes one frame (an 8-byte length, then pickle bytes) and reads one back on a connection it
holds for that call; the host's thread for that connection runs the call itself.

The host listens on its node's Ray address, on a port of the kernel's choosing, and takes
only connections whose first bytes are its token: random bytes it hands out through Ray
(`NodeHost.ready`), so nothing is unpickled from a peer that did not get them from Ray.
This module imports no Ray.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import socket
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

HEADER = struct.Struct("!Q")
CHUNK = 65536  # what the first read of a frame asks for: most answers fit
TOKEN_BYTES = 32
HELLO_S = 5.0  # how long a new connection has to present the token, all told
# Connections still to present the token, at most: a new one past it ends the oldest, so
# strangers cannot spend the host's threads and fds, nor keep callers from being accepted.
MAX_HELLOS = 64
EVICT_AFTER_S = 0.5  # how long a waiting connection is safe from being ended for a newer one
CONNECT_S = 2.0  # a host that does not take a connection in this long is not reachable
ACCEPT_RETRY_S = 0.1


def ray_tls(environ: Mapping[str, str]) -> bool:
    """Whether Ray's own connections use TLS (as Ray reads RAY_USE_TLS). This channel has no
    encryption: under Ray's TLS it would send the token, code and secrets in the clear."""
    return environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")


class ChannelBroken(OSError):
    """The connection to the host closed or failed under a call."""


class Unreachable(ChannelBroken):
    """No connection to the host could be made: nothing of the call was sent."""


def send_frame(sock: socket.socket, payload: bytes) -> None:
    header = HEADER.pack(len(payload))
    if len(payload) <= CHUNK:
        sock.sendall(header + payload)  # one segment: the peer wakes once
    else:
        sock.sendall(header)
        sock.sendall(payload)


def recv_frame(sock: socket.socket) -> bytes:
    """One frame's payload; ChannelBroken when the peer closed first."""
    first = sock.recv(CHUNK)
    while len(first) < HEADER.size:
        more = sock.recv(CHUNK)
        if not more:
            raise ChannelBroken("the connection closed")
        first += more
    (size,) = HEADER.unpack_from(first)
    got = len(first) - HEADER.size
    if got == size:
        return first[HEADER.size :]
    if got > size:  # one call at a time on a connection: nothing may follow a frame
        raise ChannelBroken("a frame longer than it said")
    buf = bytearray(size)
    view = memoryview(buf)
    view[:got] = first[HEADER.size :]
    while got < size:
        n = sock.recv_into(view[got:])
        if not n:
            raise ChannelBroken("the connection closed mid-frame")
        got += n
    return bytes(buf)


class Listener:
    """The host's end: accepts callers that present `token` and answers each frame with
    `handle(frame)`, on a thread per connection."""

    def __init__(self, address: str, handle: Callable[[bytes], bytes]) -> None:
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self._handle = handle
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._server = socket.create_server((address, 0), family=family, backlog=128)
        self.address = (address, int(self._server.getsockname()[1]))
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        # Connections yet to present the token, oldest first, with when each came.
        self._waiting: OrderedDict[socket.socket, float] = OrderedDict()
        self._closed = False
        threading.Thread(target=self._accept, name="execbox-direct", daemon=True).start()

    def _accept(self) -> None:
        while self._room():
            try:
                conn, _ = self._server.accept()
            except OSError as exc:
                if self._closed:
                    return
                # Out of descriptors, say: callers wait in the backlog meanwhile.
                log.warning("direct channel: accept failed: %s", exc)
                time.sleep(ACCEPT_RETRY_S)
                continue
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._conns.add(conn)
                self._waiting[conn] = time.monotonic()
            try:
                threading.Thread(
                    target=self._serve, args=(conn,), name="execbox-direct-conn", daemon=True
                ).start()
            except RuntimeError as exc:  # no thread to be had: this peer is refused, not all
                log.warning("direct channel: cannot serve a connection: %s", exc)
                with self._lock:
                    self._conns.discard(conn)
                    self._waiting.pop(conn, None)
                conn.close()
                time.sleep(ACCEPT_RETRY_S)

    def _room(self) -> bool:
        """Wait until fewer than MAX_HELLOS connections wait to show the token, ending the
        oldest once it has had EVICT_AFTER_S; False when the listener closed."""
        while True:
            with self._lock:
                if self._closed:
                    return False
                if len(self._waiting) < MAX_HELLOS:
                    return True
                oldest, since = next(iter(self._waiting.items()))
                wait = since + EVICT_AFTER_S - time.monotonic()
                if wait <= 0:
                    del self._waiting[oldest]
            if wait <= 0:
                _wake(oldest)
            else:  # a caller's token may just not have been read yet
                time.sleep(min(wait, ACCEPT_RETRY_S))

    def _hello(self, conn: socket.socket) -> bool:
        """Whether `conn` presents the token within HELLO_S of its arrival, and before `_room`
        ends it for a newer connection."""
        deadline = time.monotonic() + HELLO_S
        hello = b""
        try:
            while len(hello) < TOKEN_BYTES:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                conn.settimeout(left)  # a peer sending a byte at a time gets no longer
                more = conn.recv(TOKEN_BYTES - len(hello))
                if not more:
                    return False
                hello += more
        finally:
            with self._lock:
                pushed_out = self._waiting.pop(conn, None) is None
        if pushed_out:
            return False
        if not hmac.compare_digest(hello, self.token):
            log.warning("direct channel: a connection without the token, closed")
            return False
        return True

    def _serve(self, conn: socket.socket) -> None:
        try:
            if not self._hello(conn):
                return
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                frame = recv_frame(conn)
                send_frame(conn, self._handle(frame))
        except OSError:  # the caller left (or this listener closed): nothing to answer
            return
        except Exception:  # a bug here: the caller sees the connection close, not a hang
            log.exception("direct channel: a call failed")
            return
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def close(self) -> None:
        """Stop accepting and end every connection (a call in flight sees it closed)."""
        with self._lock:
            self._closed = True
            conns = list(self._conns)
        try:
            self._server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._server.close()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _wake(conn: socket.socket) -> None:
    """End `conn` under the thread reading it (that thread closes it)."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class Client:
    """A caller's end: connections to one host, each used by one call at a time and kept for
    the next. `close` ends them all, a call in flight included (it raises ChannelBroken)."""

    def __init__(self, address: tuple[str, int], token: bytes) -> None:
        self.address = address
        self._token = token
        self._lock = threading.Lock()
        self._idle: list[socket.socket] = []
        self._busy: set[socket.socket] = set()
        self._closed = False

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self.address, timeout=CONNECT_S)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(self._token)
        except OSError:
            sock.close()
            raise
        return sock

    def _take(self) -> socket.socket:
        with self._lock:
            if self._closed:
                raise ChannelBroken("the channel was closed")
            sock = self._idle.pop() if self._idle else None
        if sock is None:
            try:
                sock = self._connect()
            except OSError as exc:
                raise Unreachable(f"cannot connect: {exc}") from exc
        with self._lock:
            if self._closed:
                sock.close()
                raise ChannelBroken("the channel was closed")
            self._busy.add(sock)
        return sock

    def call(self, payload: bytes, timeout_s: float) -> bytes:
        """The host's answer to `payload`: TimeoutError past `timeout_s`, ChannelBroken when
        the connection failed (the host died, or this client was closed)."""
        sock = self._take()
        kept = False
        try:
            sock.settimeout(timeout_s)
            send_frame(sock, payload)
            answer = recv_frame(sock)
            kept = True
            return answer
        except TimeoutError:
            raise
        except ChannelBroken:
            raise
        except OSError as exc:
            raise ChannelBroken(str(exc)) from exc
        finally:
            with self._lock:
                self._busy.discard(sock)
                kept = kept and not self._closed
                if kept:
                    self._idle.append(sock)
            if not kept:  # a late answer must never be read as the next call's
                sock.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, busy = self._idle, list(self._busy)
            self._idle = []
        for sock in idle:
            sock.close()
        for sock in busy:  # the calling thread closes it; this wakes its read
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
