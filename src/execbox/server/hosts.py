"""Which host names the server answers to: the defence against DNS rebinding.

A page the operator opens (evil.example) can have its name re-resolved to 127.0.0.1 once it
has loaded; the browser then sends the page's requests, as same-origin ones it may read, to a
server on loopback. Every such request still names the attacker's site in its Host header, so
the server answers only requests whose Host is a name it was told is its own:

- an address (`127.0.0.1`, `[::1]`, `10.0.0.5`) always passes: a browser sends one only to
  that address, so the page that sent it was this server's own;
- `localhost` always passes: browsers resolve it to loopback themselves, never by DNS;
- any other name passes only if `--allowed-host` lists it (`api.example.com`, or a wildcard
  `*.example.com` for its subdomains; `*` lets every name through, for a proxy that checks).
  Ports are not compared: the attacker's page must use the server's port to reach it at all.

Requests on the local socket pass (no browser reaches a Unix socket), and so do /healthz and
/readyz (they read nothing, and probes send whatever Host their orchestrator knows). Every other
request without exactly one well-formed Host, or whose target is not a path (absolute-form
`GET http://evil/ HTTP/1.1`, which RFC 9112 lets a server prefer over Host), is refused with 400;
a name not allowed, with 421. Both answer before any of the body is read.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from typing import NamedTuple

from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import UsageError
from .errors import ApiError
from .limits import E2B_PREFIX, send_error
from .local import LOCAL_PEER_KEY

ALWAYS = ("localhost",)
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
ENV = "EXECBOX_ALLOWED_HOSTS"
FLAG = "--allowed-host"

# A DNS name as a Host header carries it (RFC 3986 reg-name, without percent-encoding).
_NAME = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")
_PORT = re.compile(r"[0-9]{0,5}")


class Host(NamedTuple):
    """A Host header's host, lower-cased, without its port or a trailing dot."""

    name: str
    address: bool
    """An IP address literal (IPv6 given in brackets), not a DNS name."""


def parse_host(value: str) -> Host | None:
    """The host named by a Host header's value; None if it is not a well-formed one."""
    value = value.lower()
    if value.startswith("["):
        inner, bracket, port = value[1:].partition("]")
        if not bracket or (port and not (port[0] == ":" and _PORT.fullmatch(port[1:]))):
            return None
        try:
            ipaddress.IPv6Address(inner)
        except ValueError:
            return None
        return None if "%" in inner else Host(inner, True)
    name, colon, port = value.partition(":")
    if colon and not _PORT.fullmatch(port):
        return None
    name = name.removesuffix(".")
    if not _NAME.fullmatch(name):
        return None
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        return Host(name, False)
    return Host(name, True)


class AllowedHosts:
    """The names a server answers to, beside addresses and `localhost` (see the module)."""

    def __init__(self, patterns: Iterable[str] = ()) -> None:
        """`patterns`: names, `*.suffix` wildcards, or `*`; a bad one is a UsageError."""
        self.any = False
        self.names: set[str] = set(ALWAYS)
        self.suffixes: list[str] = []
        self.patterns: tuple[str, ...] = tuple(split_patterns(patterns))
        for pattern in self.patterns:
            self._add(pattern)

    def _add(self, pattern: str) -> None:
        given = pattern.lower()
        if given == "*":
            self.any = True
            return
        bare = given.removeprefix("*.")
        host = parse_host(bare)
        if host is None or bare.removesuffix(".") not in (host.name, f"[{host.name}]"):
            raise UsageError(
                f"{FLAG} {pattern!r}: give a host name (api.example.com), a wildcard for its "
                "subdomains (*.example.com) or * for any, without a port (ports are not "
                "compared)"
            )
        if host.address and bare != given:
            raise UsageError(f"{FLAG} {pattern!r}: a wildcard takes a name, not an address")
        if host.address:
            return  # an address is always answered
        if bare != given:
            self.suffixes.append("." + host.name)
        else:
            self.names.add(host.name)

    def allows(self, host: Host) -> bool:
        return (
            host.address
            or self.any
            or host.name in self.names
            or any(host.name.endswith(suffix) for suffix in self.suffixes)
        )


def split_patterns(values: Iterable[str]) -> list[str]:
    """Each value may hold several patterns, separated by commas or white space (as the
    environment variable gives them)."""
    return [p for value in values for p in re.split(r"[\s,]+", value) if p]


def default_patterns(bind: str) -> tuple[str, ...]:
    """What a server bound to `bind` answers to when no --allowed-host is given: on loopback,
    addresses and localhost only; elsewhere also the machine's host name (and `bind`, if it
    is a name)."""
    if bind == "localhost" or _loopback(bind):
        return ()
    names = []
    for name in {socket.gethostname(), bind}:
        host = parse_host(name)
        if host is not None and not host.address:
            names.append(host.name)
    return tuple(sorted(names))


def _loopback(bind: str) -> bool:
    try:
        return ipaddress.ip_address(bind.strip("[]")).is_loopback
    except ValueError:
        return False


class HostCheck:
    """ASGI middleware, outermost: refuse a request whose Host this server does not answer
    to (or whose target is not a path) before anything else looks at it."""

    def __init__(
        self,
        app: ASGIApp,
        allowed: AllowedHosts,
        refused: Callable[[str], None] | None = None,
        open_paths: frozenset[str] = OPEN_PATHS,
    ) -> None:
        self.app = app
        self.allowed = allowed
        self.refused = refused
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] not in ("http", "websocket")
            or scope.get(LOCAL_PEER_KEY)
            or scope["path"] in self.open_paths
            or (err := self.check(scope)) is None
        ):
            await self.app(scope, receive, send)
            return
        if self.refused is not None:
            self.refused(err.code)
        if scope["type"] == "websocket":  # closed before its handshake: an HTTP 403
            await send({"type": "websocket.close", "code": 1008})
            return
        await send_error(send, err, e2b=scope["path"].startswith(E2B_PREFIX))

    def check(self, scope: Scope) -> ApiError | None:
        """The refusal this request gets, or None."""
        target = scope.get("raw_path") or scope["path"].encode()
        if not target.startswith(b"/"):
            return ApiError(
                400,
                "bad_request_target",
                "the request's target must be a path (/v1/...), not a URL or '*'",
            )
        given = [value for name, value in scope.get("headers", ()) if name == b"host"]
        if len(given) != 1:
            return ApiError(
                400,
                "bad_host",
                "a request needs exactly one Host header"
                if given
                else "the Host header is missing",
            )
        value = given[0].decode("latin-1")
        host = parse_host(value)
        if host is None:
            return ApiError(400, "bad_host", f"the Host header {value[:100]!r} is not a host name")
        if self.allowed.allows(host):
            return None
        return ApiError(
            421,
            "host_not_allowed",
            f"this server does not answer to the host {host.name[:100]!r}: a page of another "
            "site may have renamed itself to reach it (DNS rebinding). If that is this "
            f"server's name, start it with {FLAG} {host.name[:100]} (or {ENV})",
        )
