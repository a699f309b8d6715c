"""A run's network allowlist: `host[:port]` entries, what a destination matches, which
addresses are refused after resolution, and whether a request's entries fall within a
profile's patterns. Pure functions and values; no I/O."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_PORTS = frozenset({80, 443})
MAX_ENTRIES = 64
ANY = "*"  # a profile pattern's host: any name (never an address), or its port: any port

_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)\Z")
_METADATA = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


@dataclass(frozen=True)
class Entry:
    """One allowlist entry. `host` is a lower-case name, `*.suffix` (any name under suffix,
    not suffix itself), ANY (profile patterns only), or None when `network` is an address or
    CIDR block. `ports` None means any port (profile patterns only)."""

    text: str
    host: str | None
    network: IPNetwork | None
    ports: frozenset[int] | None

    @property
    def exact_address(self) -> IPAddress | None:
        """The one address this entry names, when it names exactly one."""
        if self.network is not None and self.network.num_addresses == 1:
            return self.network.network_address
        return None

    def matches(self, host: str | IPAddress, port: int) -> bool:
        """Whether a destination (a normalised name, or an address) falls under this entry."""
        if self.ports is not None and port not in self.ports:
            return False
        return self.covers_host(host)

    def covers_host(self, host: str | IPAddress) -> bool:
        if isinstance(host, str):
            if self.host is None:
                return False
            if self.host == ANY:
                return True
            if self.host.startswith("*."):
                return host.endswith(self.host[1:])
            return host == self.host
        return self.network is not None and host in self.network


def parse_entry(text: str, *, pattern: bool = False) -> Entry:
    """An entry from its text: `name[:port]`, `*.suffix[:port]`, `address[:port]` (IPv6 in
    brackets when a port follows), `cidr[:port]`. With `pattern` (a profile's
    `network_allow`), also `*` for any name and `:*` for any port. ValueError says what is
    wrong."""
    if not isinstance(text, str):
        raise ValueError(f"a network entry must be a string, not {type(text).__name__}")
    raw = text.strip().lower()
    host_part, port_part = _split_port(raw, text)
    ports: frozenset[int] | None
    if port_part is None:
        ports = DEFAULT_PORTS
    elif port_part == ANY and pattern:
        ports = None
    else:
        ports = frozenset({_port(port_part, text)})
    if host_part == ANY and pattern:
        return Entry(raw, ANY, None, ports)
    address = _address_or_network(host_part)
    if address is not None:
        return Entry(raw, None, address, ports)
    if host_part.startswith("*."):
        suffix = host_part[2:]
        if not valid_name(suffix) or "." not in suffix:
            raise ValueError(
                f"network entry {text!r}: a wildcard covers the names under a domain of at "
                "least two labels, as in '*.example.com'"
            )
        return Entry(raw, host_part, None, ports)
    if not valid_name(host_part):
        raise ValueError(
            f"network entry {text!r} is not a host name, address or CIDR block "
            "(a name is ASCII letters, digits, '-' and '_' in dot-separated labels, "
            "not all digits in the last; use the punycode form of an international name)"
        )
    return Entry(raw, host_part, None, ports)


def parse_entries(texts: list[str], *, pattern: bool = False) -> tuple[Entry, ...]:
    if len(texts) > MAX_ENTRIES:
        raise ValueError(f"{len(texts)} network entries; at most {MAX_ENTRIES}")
    return tuple(parse_entry(t, pattern=pattern) for t in texts)


def _split_port(raw: str, text: str) -> tuple[str, str | None]:
    if raw.startswith("["):
        end = raw.find("]")
        if end < 0:
            raise ValueError(f"network entry {text!r}: '[' without ']'")
        rest = raw[end + 1 :]
        if rest and not rest.startswith(":"):
            raise ValueError(f"network entry {text!r}: only ':PORT' may follow ']'")
        return raw[1:end], rest[1:] if rest else None
    if raw.count(":") == 1:
        host, port = raw.split(":")
        return host, port
    return raw, None  # no port, or a bare IPv6 address or block


def _port(text: str, entry: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 5) or not 0 < int(text) < 65536:
        raise ValueError(f"network entry {entry!r}: port {text!r} is not a number 1-65535")
    return int(text)


def _address_or_network(text: str) -> IPNetwork | None:
    try:
        return ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        if "/" in text:
            raise ValueError(f"network entry {text!r} is not a CIDR block: {exc}") from None
        return None


def valid_name(name: str) -> bool:
    """Whether `name` (lower case, no trailing dot) is a DNS name we accept: LDH labels (and
    '_'), at most 253 characters, a last label that is not all digits (no '127.1')."""
    if not name or len(name) > 253 or not name.isascii():
        return False
    labels = name.split(".")
    return all(_LABEL.match(label) for label in labels) and not labels[-1].isdigit()


def destination(host: str) -> str | IPAddress | None:
    """A destination host as a client sent it (a URL's or CONNECT's host), normalised: an
    address, a lower-case name without its trailing dot, or None when it is neither."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    host = host.removesuffix(".")
    return host if valid_name(host) else None


def refused_range(address: IPAddress) -> str | None:
    """Why an address is refused unless an entry names it exactly: what it is (loopback,
    private, metadata, ...), or None for a public unicast address. Addresses embedded in
    IPv6 forms (IPv4-mapped, 6to4, Teredo, NAT64) are judged as the IPv4 address they carry."""
    if address in _METADATA:
        return "a cloud metadata address"
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address.teredo is not None:
            embedded = address.teredo[1]
        if embedded is None and address in _NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            return refused_range(embedded)
    for what, hit in (
        ("an unspecified address", address.is_unspecified),
        ("a loopback address", address.is_loopback),
        ("a link-local address", address.is_link_local),
        ("a multicast address", address.is_multicast),
        ("a private address", address.is_private),
        ("a reserved address", address.is_reserved),
        ("not a public address", not address.is_global),
    ):
        if hit:
            return what
    return None


@dataclass(frozen=True)
class Allowlist:
    """A run's entries, asked about destinations and addresses."""

    entries: tuple[Entry, ...]

    @classmethod
    def parse(cls, texts: list[str]) -> Allowlist:
        return cls(parse_entries(texts))

    def entry_for(self, host: str | IPAddress, port: int) -> Entry | None:
        """The first entry that allows `host` on `port`, or None."""
        return next((e for e in self.entries if e.matches(host, port)), None)

    def host_listed(self, host: str | IPAddress) -> bool:
        """Whether some entry names `host`, on any port (to tell a port refusal apart)."""
        return any(e.covers_host(host) for e in self.entries)

    def names_exactly(self, address: IPAddress) -> bool:
        """Whether an entry names this very address (an address, or a one-address block)."""
        return any(_same(e.exact_address, address) for e in self.entries)


def _same(a: IPAddress | None, b: IPAddress) -> bool:
    if a is None:
        return False
    if isinstance(b, ipaddress.IPv6Address) and b.ipv4_mapped is not None:
        b = b.ipv4_mapped
    return a == b


def within(entry: Entry, pattern: Entry) -> bool:
    """Whether every destination `entry` allows is one `pattern` allows (a profile's
    `network_allow` against a request's entries)."""
    if pattern.ports is not None and (entry.ports is None or not entry.ports <= pattern.ports):
        return False
    if entry.network is not None:
        net = entry.network
        return (
            pattern.network is not None
            and net.version == pattern.network.version
            and net.subnet_of(pattern.network)  # type: ignore[arg-type]
        )
    if entry.host is None or pattern.host is None:
        return False
    if pattern.host == ANY:
        return entry.host != ANY
    if pattern.host.startswith("*."):
        return entry.host.endswith(pattern.host[1:])  # a name or a narrower wildcard under it
    return entry.host == pattern.host
