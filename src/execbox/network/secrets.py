"""Secrets bound to hosts: a value the run's code can use but never see.

The run's environment holds a placeholder (random per run) under the secret's name; the
proxy swaps the placeholder for the value only in the headers of HTTPS requests to the
secret's hosts, inside a TLS connection it intercepts (see `intercept`). Everywhere else
(another host, plain http://, a URL, a body) the placeholder goes as it is, and the value
never enters the sandbox. A URL is left alone because URLs are what servers log, echo and
redirect to: a value put there is one the code can more easily get stored and read back.
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


@dataclass(frozen=True)
class Binding:
    """One bound secret of one run: its name, value, this run's placeholder for it, and the
    hosts (names, or `*.suffix`) whose HTTPS requests get the value."""

    name: str
    value: str
    placeholder: str
    hosts: tuple[Entry, ...]

    def covers(self, host: str | IPAddress) -> bool:
        return any(entry.covers_host(host) for entry in self.hosts)


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
        bindings.append(Binding(name, value, placeholder, entries))
    return tuple(bindings)


def _host(name: str, text: object, allow: Allowlist) -> Entry:
    if not isinstance(text, str):
        raise ValueError(f"bound secret {name}: host {text!r} is not a string")
    try:
        entry = parse_entry(text)
    except ValueError as exc:
        raise ValueError(f"bound secret {name}: {exc}") from None
    if entry.host is None or ":" in text:
        raise ValueError(
            f"bound secret {name}: host {text!r} must be a name or '*.domain', without a port "
            "or an address (its certificate is made for a name)"
        )
    if not any(_wider(e, entry.host) for e in allow.entries):
        raise ValueError(
            f"bound secret {name}: host {text!r} is not on the run's network allowlist"
        )
    return entry


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
    """`headers` with every whole placeholder of `bindings` replaced by its value, also
    inside a Basic Authorization header's base64 (git and pip put a token there)."""
    out = []
    for name, value in headers:
        value = _swap(value, bindings)
        if name in (b"authorization", b"proxy-authorization") and value[:6].lower() == _BASIC:
            value = value[:6] + _swap_basic(value[6:], bindings)
        out.append((name, value))
    return out


def _swap(data: bytes, bindings: Sequence[Binding]) -> bytes:
    for b in bindings:
        data = data.replace(b.placeholder.encode(), b.value.encode())
    return data


def _swap_basic(token: bytes, bindings: Sequence[Binding]) -> bytes:
    try:
        decoded = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return token
    swapped = _swap(decoded, bindings)
    return token if swapped == decoded else base64.b64encode(swapped)


def forms(bindings: Sequence[Binding]) -> list[bytes]:
    """How each value of `bindings` may come back from a host that echoes a request: as
    sent in a header, percent-encoded as in a URL, escaped in JSON or HTML."""
    out: set[bytes] = set()
    for b in bindings:
        out |= {
            b.value.encode(),
            quote(b.value, safe="").encode(),
            json.dumps(b.value)[1:-1].encode(),
            html.escape(b.value, quote=False).encode(),
            html.escape(b.value).encode(),
        }
    return sorted(out, key=len, reverse=True)


def basic_tokens(
    sent: Sequence[tuple[bytes, bytes]], swapped: Sequence[tuple[bytes, bytes]]
) -> list[bytes]:
    """The base64 of each Basic credential the swap rewrote (echoed, it decodes to the
    value): masked in the response like the value itself."""
    return [
        new[6:].strip()
        for (name, old), (_, new) in zip(sent, swapped, strict=True)
        if name in (b"authorization", b"proxy-authorization")
        and new != old
        and new[:6].lower() == _BASIC
    ]


class Masker:
    """Masks `secrets` (the values of a request's bindings in the forms they may come back
    in) in a bound host's response: its headers, and its body as it arrives in pieces (a
    host that echoes a request would hand the value to the run). Each becomes as many '*',
    so the body keeps its length; the tail of a piece that could begin one waits for the
    next piece."""

    def __init__(self, secrets: Sequence[bytes]) -> None:
        self.secrets = sorted(set(secrets), key=len, reverse=True)
        self.keep = max(len(v) for v in self.secrets) - 1
        self.held = b""

    def whole(self, data: bytes) -> bytes:
        for secret in self.secrets:
            data = data.replace(secret, b"*" * len(secret))
        return data

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
