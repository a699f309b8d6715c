"""Secrets bound to hosts, attacked from real runs: the value reaches only the bound host over
TLS the proxy intercepts, never the sandbox; any other host, a redirect, a second request on
the same tunnel get the placeholder or nothing. Real sandbox, real HTTPS servers on loopback
with a test CA (the proxy's only trusted one here), names pinned to them."""

from __future__ import annotations

import base64
import json
import secrets
from typing import Any
from urllib.parse import quote

import pytest

import execbox
from tests.network.servers import Upstream

# urllib with the run's default trust (the bundle SSL_CERT_FILE names: system CAs and the
# run's CA) for the bound host, and the test CA for the others (not intercepted).
FETCH = """
import json, os, ssl, urllib.request, urllib.error
TEST_CA = ssl.create_default_context(cafile="/workspace/ca.pem")
def fetch(url, headers=(), context=None):
    request = urllib.request.Request(url, headers=dict(headers))
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as r:
            return [r.status, r.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode()]
    except OSError as e:
        return [None, repr(e)]
"""

# A client of its own over the proxy: CONNECT, TLS with the run's default trust, raw bytes.
RAW = """
import os, socket, ssl
def tunnel(host, port):
    proxy = os.environ["HTTPS_PROXY"].rsplit(":", 1)
    sock = socket.create_connection(("127.0.0.1", int(proxy[1])), timeout=10)
    sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\n".encode())
    head = b""
    while b"\\r\\n\\r\\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 200"), head
    return ssl.create_default_context().wrap_socket(sock, server_hostname=host)
def read_response(tls):
    data = b""
    while b"\\r\\n\\r\\n" not in data:
        chunk = tls.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\\r\\n\\r\\n")
    length = [int(l.split(b":")[1]) for l in head.split(b"\\r\\n") if l.lower().startswith(b"content-length")]
    while length and len(body) < length[0]:
        chunk = tls.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\\r\\n\\r\\n" + body
"""


def secret_value() -> str:
    return "tok-" + secrets.token_hex(20)


def run(
    ex: execbox.Executor,
    upstream: Upstream,
    code: str,
    network: list[str],
    bound: list[dict[str, Any]],
    **kw: Any,
) -> execbox.RunResult:
    upstream.clear()
    return ex.run(
        FETCH + RAW + code,
        network=network,
        files={"ca.pem": upstream.ca_pem},
        bound_secrets=bound,
        **{"profile": "net", **kw},
    )


def printed(result: execbox.RunResult) -> Any:
    assert result.status == "ok", result.stderr[-800:]
    return json.loads(result.stdout.splitlines()[-1])


def placeholder_of(heads: list[str], header: str) -> str:
    [line] = [h for h in heads if h.startswith(header + ": ")]
    return line.split(": ", 1)[1].split()[-1]


def echoed(value: str, port: int) -> list[dict[str, Any]]:
    """A binding to api.test:`port` swapped in X-Token (what the test server echoes) and
    Authorization."""
    return [
        {
            "name": "TOKEN",
            "value": value,
            "hosts": [f"api.test:{port}"],
            "headers": ["X-Token", "Authorization"],
        }
    ]


def test_bound_secret_reaches_only_its_host(net: execbox.Executor, upstream: Upstream) -> None:
    value = secret_value()
    https, http = upstream.https_port, upstream.http_port
    code = f"""
token = os.environ["TOKEN"]
auth = {{"Authorization": "Bearer " + token, "X-Token": token}}
print(json.dumps([
    fetch("https://api.test:{https}/hello?key=" + token, auth),
    fetch("http://api.test:{http}/hello", auth),
    fetch("https://other.test:{https}/hello", auth, TEST_CA),
    fetch("http://other.test:{http}/hello", auth),
]))
"""
    network = [f"api.test:{https}", f"api.test:{http}", f"other.test:{https}", f"other.test:{http}"]
    bound = [{"name": "TOKEN", "value": value, "hosts": [f"api.test:{https}"]}]
    result = run(net, upstream, code, network, bound)
    # plain http:// to the bound host is refused: what it answers is never masked
    assert [status for status, _ in printed(result)] == [200, 403, 200, 200]
    heads = upstream.heads()
    [bound_head] = [h for h in upstream.https.heads if "host: api.test" in h]
    assert f"authorization: Bearer {value}\n" in bound_head
    assert "x-token: execbox-placeholder-" in bound_head  # a header the binding does not name
    assert bound_head.startswith("/hello?key=execbox-placeholder-")  # URLs: never swapped
    others = [h for h in heads if h is not bound_head]
    assert len(others) == 2
    for head in others:  # any request to another host: the placeholder
        assert value not in head
        assert "authorization: Bearer execbox-placeholder-" in head
    # the run's own output never shows the value or the placeholder
    assert value not in result.model_dump_json()
    assert "execbox-placeholder-" not in result.model_dump_json()
    assert [(e.method, e.host, e.verdict) for e in result.network_log] == [
        ("CONNECT", "api.test", "allowed"),
        ("GET", "api.test", "denied"),
        ("CONNECT", "other.test", "allowed"),
        ("GET", "other.test", "allowed"),
    ]


def test_bound_secret_never_appears_in_the_jail(net: execbox.Executor, upstream: Upstream) -> None:
    """The run scans its environment, its files and its own memory for the value, after the
    proxy used it, with the needle in two halves that the run never puts together; a control
    string, given through the environment, proves the scan finds what is there."""
    value, control = secret_value(), secret_value()
    https = upstream.https_port
    code = f"""
import ctypes
def halves_in(data, a, b):
    i = data.find(a)
    while i >= 0:
        if data[i + len(a): i + len(a) + len(b)] == b:
            return True
        i = data.find(a, i + 1)
    return False
def scan(a, b):
    found = []
    if any(halves_in(v.encode(), a, b) for v in os.environ.values()):
        found.append("environ")
    for top in ("/workspace", "/tmp", "/dev/shm"):
        for root, _dirs, files in os.walk(top):
            for name in files:
                with open(os.path.join(root, name), "rb") as fh:
                    if halves_in(fh.read(), a, b):
                        found.append("file " + name)
    # /proc/self/mem is closed to the run (it is not dumpable): its memory read in place,
    # every writable or anonymous region (heap, stacks, arenas, libraries' data)
    with open("/proc/self/maps") as maps:
        regions = [line.split() for line in maps]
    for fields in regions:
        span, perms, path = fields[0], fields[1], fields[5] if len(fields) > 5 else ""
        if not perms.startswith("r") or (path and "w" not in perms and path not in ("[heap]", "[stack]")):
            continue
        if path in ("[vvar]", "[vsyscall]", "[vvar_vclock]"):
            continue
        start, end = (int(x, 16) for x in span.split("-"))
        if halves_in(ctypes.string_at(start, end - start), a, b):
            found.append("memory")
            break
    return found
used = fetch("https://api.test:{https}/hello", {{"X-Token": os.environ["TOKEN"]}})
print(json.dumps([used[0], scan({value[:20]!r}.encode(), {value[20:]!r}.encode()),
                  scan({control[:20]!r}.encode(), {control[20:]!r}.encode())]))
"""
    bound = echoed(value, https)
    result = run(net, upstream, code, [f"api.test:{https}"], bound, env={"CONTROL": control})
    status, found, control_found = printed(result)
    assert status == 200 and f"x-token: {value}" in upstream.https.heads[0]
    assert found == []
    assert "environ" in control_found and "memory" in control_found


def test_redirect_to_another_host_carries_the_placeholder(
    net: execbox.Executor, upstream: Upstream
) -> None:
    value = secret_value()
    https, http = upstream.https_port, upstream.http_port
    code = f"""
print(json.dumps(fetch("https://api.test:{https}/redirect?to=http://other.test:{http}/hello",
                       {{"X-Token": os.environ["TOKEN"]}})))
"""
    network = [f"api.test:{https}", f"other.test:{http}"]
    bound = echoed(value, https)
    result = run(net, upstream, code, network, bound)
    assert printed(result)[0] == 200
    [first] = upstream.https.heads
    [followed] = upstream.http.heads
    assert f"x-token: {value}" in first
    assert value not in followed and "x-token: execbox-placeholder-" in followed


def test_placeholder_split_across_header_lines_gets_no_value(
    net: execbox.Executor, upstream: Upstream
) -> None:
    """Only a whole placeholder in one field is swapped: halves in two fields, or a field
    folded inside it (obsolete line folding, unfolded to a space), go upstream unchanged."""
    value = secret_value()
    https = upstream.https_port
    code = f"""
p = os.environ["TOKEN"]
tls = tunnel("api.test", {https})
tls.sendall(("GET /hello HTTP/1.1\\r\\nHost: api.test:{https}\\r\\n"
             f"x-a: {{p[:30]}}\\r\\nX-B: {{p[30:]}}\\r\\n"
             f"x-folded: {{p[:30]}}\\r\\n {{p[30:]}}\\r\\nConnection: close\\r\\n\\r\\n").encode())
print(json.dumps([read_response(tls).split(b" ")[1].decode()]))
"""
    bound = echoed(value, https)
    result = run(net, upstream, code, [f"api.test:{https}"], bound)
    assert printed(result) == ["200"]
    [head] = upstream.https.heads
    assert value not in head and value[:8] not in head
    assert "x-a: execbox-placeholder-" in head and "x-folded: execbox-placeholder-" in head


def test_second_request_for_another_host_on_the_tunnel_is_refused(
    net: execbox.Executor, upstream: Upstream
) -> None:
    """HTTP/1.1 keep-alive: the tunnel to the bound host serves its host only; a request in
    it naming another host (which the certificate also covers upstream) is refused, not sent
    with or without the value."""
    value = secret_value()
    https = upstream.https_port
    code = f"""
p = os.environ["TOKEN"]
tls = tunnel("api.test", {https})
answers = []
for host in ("api.test", "other.test"):
    tls.sendall(f"GET /hello HTTP/1.1\\r\\nHost: {{host}}:{https}\\r\\nx-token: {{p}}\\r\\n\\r\\n".encode())
    answers.append(read_response(tls).split(b" ")[1].decode())
print(json.dumps(answers))
"""
    network = [f"api.test:{https}", f"other.test:{https}"]
    bound = echoed(value, https)
    result = run(net, upstream, code, network, bound)
    assert printed(result) == ["200", "421"]
    [head] = upstream.https.heads
    assert f"host: api.test:{https}" in head and f"x-token: {value}" in head
    refused = result.network_log[-1]
    assert (refused.verdict, refused.rule, refused.host) == (
        "denied",
        "network.request",
        f"other.test:{https}",
    )


def test_bound_host_with_an_untrusted_certificate_gets_nothing(
    net: execbox.Executor, upstream: Upstream
) -> None:
    """The proxy verifies the bound host's certificate (here against the operator's CA only)
    before anything is sent: a server it cannot verify gets no request, let alone the value."""
    value = secret_value()
    rogue = upstream.rogue_port
    code = f"""print(json.dumps(fetch("https://api.test:{rogue}/hello", {{"X-Token": os.environ["TOKEN"]}})))"""
    bound = echoed(value, rogue)
    result = run(net, upstream, code, [f"api.test:{rogue}"], bound)
    status, body = printed(result)
    assert status is None and "502" in body
    assert upstream.rogue.heads == []
    [entry] = result.network_log
    assert (entry.verdict, entry.rule) == ("failed", "network.tls")


def test_bound_host_echoing_the_value_hands_the_run_a_mask(
    net: execbox.Executor, upstream: Upstream
) -> None:
    """A bound host that echoes the request (its target and headers, in its body) would give
    the value to the run: the proxy masks it in responses from bound hosts, as sent in a
    header, percent-encoded in the URL and inside the Basic credential it made, and refuses a
    compressed body it cannot check."""
    value = 'tok/"' + secrets.token_hex(20)  # its URL and JSON forms differ from it
    https = upstream.https_port
    code = f"""
import base64
p = os.environ["TOKEN"]
basic = "Basic " + base64.b64encode(("user:" + p).encode()).decode()
echo = fetch("https://api.test:{https}/headers?k=" + p, {{"X-Token": p, "Authorization": basic}})
packed = fetch("https://api.test:{https}/gzip", {{"Accept-Encoding": "gzip"}})
with urllib.request.urlopen(urllib.request.Request(
        "https://api.test:{https}/reason", headers={{"X-Token": p}}), timeout=10) as r:
    reason = r.reason
lines = echo[1].splitlines()
token = [l.split()[-1] for l in lines if l.startswith("authorization:")][0]
print(json.dumps([echo[0], packed[0], lines[0], [l for l in lines if l.startswith("x-token")],
                  set(token) == {{"*"}}, {value[5:20]!r} in echo[1] + reason, reason]))
"""
    bound = echoed(value, https)
    result = run(net, upstream, code, [f"api.test:{https}"], bound)
    status, packed, target, token_lines, basic_masked, leaked, reason = printed(result)
    assert (status, packed, basic_masked, leaked) == (200, 502, True, False)
    assert reason == "*" * len(value)
    assert target == "/headers?k=[REDACTED:secret]"  # the placeholder: never swapped in a URL
    assert token_lines == ["x-token: " + "*" * len(value)]
    # it was sent as the value, each way
    sent = upstream.https.heads[0]
    assert f"x-token: {value}\n" in sent and sent.startswith("/headers?k=execbox-placeholder-")
    basic = base64.b64encode(f"user:{value}".encode()).decode()
    assert f"authorization: Basic {basic}\n" in sent
    assert "accept-encoding: identity" in upstream.https.heads[1]  # the gzip one


def test_value_and_placeholder_are_redacted_on_every_face(
    net: execbox.Executor, upstream: Upstream
) -> None:
    """The run prints its placeholder and the masked echo, and asks for a host named after
    the placeholder: result, stream, network log and record show neither placeholder nor
    value."""
    value = secret_value()
    https, http = upstream.https_port, upstream.http_port
    code = f"""
p = os.environ["TOKEN"]
print(p)
print(fetch("https://api.test:{https}/headers", {{"X-Token": p}})[1])
print(fetch("http://" + p + ".test:{http}/")[1])
import sys; print(p, file=sys.stderr)
"""
    streamed: list[bytes] = []
    bound = echoed(value, https)
    result = run(net, upstream, code, [f"api.test:{https}"], bound, on_stdout=streamed.append)
    assert result.status == "ok", result.stderr
    record = net.store.get(result.run_id)
    assert record is not None
    for face in (result.model_dump_json(), b"".join(streamed).decode(), record.model_dump_json()):
        assert value not in face and value[:12] not in face
        assert "execbox-placeholder-" not in face
    assert "[REDACTED" in result.stdout and "[REDACTED" in result.network_log[-1].host


def test_a_held_run_is_released_with_its_bound_secrets_given_again(
    net: execbox.Executor, upstream: Upstream
) -> None:
    """Bound secrets are never recorded: the approver gives them again, fresh placeholders
    and all; released without them, the run has no such variable."""
    value = secret_value()
    https = upstream.https_port
    code = f"""
t = os.environ.get("TOKEN")
print(json.dumps([t is not None, fetch("https://api.test:{https}/hello", {{"X-Token": t or "none"}})[0]]))
"""
    bound = echoed(value, https)
    held = run(net, upstream, code, [f"api.test:{https}"], bound, profile="netheld")
    assert held.status == "needs_approval" and upstream.https.heads == []
    released = net.approve(held.run_id, bound_secrets=bound)
    assert printed(released) == [True, 200]
    assert f"x-token: {value}" in upstream.https.heads[0]
    again = run(net, upstream, code, [f"api.test:{https}"], bound, profile="netheld")
    bare = net.approve(again.run_id)
    assert printed(bare)[0] is False
    assert not any(value in head for head in upstream.heads())


def test_masker_masks_a_value_cut_across_pieces() -> None:
    from execbox.network.secrets import Binding, Masker, forms

    value = 'a/b"c<'
    assert set(forms([Binding("T", value, "p", ())])) >= {
        value.encode(),
        quote(value, safe="").encode(),
        b'a/b\\"c<',
        b'a\\/b\\"c<',
        b'a/b"c&lt;',
        b"a/b&quot;c&lt;",
    }

    masker = Masker([b"abcdef"])
    body = b"xxabcdefyyabcde" + b"f" + b"zzabc"
    out = b"".join(masker.feed(body[i : i + 1]) for i in range(len(body))) + masker.end()
    assert out == b"xx******yy******zzabc"


@pytest.mark.parametrize(
    ("network", "bound", "message"),
    [
        ("none", {"name": "T", "value": "v" * 8, "hosts": ["api.test"]}, "network allowlist"),
        (["api.test"], {"name": "T", "value": "v" * 8, "hosts": ["other.test"]}, "not on the run"),
        (["*.a.test"], {"name": "T", "value": "v" * 8, "hosts": ["*.test.b"]}, "not on the run"),
        (
            ["api.test"],
            {"name": "T", "value": "v" * 8, "hosts": ["api.test:8443"]},
            "api.test:8443 is not on the run",
        ),
        (["api.test:80"], {"name": "T", "value": "v" * 8, "hosts": ["api.test"]}, "443"),
        (["10.0.0.1"], {"name": "T", "value": "v" * 8, "hosts": ["10.0.0.1"]}, "not an address"),
        (
            ["api.test"],
            {"name": "T", "value": "v" * 8, "hosts": ["api.test"], "headers": ["Host"]},
            "not one a credential",
        ),
        (
            ["api.test"],
            {"name": "T", "value": "v" * 8, "hosts": ["api.test"], "headers": ["X A"]},
            "not a header name",
        ),
        (["api.test"], {"name": "T", "value": "abcd\r\nefgh", "hosts": ["api.test"]}, "printable"),
        (["api.test"], {"name": "T", "value": "short", "hosts": ["api.test"]}, "8-4096"),
        (["api.test"], {"name": "1T", "value": "v" * 8, "hosts": ["api.test"]}, "variable name"),
        (["api.test"], {"name": "HOME", "value": "v" * 8, "hosts": ["api.test"]}, "given twice"),
        (
            ["api.test"],
            {"name": "HTTPS_PROXY", "value": "v" * 8, "hosts": ["api.test"]},
            "proxy sets",
        ),
        (
            ["api.test"],
            {"name": "SSL_CERT_FILE", "value": "v" * 8, "hosts": ["api.test"]},
            "proxy sets",
        ),
    ],
)
def test_bad_bound_secret_is_a_usage_error(
    net: execbox.Executor, network: Any, bound: dict[str, Any], message: str
) -> None:
    with pytest.raises(execbox.UsageError, match=message):
        net.run("pass", network=network, profile="net", env={"HOME": "/x"}, bound_secrets=[bound])


@pytest.mark.parametrize(
    ("target", "hosts", "refused"),
    [
        (b"/x", [b"api.test:8443"], False),
        (b"/x", [b"API.Test.:8443"], False),  # the same name, as a client may spell it
        (b"/x", [b"other.test:8443"], True),
        (b"/x", [b"api.test"], True),  # port 443, not the tunnel's
        (b"https://other.test:8443/x", [b"api.test:8443"], True),  # absolute: not in a tunnel
        (b"*", [b"api.test:8443"], True),
    ],
)
def test_a_request_in_an_intercepted_tunnel_must_name_its_host(
    target: bytes, hosts: list[bytes], refused: bool
) -> None:
    import h11

    from execbox.network.relay import misdirected

    request = h11.Request(
        method="OPTIONS" if target == b"*" else "GET",
        target=target,
        headers=[(b"host", h) for h in hosts],
    )
    assert (misdirected(request, "api.test", 8443) is not None) is refused


def test_the_run_ca_lives_as_long_as_the_run_and_a_margin() -> None:
    from datetime import UTC, datetime, timedelta

    from execbox.network.intercept import SKEW, RunCA

    ca = RunCA(b"", valid_s=20)
    now = datetime.now(UTC)
    assert ca.cert.not_valid_before_utc <= now
    assert ca.cert.not_valid_after_utc - now <= timedelta(seconds=20) + SKEW
    assert ca.bundle == ca.pem  # no system CAs given: the run's alone


def test_masker_masks_base64_at_any_alignment_and_any_case() -> None:
    from execbox.network.secrets import Binding, Masker, forms

    value = "Tok/en+" + secrets.token_hex(8)
    masker = Masker(forms([Binding("T", value, "p", ())]))
    for before in (b"", b"a", b"ab", b"me:", b"user1:"):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            encoded = encode(before + value.encode() + b"!")
            masked = masker.whole(encoded)
            # what is left decodes to at most 2 bytes of the value either side
            assert masked.count(b"*") >= (len(value) - 4) // 3 * 4, (before, masked)
    for variant in (value.upper(), value.lower(), value.swapcase()):
        assert masker.whole(variant.encode()) == b"*" * len(value)


def test_a_range_of_a_bound_hosts_echo_is_never_served(
    net: execbox.Executor, upstream: Upstream
) -> None:
    """A Range request would cut an echo of the value into pieces no mask matches: the proxy
    drops Range and If-Range on a bound host's requests and refuses a 206 it did not ask for."""
    value = secret_value()
    https = upstream.https_port
    code = f"""
p = os.environ["TOKEN"]
whole = fetch("https://api.test:{https}/headers", {{"X-Token": p}})[1]
start = whole.index("x-token: ") + len("x-token: ")
pieces = [fetch("https://api.test:{https}/headers",
                {{"X-Token": p, "Range": f"bytes={{i}}-{{i + 3}}", "If-Range": "x"}})
          for i in range(start, start + {len(value)}, 4)]
partial = fetch("https://api.test:{https}/partial", {{"X-Token": p}})
print(json.dumps([sorted({{s for s, _ in pieces}}), "".join(b for _, b in pieces), partial[0]]))
"""
    result = run(net, upstream, code, [f"api.test:{https}"], echoed(value, https))
    statuses, joined, partial = printed(result)
    assert statuses == [200] and partial == 502
    assert value[4:12] not in joined and value[4:12] not in result.stdout
    assert not any("range: " in head for head in upstream.https.heads)


def test_a_bound_hosts_other_faces_are_refused(net: execbox.Executor, upstream: Upstream) -> None:
    """Plain http to a bound host, or a CONNECT to another port of it, would answer without a
    mask (a value stored through HTTPS read back there): both refused before any byte goes."""
    value = secret_value()
    https, http, other = upstream.https_port, upstream.http_port, upstream.rogue_port
    code = f"""
plain = fetch("http://api.test:{http}/hello")
try:
    tunnel("api.test", {other})
    connected = True
except AssertionError:
    connected = False
print(json.dumps([plain[0], connected]))
"""
    network = [f"api.test:{https}", f"api.test:{http}", f"api.test:{other}"]
    result = run(net, upstream, code, network, echoed(value, https))
    assert printed(result) == [403, False]
    assert upstream.http.heads == [] and upstream.rogue.heads == []
    assert [(e.port, e.verdict, e.rule) for e in result.network_log] == [
        (http, "denied", "network.bound"),
        (other, "denied", "network.bound"),
    ]


def test_a_bound_hosts_encodings_of_the_value_are_masked(
    net: execbox.Executor, upstream: Upstream
) -> None:
    """Base64 (also of `user:value`, and URL-safe at another alignment), upper case and
    PHP-style JSON ('\\/') of the value, as an API returns stored content: all masked."""
    value = "Tok/" + secrets.token_hex(20)
    https = upstream.https_port
    code = f"""
p = os.environ["TOKEN"]
print(json.dumps([fetch("https://api.test:{https}/encoded", {{"X-Token": p}}),
                  fetch("https://api.test:{https}/php", {{"X-Token": p}})]))
"""
    result = run(net, upstream, code, [f"api.test:{https}"], echoed(value, https))
    (status, encoded), (php_status, php) = printed(result)
    assert (status, php_status) == (200, 200)
    shown = json.loads(encoded)
    raw = value.encode()
    for key, sent in [
        ("base64", base64.b64encode(raw)),
        ("basic", base64.b64encode(b"me:" + raw)),
        ("urlsafe", base64.urlsafe_b64encode(b"x" + raw)),
        ("upper", value.upper().encode()),
    ]:
        assert shown[key] != sent.decode() and "*" * 20 in shown[key], key
    assert json.loads(php)["t"] == "*" * (len(value) + 1)  # '\\/' is two characters


def test_the_run_ca_is_constrained_to_the_bound_names() -> None:
    """Defence in depth: a certificate the run CA signed for any other name (or an address)
    fails a client's verification, whatever the proxy does."""
    import socket
    import ssl
    import threading

    from execbox.network.intercept import RunCA

    ca = RunCA(b"", valid_s=60, names=["api.test", "*.svc.test"])

    def handshake(name: str) -> bool:
        client = ssl.create_default_context(cadata=ca.pem.decode())
        a, b = socket.socketpair()
        server = threading.Thread(target=_serve_once, args=(ca.server_context(name), b))
        server.start()
        try:
            with client.wrap_socket(a, server_hostname=name):
                return True
        except ssl.SSLCertVerificationError:
            return False
        finally:
            a.close()
            server.join()
            b.close()

    assert handshake("api.test") and handshake("a.svc.test")
    assert not handshake("evil.test") and not handshake("svc.test")


def _serve_once(context: Any, sock: Any) -> None:
    import ssl

    try:
        with context.wrap_socket(sock, server_side=True):
            pass
    except (ssl.SSLError, OSError):
        pass


def test_only_a_whole_credential_in_a_named_header_is_swapped() -> None:
    """Text around the placeholder would let code slide the value through a host's partial
    echo (an error showing a key's first and last characters): only the whole field, what
    follows an auth scheme, or a side of Basic's user:password gets the value."""
    from execbox.network.allowlist import parse_entry
    from execbox.network.secrets import Binding, swap_headers

    p, v = "execbox-placeholder-" + "ab" * 16, "tok-" + secrets.token_hex(8)
    binding = Binding("T", v, p, (parse_entry("api.test"),), (b"authorization", b"x-key"))

    def b64(text: str) -> bytes:
        return base64.b64encode(text.encode())

    swapped = [
        (b"x-key", p.encode(), v.encode()),
        (b"authorization", f"Bearer {p}".encode(), f"Bearer {v}".encode()),
        (b"authorization", b"Basic " + b64(f"me:{p}"), b"Basic " + b64(f"me:{v}")),
        (b"authorization", b"basic " + b64(f"{p}:x"), b"basic " + b64(f"{v}:x")),
    ]
    kept = [
        (b"x-other", p.encode()),  # a header the binding does not name
        (b"x-key", f"pad{p}".encode()),
        (b"x-key", f"{p}{p}".encode()),
        (b"x-key", f"{p} x".encode()),
        (b"authorization", f"Bearer xx{p}".encode()),
        (b"authorization", f"Bearer {p} x".encode()),
        (b"authorization", b"Basic " + b64(f"{p}:{p}")),
        (b"authorization", b"Basic " + b64(f"me:a{p}")),
    ]
    headers = [(n, sent) for n, sent, _ in swapped] + kept
    assert swap_headers(headers, [binding]) == [(n, want) for n, _, want in swapped] + kept
