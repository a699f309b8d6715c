"""Secrets bound to hosts: a value the run's code can use but never see.

The run's environment holds a placeholder (random per run) under the secret's name; the
proxy swaps the placeholder for the value only in the headers the binding names
(`Authorization` unless it names others) of HTTPS requests to the binding's hosts and ports
(443 unless an entry names one), inside a TLS connection it intercepts (see `intercept`).
Everywhere else (another host, another header, a URL, a body) the placeholder goes as it
is, and the value never enters the sandbox. A bound host is reached only that way: plain
http:// to it, or a CONNECT to one of its other ports, is refused, because a response there
could carry a stored value back unmasked.

What the host sends back is masked (`Masker`) in the forms an echo takes; no masker can
follow a host that transforms the value at will, so a binding is safe only for a host that
does not reflect or store the credential.
"""

from __future__ import annotations

import base64
import binascii
import html
import json
import re
import secrets as random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from .allowlist import Allowlist, Entry, IPAddress, parse_entry

MAX_BOUND = 16
MIN_VALUE_CHARS = 8  # shorter is guessable, and masking it would garble responses
MAX_VALUE_CHARS = 4096
BUNDLE_NAME = ".execbox-ca-bundle.pem"  # an input file of the run's workspace
BUNDLE_PATH = f"/workspace/{BUNDLE_NAME}"
# What the common TLS clients read their trust from: OpenSSL (Python's ssl, curl), requests
# and pip, Node (added to its own CAs).
CA_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")
PLACEHOLDER_PREFIX = "execbox-placeholder-"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# What a header value can carry as it is (RFC 9110 field-vchar and spaces): a value with a
# line break or a control character would let the code's request be something else upstream.
_VALUE = re.compile(r"[\x20-\x7e]+\Z")
_BASIC = b"basic "
_TOKEN = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+\Z")  # an HTTP field name (RFC 9110 5.6.2)
BOUND_PORT = 443  # a binding's port unless its entry names one: HTTPS, the only way in
DEFAULT_HEADERS = ("authorization",)
# Headers the proxy writes or that frame the message: a value there is not a credential.
_NOT_CREDENTIAL = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "te", "upgrade", "range"}
)


@dataclass(frozen=True)
class Binding:
    """One bound secret of one run: its name, value, this run's placeholder for it, the
    hosts (names, or `*.suffix`, each with its ports) whose HTTPS requests get the value, and
    the headers (lower-case names) it is swapped in."""

    name: str
    value: str
    placeholder: str
    hosts: tuple[Entry, ...]
    headers: tuple[bytes, ...] = tuple(h.encode() for h in DEFAULT_HEADERS)

    def covers(self, host: str | IPAddress) -> bool:
        """Whether `host` is one of the binding's names, on any port."""
        return any(entry.covers_host(host) for entry in self.hosts)

    def serves(self, host: str | IPAddress, port: int) -> bool:
        """Whether requests to `host`:`port` get the value."""
        return any(entry.matches(host, port) for entry in self.hosts)


def bind(
    bound: Sequence[Mapping[str, object]],
    network: str | Sequence[str],
    env: Mapping[str, str],
) -> tuple[Binding, ...]:
    """The run's bindings, each with a fresh placeholder. ValueError says what is wrong: a
    name that is not an environment variable's or that `env` already sets, a value with
    characters a header cannot carry, a host that is not a name or that the run's `network`
    does not allow."""
    if not bound:
        return ()
    if len(bound) > MAX_BOUND:
        raise ValueError(f"{len(bound)} bound secrets; at most {MAX_BOUND} per run")
    if isinstance(network, str):
        raise ValueError("bound secrets need a network allowlist that names their hosts")
    allow = Allowlist.parse(list(network))
    names: set[str] = set()
    bindings = []
    for item in bound:
        name, value, hosts = item.get("name"), item.get("value"), item.get("hosts")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"bound secret name {name!r} is not an environment variable name")
        if name in names or name in env:
            raise ValueError(f"bound secret {name}: the name is given twice (or also in env)")
        names.add(name)
        if (
            not isinstance(value, str)
            or not _VALUE.match(value)
            or not MIN_VALUE_CHARS <= len(value) <= MAX_VALUE_CHARS
        ):
            raise ValueError(
                f"bound secret {name}: the value must be {MIN_VALUE_CHARS}-{MAX_VALUE_CHARS} "
                "printable ASCII characters (it goes into HTTP headers)"
            )
        if not isinstance(hosts, (list, tuple)) or not hosts:
            raise ValueError(f"bound secret {name}: give the hosts it is for, as a list")
        entries = tuple(_host(name, h, allow) for h in hosts)
        placeholder = PLACEHOLDER_PREFIX + random.token_hex(16)
        headers = _headers(name, item.get("headers"))
        bindings.append(Binding(name, value, placeholder, entries, headers))
    return tuple(bindings)


def _host(name: str, text: object, allow: Allowlist) -> Entry:
    if not isinstance(text, str):
        raise ValueError(f"bound secret {name}: host {text!r} is not a string")
    try:
        entry = parse_entry(text)
    except ValueError as exc:
        raise ValueError(f"bound secret {name}: {exc}") from None
    host = entry.host
    if host is None:
        raise ValueError(
            f"bound secret {name}: host {text!r} must be a name or '*.domain'[:port], not an "
            "address (its certificate is made for a name)"
        )
    if ":" not in text:
        entry = Entry(entry.text, host, None, frozenset({BOUND_PORT}))
    [port] = entry.ports or (BOUND_PORT,)
    if not any(_wider(e, host) and (e.ports is None or port in e.ports) for e in allow.entries):
        raise ValueError(
            f"bound secret {name}: host {host}:{port} is not on the run's network "
            "allowlist (a binding is for port 443 unless it names one)"
        )
    return entry


def _headers(name: str, given: object) -> tuple[bytes, ...]:
    if given is None:
        return tuple(h.encode() for h in DEFAULT_HEADERS)
    if not isinstance(given, (list, tuple)) or not given or len(given) > MAX_BOUND:
        raise ValueError(
            f"bound secret {name}: headers must be a list of 1-{MAX_BOUND} header names"
        )
    out = []
    for header in given:
        if not isinstance(header, str) or not _TOKEN.match(header):
            raise ValueError(f"bound secret {name}: {header!r} is not a header name")
        if header.lower() in _NOT_CREDENTIAL or header.lower().startswith("proxy-"):
            raise ValueError(
                f"bound secret {name}: header {header!r} is not one a credential goes in"
            )
        out.append(header.lower().encode())
    return tuple(out)


def _wider(allowed: Entry, host: str) -> bool:
    """Whether the allowlist entry `allowed` covers every name `host` (a name or a
    `*.suffix`) stands for."""
    if allowed.host is None:
        return False
    if host.startswith("*."):
        return allowed.host == host or (
            allowed.host.startswith("*.") and host.endswith(allowed.host[1:])
        )
    return allowed.covers_host(host)


def environment(bindings: Sequence[Binding]) -> dict[str, str]:
    """What the run's environment holds for its bound secrets: the placeholders."""
    return {b.name: b.placeholder for b in bindings}


def swap_headers(
    headers: Sequence[tuple[bytes, bytes]], bindings: Sequence[Binding]
) -> list[tuple[bytes, bytes]]:
    """`headers` with a placeholder of `bindings` replaced by its value in the headers each
    binding names, where the placeholder is the whole credential: the whole field, or what
    follows an auth scheme (`Bearer <placeholder>`), or either side of a Basic credential's
    `user:password` (git and pip put a token there). Any other header, or the placeholder
    amid other text, keeps the placeholder: an arbitrary header is what an echo or debug
    endpoint reflects, and text around the value would let code slide it through a host's
    partial echo (an error's 'key sk-ab***wxyz')."""
    out = []
    for name, value in headers:
        for b in bindings:
            if name in b.headers:
                value = _swap(name, value, b)
        out.append((name, value))
    return out


def _swap(name: bytes, value: bytes, binding: Binding) -> bytes:
    placeholder, secret = binding.placeholder.encode(), binding.value.encode()
    if value == placeholder:
        return secret
    scheme, space, credential = value.partition(b" ")
    if not space or not _TOKEN.match(scheme.decode("latin-1")):
        return value
    if credential == placeholder:
        return scheme + b" " + secret
    if name == b"authorization" and scheme.lower() + b" " == _BASIC:
        return scheme + b" " + _swap_basic(credential, placeholder, secret)
    return value


def _swap_basic(token: bytes, placeholder: bytes, secret: bytes) -> bytes:
    try:
        decoded = base64.b64decode(token, validate=True)
    except (binascii.Error, ValueError):
        return token
    user, colon, password = decoded.partition(b":")
    if colon and password == placeholder and placeholder not in user:
        return base64.b64encode(user + b":" + secret)
    if colon and user == placeholder and placeholder not in password:
        return base64.b64encode(secret + b":" + password)
    return token


def forms(bindings: Sequence[Binding]) -> list[bytes]:
    """How each value of `bindings` may come back from a host that echoes a request: as
    sent, percent-encoded as in a URL, escaped in JSON (also with '\\/') or HTML, and in
    base64 (standard or URL-safe, at each of the three alignments, so also inside a Basic
    `user:value`). The masker matches them in any letter case."""
    out: set[bytes] = set()
    for b in bindings:
        value = b.value.encode()
        escaped = json.dumps(b.value)[1:-1]
        out |= {
            value,
            quote(b.value, safe="").encode(),
            escaped.encode(),
            escaped.replace("/", "\\/").encode(),
            html.escape(b.value, quote=False).encode(),
            html.escape(b.value).encode(),
        }
        out |= set(_base64_cores(value))
    return sorted(out, key=len, reverse=True)


def _base64_cores(value: bytes) -> list[bytes]:
    """The base64 characters that encode only bytes of `value`, wherever it starts in the
    encoded data: the groups of 3 bytes that hold no byte of its neighbours."""
    cores = []
    for lead in range(3):
        skip = (3 - lead) % 3  # bytes of the value in a first group shared with what precedes
        whole = (len(value) - skip) // 3 * 3
        chunk = value[skip : skip + whole]
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            cores.append(encode(chunk))
    return [c for c in cores if c]


def basic_tokens(
    sent: Sequence[tuple[bytes, bytes]], swapped: Sequence[tuple[bytes, bytes]]
) -> list[bytes]:
    """The base64 of each Basic credential the swap rewrote (echoed, it decodes to the
    value): masked in the response like the value itself."""
    return [
        new[6:].strip()
        for (name, old), (_, new) in zip(sent, swapped, strict=True)
        if name == b"authorization" and new != old and new[:6].lower() == _BASIC
    ]


class Masker:
    """Masks `secrets` (the values of a request's bindings in the forms they may come back
    in) in a bound host's response, in any letter case: its headers, and its body as it
    arrives in pieces (a host that echoes a request would hand the value to the run). Each
    becomes as many '*', so the body keeps its length; the tail of a piece that could begin
    one waits for the next piece."""

    def __init__(self, secrets: Sequence[bytes]) -> None:
        # Searched in the lower-cased data (same length, ASCII letters only): bytes.find is
        # a C scan, where a case-blind regex costs ~0.1 us a byte of every body
        self.secrets = sorted({s.lower() for s in secrets}, key=len, reverse=True)
        self.keep = len(self.secrets[0]) - 1
        self.held = b""

    def whole(self, data: bytes) -> bytes:
        low = data.lower()
        out: bytearray | None = None
        for secret in self.secrets:
            at = low.find(secret)
            while at >= 0:
                out = bytearray(data) if out is None else out
                out[at : at + len(secret)] = b"*" * len(secret)
                at = low.find(secret, at + 1)
        return data if out is None else bytes(out)

    def headers(self, headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        return [(name, self.whole(value)) for name, value in headers]

    def feed(self, data: bytes) -> bytes:
        """What of the body so far may go to the run."""
        data = self.whole(self.held + data)
        cut = max(0, len(data) - self.keep)
        self.held = data[cut:]
        return data[:cut]

    def end(self) -> bytes:
        """The rest of the body, at its end."""
        held, self.held = self.held, b""
        return held
