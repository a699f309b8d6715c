"""The egress proxy's cost: per-request latency through it against a direct loopback request,
and requests/s through it with several callers. Writes bench/results/proxy.json.

Host side: a real HTTP server on 127.0.0.1, an `EgressProxy` serving a listener on the host's
loopback (the listener a run gets is the same socket type, made in the run's namespace), and
keep-alive clients: direct (origin-form to the server) and through the proxy (absolute-form,
as urllib and requests send to an HTTP proxy; every request is decided, logged and given its
own upstream connection). TLS (`--tls`): HTTPS keep-alive requests direct, through a CONNECT
tunnel, and through a tunnel the proxy intercepts for a bound secret (its TLS ended with the
run CA's certificate, each request swapped and sent over a new verified upstream TLS
connection). Sandbox side (`--sandbox`, needs root and the image): one run
fetching through the proxy, against one fetching from a server on its own loopback.

    .venv/bin/python bench/proxy.py [--requests 2000] [--callers 4] [--tls] [--sandbox]
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import ssl
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from execbox.network.allowlist import Allowlist
from execbox.network.proxy import EgressProxy, NetworkLimits
from execbox.network.secrets import bind

BODY = b"x" * 1024


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    wbufsize = 1 << 16  # a response in one write: no delayed-ACK stall between its parts

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)


def _server(context: ssl.SSLContext | None = None) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _timed(host: str, port: int, target: str, n: int) -> list[float]:
    """Seconds per GET of `target` over one keep-alive connection to host:port."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        conn.request("GET", target)
        response = conn.getresponse()
        response.read()
        times.append(time.perf_counter() - start)
        assert response.status == 200, response.status
    conn.close()
    return times


def _rate(host: str, port: int, target: str, callers: int, seconds: float) -> float:
    done = [0] * callers
    stop = time.monotonic() + seconds

    def call(i: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=10)
        while time.monotonic() < stop:
            conn.request("GET", target)
            conn.getresponse().read()
            done[i] += 1
        conn.close()

    threads = [threading.Thread(target=call, args=(i,)) for i in range(callers)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.monotonic() - start)


def host_side(requests: int, callers: int, seconds: float) -> dict[str, float]:
    server = _server()
    port = server.server_address[1]
    proxy = EgressProxy({"api.test": "127.0.0.1"})
    listener = socket.create_server(("127.0.0.1", 0))
    limits = NetworkLimits(bytes=1 << 40, connections=10**9)
    egress = proxy.open(listener, Allowlist.parse([f"api.test:{port}"]), limits, lambda _m: None)
    proxy_port = listener.getsockname()[1]
    url = f"http://api.test:{port}/"
    try:
        _timed("127.0.0.1", port, "/", 100)  # warm both paths
        _timed("127.0.0.1", proxy_port, url, 100)
        direct = _timed("127.0.0.1", port, "/", requests)
        proxied = _timed("127.0.0.1", proxy_port, url, requests)
        out = {
            "direct_ms": statistics.median(direct) * 1000,
            "proxied_ms": statistics.median(proxied) * 1000,
            "direct_rps": _rate("127.0.0.1", port, "/", callers, seconds),
            "proxied_rps": _rate("127.0.0.1", proxy_port, url, callers, seconds),
        }
    finally:
        proxy.end(egress)
        proxy.close()
        server.shutdown()
        server.server_close()
    out["overhead_ms"] = out["proxied_ms"] - out["direct_ms"]
    return out


def _timed_tls(
    port: int, context: ssl.SSLContext, n: int, tunnel: tuple[int, str] | None = None
) -> list[float]:
    """Seconds per HTTPS GET over one keep-alive connection: to 127.0.0.1:port, or through
    the proxy at `tunnel` (its port, a header to send) to api.test:port."""
    if tunnel is None:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
        headers = {}
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", tunnel[0], timeout=10, context=context)
        conn.set_tunnel("api.test", port)
        headers = {"Authorization": f"Bearer {tunnel[1]}"}
    times = []
    for _ in range(n):
        start = time.perf_counter()
        conn.request("GET", "/", headers=headers)
        response = conn.getresponse()
        response.read()
        times.append(time.perf_counter() - start)
        assert response.status == 200, response.status
    conn.close()
    return times


def tls_side(requests: int) -> dict[str, float]:
    import trustme

    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("api.test", "127.0.0.1").configure_cert(server_context)
    server = _server(server_context)
    port = server.server_address[1]
    with tempfile.NamedTemporaryFile(suffix=".pem") as ca_file:
        ca_file.write(ca.cert_pem.bytes())
        ca_file.flush()
        proxy = EgressProxy({"api.test": "127.0.0.1"}, ca_file.name)
        allow = Allowlist.parse([f"api.test:{port}"])
        limits = NetworkLimits(bytes=1 << 40, connections=10**9)
        [binding] = bind(
            [{"name": "T", "value": "v" * 40, "hosts": [f"api.test:{port}"]}],
            [f"api.test:{port}"],
            {},
        )
        tls = proxy.interception([binding], 3600)
        plain_l, bound_l = (
            socket.create_server(("127.0.0.1", 0)),
            socket.create_server(("127.0.0.1", 0)),
        )
        plain = proxy.open(plain_l, allow, limits, lambda _m: None)
        bound = proxy.open(bound_l, allow, limits, lambda _m: None, tls)
        client = ssl.create_default_context(
            cadata=ca.cert_pem.bytes().decode() + tls.ca.pem.decode()
        )
        tunnel = (plain_l.getsockname()[1], "x")
        intercepted = (bound_l.getsockname()[1], binding.placeholder)
        try:
            for through in (None, tunnel, intercepted):  # warm every path
                _timed_tls(port, client, 20, through)
            out = {
                "direct_ms": statistics.median(_timed_tls(port, client, requests)) * 1000,
                "tunnel_ms": statistics.median(_timed_tls(port, client, requests, tunnel)) * 1000,
                "intercepted_ms": statistics.median(_timed_tls(port, client, requests, intercepted))
                * 1000,
            }
        finally:
            proxy.end(plain)
            proxy.end(bound)
            proxy.close()
            server.shutdown()
            server.server_close()
    out["tunnel_overhead_ms"] = out["tunnel_ms"] - out["direct_ms"]
    out["interception_overhead_ms"] = out["intercepted_ms"] - out["direct_ms"]
    return out


SANDBOX_CODE = """
import http.client, json, os, threading, time, urllib.parse
from http.server import BaseHTTPRequestHandler, HTTPServer
N = {n}
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    wbufsize = 1 << 16
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "1024"); self.end_headers()
        self.wfile.write(b"x" * 1024)
def timed(host, port, target):
    conn = http.client.HTTPConnection(host, port, timeout=10)
    out = []
    for _ in range(N):
        t = time.perf_counter(); conn.request("GET", target); conn.getresponse().read()
        out.append(time.perf_counter() - t)
    return sorted(out)[N // 2]
result = {{}}
proxy = os.environ.get("HTTP_PROXY")
if proxy:
    p = urllib.parse.urlsplit(proxy)
    result["proxied_ms"] = timed(p.hostname, p.port, "{url}") * 1000
else:
    s = HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=s.serve_forever, daemon=True).start()
    result["direct_ms"] = timed("127.0.0.1", s.server_address[1], "/") * 1000
print(json.dumps(result))
"""


def sandbox_side(requests: int) -> dict[str, float]:
    import execbox
    from execbox.policy import load_profiles

    server = _server()
    port = server.server_address[1]
    profiles = load_profiles()
    most = profiles["data"].max_limits.model_copy(update={"network_connections": 100000})
    profiles["net"] = profiles["data"].model_copy(
        update={"name": "net", "network_allow": ["*:*"], "max_limits": most}
    )
    url = f"http://api.test:{port}/"
    code = SANDBOX_CODE.format(n=requests, url=url)
    out: dict[str, float] = {}
    with execbox.Executor(
        cache=False, profiles=profiles, network_resolve={"api.test": "127.0.0.1"}
    ) as ex:
        limits = {"timeout_s": 60, "network_connections": requests + 10}
        proxied = ex.run(code, network=[f"api.test:{port}"], profile="net", limits=limits)
        direct = ex.run(code, limits={"timeout_s": 60})
        for result in (proxied, direct):
            assert result.ok, result
            out.update(json.loads(result.stdout))
    server.shutdown()
    server.server_close()
    out["in_run_overhead_ms"] = out["proxied_ms"] - out["direct_ms"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--callers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--sandbox", action="store_true", help="also measure from a real run")
    parser.add_argument("--tls", action="store_true", help="also HTTPS: tunnel, interception")
    args = parser.parse_args()
    results = {"host": host_side(args.requests, args.callers, args.seconds)}
    if args.tls:
        results["tls"] = tls_side(min(args.requests, 500))
    if args.sandbox:
        results["sandbox"] = sandbox_side(min(args.requests, 500))
    print(json.dumps(results, indent=2))
    out = Path(__file__).parent / "results" / "proxy.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
