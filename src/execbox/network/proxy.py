"""The host-side egress proxy: one asyncio loop in a thread of the executor, serving the
listeners of the runs that have a network policy (`Egress`, one per run).

Per run it decides each destination (`dial`): the allowlist says whether the host and port
may be asked for; the proxy, never the run, resolves the name; every address it would dial is
checked (`allowlist.refused_range`) and the connection goes to the very address that was
checked, so a name cannot rebind between the check and the connect. It counts every byte and
connection against the run's limits and ends the run (through `on_limit`) when it passes
one. Every destination asked for, allowed or not, is one entry of the run's log.
HTTP itself is read by h11 (see `relay`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import h11

from . import relay
from .allowlist import Allowlist, IPAddress, destination, refused_range
from .audit import Dialled, LimitReached, Record, Refused
from .secrets import Binding

if TYPE_CHECKING:
    from .intercept import RunCA

RESOLVE_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0
MAX_CLIENTS = 64  # connections to one run's listener open at once; more are closed at once
CLOSE_WAIT_S = 10.0
RESOLVE_THREADS = 32
RESOLVING_PER_RUN = 2
# A host as asked for is kept to this many characters in the log and its messages (a DNS
# name has at most 253): a refused target can be as long as a request head.
MAX_HOST_CHARS = 300
MAX_METHOD_CHARS = 32


@dataclass(frozen=True)
class Interception:
    """What a run with bound secrets adds to its proxy: the bindings, the run's CA, and how
    the proxy verifies the hosts it intercepts."""

    bindings: tuple[Binding, ...]
    ca: RunCA
    upstream: ssl.SSLContext


@dataclass(frozen=True)
class NetworkLimits:
    """What one run may use through the proxy."""

    bytes: int  # up and down together, every connection of the run
    connections: int  # destinations asked for (each CONNECT, each forwarded request)


class Egress:
    """One run's use of the proxy: its listener, allowlist, limits, connections and log.
    Made and ended by `EgressProxy`; its coroutines run on the proxy's loop."""

    def __init__(
        self,
        allow: Allowlist,
        limits: NetworkLimits,
        pinned: Mapping[str, tuple[IPAddress, ...]],
        on_limit: Callable[[str], None],
        tls: Interception | None = None,
    ) -> None:
        self.allow = allow
        self.tls = tls
        self.limits = limits
        self.pinned = pinned
        self.on_limit = on_limit
        self.records: list[Record] = []
        self.used_bytes = 0
        # Lookups block a thread of the proxy's pool each: a run's slow names (a wildcard
        # entry's own DNS server, say) hold RESOLVING_PER_RUN of them at most.
        self.resolving = asyncio.Semaphore(RESOLVING_PER_RUN)
        self.limit_message: str | None = None
        self.closed = False
        self.tasks: set[asyncio.Task[None]] = set()
        self.writers: set[asyncio.StreamWriter] = set()
        self.server: asyncio.Server | None = None

    async def start(self, listener: socket.socket) -> None:
        self.server = await asyncio.start_server(self._client, sock=listener)

    async def stop(self) -> None:
        """Stop listening (the listener is closed here), end every connection."""
        self.closed = True
        if self.server is not None:
            self.server.close()
        for writer in list(self.writers):
            writer.transport.abort()
        tasks = [t for t in self.tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for record in self.records:
            record.end()

    def log(self) -> list[dict[str, Any]]:
        return [r.as_dict() for r in self.records]

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if self.closed or len(self.tasks) >= MAX_CLIENTS or task is None:
            writer.transport.abort()
            return
        self.tasks.add(task)
        self.writers.add(writer)
        _no_delay(writer)
        try:
            await relay.serve(self, reader, writer)
        except (LimitReached, OSError, h11.ProtocolError):
            pass  # the connection ends; what it asked for is in the log
        except asyncio.CancelledError:
            pass  # `stop`: the task ends here, not as cancelled (asyncio would log that)
        finally:
            self.writers.discard(writer)
            writer.close()  # after what it was last sent (stop and trip abort at once)
            self.tasks.discard(task)

    def bound_to(self, host: str, port: int) -> tuple[Binding, ...]:
        """The run's secrets bound to `host`:`port` (a CONNECT's as asked for)."""
        if self.tls is None:
            return ()
        dest = destination(host)
        if not isinstance(dest, str):  # an address: no secret is bound to one
            return ()
        return tuple(b for b in self.tls.bindings if b.serves(dest, port))

    def _guarded(self, dest: str | IPAddress, port: int, *, tunnel: bool) -> str | None:
        """Why `dest`:`port` is refused for being a bound host's other face: a host a secret
        is bound to is reached only through the intercepted HTTPS of its bound ports (where
        responses are masked), never by plain http or another port, where a value it stored
        would come back as it is."""
        if self.tls is None or not isinstance(dest, str):
            return None
        names = [b.name for b in self.tls.bindings if b.covers(dest)]
        if not names or (tunnel and any(b.serves(dest, port) for b in self.tls.bindings)):
            return None
        how = "a CONNECT to that port" if tunnel else "plain http"
        return (
            f"{dest} has the secret {names[0]} bound to it: {how} is refused (the host is "
            "reached only through HTTPS on the binding's ports, where its answers are masked)"
        )

    # ---- limits ---------------------------------------------------------------------------

    def trip(self, message: str) -> None:
        """End the run for passing a limit (once), and every connection with it."""
        if self.limit_message is None:
            self.limit_message = message
            self.on_limit(message)
            for writer in list(self.writers):
                writer.transport.abort()
        raise LimitReached(message)

    def count(self, record: Record, up: int = 0, down: int = 0) -> None:
        """Account bytes about to be sent up or just read down; LimitReached past the cap."""
        if self.limit_message is not None:
            raise LimitReached(self.limit_message)
        if self.used_bytes + up + down > self.limits.bytes:
            self.trip(
                f"network traffic passed {self.limits.bytes} bytes; "
                "raise limits.network_bytes (CLI --network-bytes)"
            )
        self.used_bytes += up + down
        record.bytes_up += up
        record.bytes_down += down

    # ---- destinations ---------------------------------------------------------------------

    def refuse(self, method: str, host: str, port: int, rule: str, message: str) -> Refused:
        """Log a request refused before any destination was chosen (a bad target)."""
        host, method = host[:MAX_HOST_CHARS], method[:MAX_METHOD_CHARS]
        record = self._admit(Record(time.time(), method, host, port, rule=rule, message=message))
        record.end()
        return Refused(400, message)

    async def dial(
        self, method: str, host: str, port: int, *, tunnel: bool = False
    ) -> Dialled | Refused:
        """Decide `host`:`port` (`tunnel`: for a CONNECT, not a plain http request) and, if
        allowed, connect to the checked address."""
        shown, method = host[:MAX_HOST_CHARS], method[:MAX_METHOD_CHARS]
        record = self._admit(Record(time.time(), method, shown, port))
        try:
            if len(host) > MAX_HOST_CHARS:  # no name is this long: refused, not cut to one
                return _deny(record, "network.host", f"{shown}...: not a host name")
            return await self._dial(record, host, port, tunnel)
        finally:
            if record.verdict != "allowed":
                record.end()

    def _admit(self, record: Record) -> Record:
        """Log `record`, one of the run's `limits.connections` (refused ones count too: each
        is a line of the log); past the cap the run ends."""
        if self.limit_message is not None:
            raise LimitReached(self.limit_message)
        self.records.append(record)
        if len(self.records) > self.limits.connections:
            record.rule = "network.limit"
            record.message = f"more than {self.limits.connections} connections"
            record.end()
            self.trip(
                f"the run asked for more than {self.limits.connections} network connections; "
                "raise limits.network_connections (CLI --network-connections)"
            )
        return record

    async def _dial(self, record: Record, host: str, port: int, tunnel: bool) -> Dialled | Refused:
        dest = destination(host)
        if dest is None:
            return _deny(record, "network.host", f"{host!r} is not a host name or an address")
        entry = self.allow.entry_for(dest, port)
        if entry is None:
            if self.allow.host_listed(dest):
                return _deny(record, "network.port", f"port {port} of {host} is not allowed")
            return _deny(record, "network.host", f"{host} is not on the run's allowlist")
        record.entry = entry.text
        guarded = self._guarded(dest, port, tunnel=tunnel)
        if guarded is not None:
            return _deny(record, "network.bound", guarded)
        pinned = self.pinned.get(dest) if isinstance(dest, str) else None
        if isinstance(dest, str) and pinned is None:
            try:
                async with self.resolving:
                    addresses = await _resolve(dest, port)
            except (OSError, TimeoutError) as exc:
                record.verdict, record.rule = "failed", "network.resolve"
                record.message = f"cannot resolve {host}: {exc}"
                return Refused(502, record.message)
        else:
            addresses = pinned or (dest,)  # type: ignore[assignment]
        refusal = None
        error: BaseException | None = None
        for address in addresses:
            why = refused_range(address)
            if why and not (pinned or self.allow.names_exactly(address)):
                refusal = f"{host} resolves to {address}, {why}, which no entry names"
                continue
            try:
                reader, writer = await _connect(address, port)
            except (OSError, TimeoutError) as exc:
                error = exc
                record.address = str(address)
                continue
            record.address = str(address)
            record.verdict, record.rule = "allowed", "network.allow"
            return Dialled(record, reader, writer)
        if error is None and refusal is not None:
            return _deny(record, "network.address", refusal)
        record.verdict, record.rule = "failed", "network.connect"
        record.message = f"cannot connect to {host}:{port}: {error}"
        return Refused(502, record.message)


def _deny(record: Record, rule: str, message: str) -> Refused:
    record.verdict, record.rule, record.message = "denied", rule, message
    return Refused(403, message)


async def _resolve(name: str, port: int) -> tuple[IPAddress, ...]:
    loop = asyncio.get_running_loop()
    infos = await asyncio.wait_for(
        loop.getaddrinfo(name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP),
        RESOLVE_TIMEOUT_S,
    )
    seen: dict[IPAddress, None] = {}
    for _family, _type, _proto, _name, sockaddr in infos:
        seen[ipaddress.ip_address(sockaddr[0])] = None
    if not seen:
        raise OSError(f"no address for {name}")
    return tuple(seen)


async def _connect(
    address: IPAddress, port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to exactly `address` (a socket we make and connect: no name lookup)."""
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(loop.sock_connect(sock, (str(address), port)), CONNECT_TIMEOUT_S)
        reader, writer = await asyncio.open_connection(sock=sock)
        _no_delay(writer)
        return reader, writer
    except BaseException:
        sock.close()
        raise


def _no_delay(writer: asyncio.StreamWriter) -> None:
    """Send small writes at once. asyncio sets TCP_NODELAY only on sockets whose proto is
    IPPROTO_TCP, and ours (made with proto 0, and accepted from one) are not: the second of a
    response's two writes (head, body) would wait for the client's delayed ACK of the first."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class EgressProxy:
    """The proxy's loop and thread, started at the first network run; `resolve` pins names
    to addresses (an operator's setting, like curl --resolve: pinned addresses count as
    named exactly)."""

    def __init__(
        self, resolve: Mapping[str, Sequence[str]] | None = None, ca_file: str | None = None
    ) -> None:
        self.ca_file = ca_file
        self._upstream: ssl.SSLContext | None = None
        self._system_cas: bytes | None = None
        self.pinned: dict[str, tuple[IPAddress, ...]] = {}
        for name, addresses in (resolve or {}).items():
            host = destination(name)
            if not isinstance(host, str):
                raise ValueError(f"network_resolve: {name!r} is not a host name")
            if isinstance(addresses, str):
                addresses = [addresses]
            self.pinned[host] = tuple(ipaddress.ip_address(a) for a in addresses)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def interception(self, bindings: Sequence[Binding], valid_s: float) -> Interception:
        """A run's CA, valid for `valid_s` seconds (and a margin), and the rest its bound
        secrets need (the trust stores read once)."""
        from .intercept import RunCA, system_cas, upstream_context  # slow to import: late

        with self._lock:
            if self._upstream is None:
                self._upstream = upstream_context(self.ca_file)
                self._system_cas = system_cas()
            upstream, system = self._upstream, self._system_cas or b""
        names = [e.host for b in bindings for e in b.hosts if e.host is not None]
        return Interception(tuple(bindings), RunCA(system, valid_s, names), upstream)

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                # Name lookups: a pool of the proxy's own, wide enough that a few runs with
                # slow names leave lookups for the others.
                loop.set_default_executor(
                    ThreadPoolExecutor(RESOLVE_THREADS, thread_name_prefix="execbox-resolve")
                )
                thread = threading.Thread(
                    target=loop.run_forever, name="execbox-egress-proxy", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def open(
        self,
        listener: socket.socket,
        allow: Allowlist,
        limits: NetworkLimits,
        on_limit: Callable[[str], None],
        tls: Interception | None = None,
    ) -> Egress:
        """Serve `listener` (owned from here on) for one run."""
        loop = self._running()
        egress = Egress(allow, limits, self.pinned, on_limit, tls)
        try:
            asyncio.run_coroutine_threadsafe(egress.start(listener), loop).result(CLOSE_WAIT_S)
        except BaseException:
            listener.close()
            raise
        return egress

    def end(self, egress: Egress) -> list[dict[str, Any]]:
        """Close the run's listener and connections; its log."""
        loop = self._running()
        asyncio.run_coroutine_threadsafe(egress.stop(), loop).result(CLOSE_WAIT_S)
        return egress.log()

    def close(self) -> None:
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(CLOSE_WAIT_S)
            loop.close()
