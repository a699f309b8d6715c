"""One client connection to a run's proxy listener, read with h11 (a small, well-kept HTTP/1.1
state machine that uvicorn already brings: no parser of ours, and it does no I/O, so the
proxy keeps control of every byte and its limits).

A CONNECT asks for a tunnel (TLS, not intercepted): once the destination is allowed and
connected, bytes are copied both ways. Any other request must carry an absolute `http://`
URL (forward proxying): it goes to its destination as an origin-form request with the Host
header taken from the URL, one upstream connection per request; the client's connection may
carry more requests, each decided on its own (a redirect the client follows is a new request,
checked like the first).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import TYPE_CHECKING, cast
from urllib.parse import urlsplit

import h11

from .allowlist import destination
from .audit import Dialled, Record
from .secrets import Binding, Masker, basic_tokens, forms, swap_headers

if TYPE_CHECKING:
    from .proxy import Egress

TLS_TIMEOUT_S = 10.0
MAX_HEAD = 16 * 1024  # the most one request or response head may take (as h11 by default)
CHUNK = 65536
# Headers about one hop, not the message (RFC 9110 7.6.1), and the proxy's own.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"upgrade",
    }
)


async def serve(egress: Egress, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Serve one client connection until it closes, errs or asks for a tunnel."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    while True:
        try:
            event = await _next(conn, reader)
        except h11.RemoteProtocolError as exc:
            await _answer(conn, writer, exc.error_status_hint, f"bad request: {exc}")
            return
        if not isinstance(event, h11.Request):
            return
        if event.method == b"CONNECT":
            await _tunnel(egress, conn, event, reader, writer)
            return
        if not await _forward(egress, conn, event, reader, writer):
            return
        if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            return
        conn.start_next_cycle()


async def _next(
    conn: h11.Connection,
    reader: asyncio.StreamReader,
    count: tuple[Egress, Record] | None = None,
) -> h11.Event | type[h11.PAUSED]:
    """The next event of `conn`, reading from `reader` as it needs (bytes read counted as
    `count`'s download when given)."""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await reader.read(CHUNK)
            if count is not None:
                egress, record = count
                egress.count(record, down=len(data))
            conn.receive_data(data)
            continue
        return cast(h11.Event | type[h11.PAUSED], event)  # h11's types keep NEED_DATA in


async def _answer(
    conn: h11.Connection, writer: asyncio.StreamWriter, status: int, text: str
) -> None:
    """Send the client an error of the proxy's own, and end the connection after it."""
    if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return
    body = (text + "\n").encode("utf-8", "replace")
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    try:
        data = conn.send(h11.Response(status_code=status, headers=headers))
        data = (data or b"") + (conn.send(h11.Data(data=body)) or b"")
        data += conn.send(h11.EndOfMessage()) or b""
    except h11.LocalProtocolError:
        return
    writer.write(data)
    await writer.drain()


async def _through_end(conn: h11.Connection, reader: asyncio.StreamReader) -> bool:
    """Read the rest of a request with no body of interest (CONNECT's); False if cut off."""
    while True:
        event = await _next(conn, reader)
        if isinstance(event, h11.EndOfMessage):
            return True
        if not isinstance(event, h11.Data):
            return False


def _authority(target: str) -> tuple[str, int] | None:
    """(host, port) of a CONNECT target `host:port` or `[v6]:port`."""
    if target.startswith("["):
        host, sep, port = target[1:].partition("]:")
    else:
        host, sep, port = target.rpartition(":")
    if not sep or not host or not _digits(port) or not 0 < int(port) < 65536:
        return None
    return host, int(port)


def _digits(text: str) -> bool:
    """ASCII digits only, few enough for a port (str.isdigit takes '²', which int refuses)."""
    return 0 < len(text) <= 5 and text.isascii() and text.isdigit()


async def _tunnel(
    egress: Egress,
    conn: h11.Connection,
    request: h11.Request,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    target = request.target.decode("latin-1")
    if not await _through_end(conn, reader):
        return
    where = _authority(target)
    if where is None:
        refused = egress.refuse("CONNECT", target, 0, "network.request", "not a host:port")
        await _answer(conn, writer, refused.status, f"CONNECT {target}: {refused.message}")
        return
    outcome = await egress.dial("CONNECT", *where, tunnel=True)
    if not isinstance(outcome, Dialled):
        await _answer(conn, writer, outcome.status, outcome.message)
        return
    bound = egress.bound_to(*where)
    if bound:
        await _intercept(egress, conn, outcome, where, bound, reader, writer)
        return
    record, up_r, up_w = outcome.record, outcome.reader, outcome.writer
    try:
        writer.write(conn.send(h11.Response(status_code=200, headers=[])) or b"")
        await writer.drain()
        rest, _closed = conn.trailing_data
        if rest:
            egress.count(record, up=len(rest))
            up_w.write(rest)
        copies = [
            asyncio.ensure_future(_copy(egress, record, reader, up_w, up=True)),
            asyncio.ensure_future(_copy(egress, record, up_r, writer, up=False)),
        ]
        try:
            await asyncio.gather(*copies)
        finally:  # one side failed (or the run ended): the other stops with it
            for copy in copies:
                copy.cancel()
            await asyncio.gather(*copies, return_exceptions=True)
    finally:
        up_w.transport.abort()
        record.end()


async def _intercept(
    egress: Egress,
    conn: h11.Connection,
    first: Dialled,
    where: tuple[str, int],
    bound: tuple[Binding, ...],
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    """A CONNECT to a host the run's secrets are bound to: TLS ended here with the run CA's
    certificate for the host, each request inside read and sent upstream over TLS of our own
    (verified), its placeholders swapped. Every request must name the CONNECT's host: a
    request on the same connection for another host is refused, never sent with the value."""
    name, port = destination(where[0]), where[1]
    assert egress.tls is not None and isinstance(name, str)  # bound: a name, intercepted
    host = name  # as the certificates name it: lower case, no trailing dot
    upstream: Dialled | None = first
    try:
        if not await _upstream_tls(egress, first, host, port):
            await _answer(conn, writer, 502, first.record.message or "")
            return
        # A host's first certificate takes milliseconds to make: off the loop other runs
        # share, and before the tunnel is granted (the client's first TLS bytes must find
        # the TLS layer in place, not the plain reader's buffer)
        loop = asyncio.get_running_loop()
        server = await loop.run_in_executor(None, egress.tls.ca.server_context, host)
        rest, _closed = conn.trailing_data
        if rest:  # TLS sent before the tunnel was granted: not a client we serve
            return
        writer.write(conn.send(h11.Response(status_code=200, headers=[])) or b"")
        await writer.drain()
        try:
            await writer.start_tls(server, ssl_handshake_timeout=TLS_TIMEOUT_S)
        except (ssl.SSLError, OSError, TimeoutError):
            return  # the run's client does not trust the run's CA: nothing was sent
        inner = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        authority = (host if port == 443 else f"{host}:{port}").encode("latin-1")
        while True:
            try:
                event = await _next(inner, reader)
            except h11.RemoteProtocolError as exc:
                await _answer(inner, writer, exc.error_status_hint, f"bad request: {exc}")
                return
            if not isinstance(event, h11.Request):
                return
            method = event.method.decode("latin-1")
            other = misdirected(event, host, port)
            if other is not None:
                refused = egress.refuse(
                    method,
                    other,
                    port,
                    "network.request",
                    (
                        f"a request in the TLS tunnel to {host}:{port} names {other}; "
                        "another host needs a CONNECT of its own"
                    ),
                )
                await _answer(inner, writer, 421, refused.message)
                return
            if upstream is None:
                outcome = await egress.dial(method, host, port, tunnel=True)
                if not isinstance(outcome, Dialled):
                    await _answer(inner, writer, outcome.status, outcome.message)
                    return
                upstream = outcome
                if not await _upstream_tls(egress, upstream, host, port):
                    await _answer(inner, writer, 502, upstream.record.message or "")
                    return
            dialled, upstream = upstream, None
            if not await _exchange(
                egress, inner, event, reader, writer, dialled, authority, event.target, bound
            ):
                return
            if inner.our_state is not h11.DONE or inner.their_state is not h11.DONE:
                return
            inner.start_next_cycle()
    finally:
        if upstream is not None:
            upstream.writer.transport.abort()
            upstream.record.end()


async def _upstream_tls(egress: Egress, dialled: Dialled, host: str, port: int) -> bool:
    """TLS over a connection the proxy dialled, the host's certificate verified for `host`;
    False (the record says why) when it fails."""
    assert egress.tls is not None
    try:
        await dialled.writer.start_tls(
            egress.tls.upstream, server_hostname=host, ssl_handshake_timeout=TLS_TIMEOUT_S
        )
    except (ssl.SSLError, OSError, TimeoutError) as exc:
        record = dialled.record
        record.verdict, record.rule = "failed", "network.tls"
        record.message = f"TLS to {host}:{port} failed: {exc}"
        return False
    return True


def misdirected(request: h11.Request, host: str, port: int) -> str | None:
    """What a request inside a tunnel to `host`:`port` names when that is something else
    (its Host header or an absolute target); None when it names the tunnel's host."""
    names = [v.decode("latin-1") for n, v in request.headers if n == b"host"]
    target = request.target.decode("latin-1")
    if not target.startswith("/"):
        return target[:300]  # an absolute URL, or '*': the tunnel carries paths only
    if len(names) != 1:
        return f"{len(names)} Host headers"
    asked = _host_header(names[0])
    if asked is None or asked[1] != port or destination(asked[0]) != destination(host):
        return names[0]
    return None


def _host_header(value: str) -> tuple[str, int] | None:
    """(host, port) of a Host header inside a TLS tunnel (port 443 when it names none)."""
    if value.startswith("[") and value.endswith("]"):
        return value[1:-1], 443
    if value.startswith("[") or ":" in value:
        return _authority(value)
    return value, 443


async def _copy(
    egress: Egress,
    record: Record,
    source: asyncio.StreamReader,
    sink: asyncio.StreamWriter,
    *,
    up: bool,
) -> None:
    """Copy until end of file, then half-close the other side; counted as `up` or down."""
    while True:
        data = await source.read(CHUNK)
        if not data:
            break
        egress.count(record, up=len(data) if up else 0, down=0 if up else len(data))
        sink.write(data)
        await sink.drain()
    if sink.can_write_eof() and not sink.is_closing():
        try:
            sink.write_eof()
        except OSError:
            pass


def _forward_headers(
    headers: list[tuple[bytes, bytes]], host: bytes, *, request: bool
) -> list[tuple[bytes, bytes]]:
    chunked = any(name == b"transfer-encoding" for name, _ in headers)
    kept = [
        (name, value)
        for name, value in headers
        if name not in HOP_BY_HOP
        and not (request and name in (b"host", b"expect"))
        # h11 frames the body by Transfer-Encoding: a Content-Length beside it would let
        # the next hop read the message differently
        and not (chunked and name == b"content-length")
    ]
    if request:
        kept = [(b"host", host), *kept, (b"connection", b"close")]
    return kept


async def _forward(
    egress: Egress,
    conn: h11.Connection,
    request: h11.Request,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> bool:
    """Forward one absolute-URL request; whether the client's connection may go on."""
    method = request.method.decode("latin-1")
    target = request.target.decode("latin-1")  # bytes as characters, one for one
    try:
        url = urlsplit(target)
        port = 80 if url.port is None else url.port  # ":0" is port 0, refused, not 80
    except ValueError:
        url, port = urlsplit(""), 0
    if url.scheme != "http" or not url.hostname:
        refused = egress.refuse(
            method,
            url.hostname or target,
            port,
            "network.request",
            "a request through the proxy needs an absolute http:// URL (use CONNECT for TLS)",
        )
        await _answer(conn, writer, refused.status, refused.message)
        return False
    outcome = await egress.dial(method, url.hostname, port)
    if not isinstance(outcome, Dialled):
        await _answer(conn, writer, outcome.status, outcome.message)
        return False
    host = url.netloc.rpartition("@")[2].encode("latin-1")
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    return await _exchange(
        egress, conn, request, reader, writer, outcome, host, path.encode("latin-1")
    )


async def _exchange(
    egress: Egress,
    conn: h11.Connection,
    request: h11.Request,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    upstream_conn: Dialled,
    host: bytes,
    target: bytes,
    bound: tuple[Binding, ...] = (),
) -> bool:
    """Send one request upstream (its placeholders of `bound` swapped for their values) and
    its response back; whether the client's connection may go on. The upstream connection
    ends with it."""
    record, up_r, up_w = upstream_conn.record, upstream_conn.reader, upstream_conn.writer
    try:
        headers = _forward_headers(list(request.headers), host, request=True)
        masker = None
        if bound:
            swapped = swap_headers(headers, bound)
            masker = Masker(forms(bound) + basic_tokens(headers, swapped))
            # An uncompressed, whole response, so that the value can be masked if the host
            # echoes it: a range of the body could cut an echo into pieces no mask matches
            headers = [(n, v) for n, v in swapped if n not in _WHOLE]
            headers.append((b"accept-encoding", b"identity"))
        upstream = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        head = h11.Request(method=request.method, target=target, headers=headers)
        await _send_up(egress, record, up_w, upstream.send(head))
        if not await _request_body(egress, record, conn, reader, writer, upstream, up_w):
            return False
        while True:  # the response
            event = await _next(upstream, up_r, (egress, record))
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                headers = _forward_headers(list(event.headers), b"", request=False)
                reason = event.reason
                if masker is not None:
                    if _encoded(headers):
                        await _answer(conn, writer, 502, _ENCODED.format(record.host))
                        return False
                    if event.status_code == 206:
                        await _answer(conn, writer, 502, _PARTIAL.format(record.host))
                        return False
                    headers, reason = masker.headers(headers), masker.whole(reason)
                out = h11.Response(status_code=event.status_code, headers=headers, reason=reason)
                writer.write(conn.send(out) or b"")
            elif isinstance(event, h11.Data):
                data = event.data if masker is None else masker.feed(event.data)
                if data:
                    writer.write(conn.send(h11.Data(data=data)) or b"")
                    await writer.drain()
            elif isinstance(event, h11.EndOfMessage):
                rest = b"" if masker is None else masker.end()
                if rest:
                    writer.write(conn.send(h11.Data(data=rest)) or b"")
                writer.write(conn.send(h11.EndOfMessage()) or b"")
                await writer.drain()
                return True
            else:
                return False
    except h11.ProtocolError:
        await _answer(conn, writer, 502, f"bad response from {record.host}:{record.port}")
        return False
    finally:
        up_w.transport.abort()
        record.end()


async def _request_body(
    egress: Egress,
    record: Record,
    conn: h11.Connection,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    upstream: h11.Connection,
    up_w: asyncio.StreamWriter,
) -> bool:
    """Copy a request's body upstream; False if the client's message ended badly."""
    while True:
        if conn.they_are_waiting_for_100_continue:
            writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])))
        event = await _next(conn, reader)
        if isinstance(event, h11.Data):
            await _send_up(egress, record, up_w, upstream.send(h11.Data(data=event.data)))
        elif isinstance(event, h11.EndOfMessage):
            await _send_up(egress, record, up_w, upstream.send(h11.EndOfMessage()))
            return True
        else:
            return False


_WHOLE = frozenset({b"accept-encoding", b"range", b"if-range"})
_PARTIAL = (
    "{} answered with part of a body (206), which the proxy cannot check for the secret bound "
    "to it (it asked for the whole body)"
)
_ENCODED = (
    "{} answered with a compressed body, which the proxy cannot check for the secret bound "
    "to it (it asked for identity)"
)


def _encoded(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a response's body is compressed (masking needs the bytes as sent)."""
    return any(
        n == b"content-encoding" and v.strip().lower() not in (b"", b"identity") for n, v in headers
    )


async def _send_up(
    egress: Egress, record: Record, writer: asyncio.StreamWriter, data: bytes | None
) -> None:
    if data:
        egress.count(record, up=len(data))
        writer.write(data)
        await writer.drain()
