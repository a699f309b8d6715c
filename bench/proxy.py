"""The egress proxy's cost: per-request latency through it against a direct loopback request,
and requests/s through it with several callers. Writes bench/results/proxy.json.

Host side: a real HTTP server on 127.0.0.1, an `EgressProxy` serving a listener on the host's
loopback (the listener a run gets is the same socket type, made in the run's namespace), and
keep-alive clients: direct (origin-form to the server) and through the proxy (absolute-form,
as urllib and requests send to an HTTP proxy; every request is decided, logged and given its
own upstream connection). Sandbox side (`--sandbox`, needs root and the image): one run
fetching through the proxy, against one fetching from a server on its own loopback.

    .venv/bin/python bench/proxy.py [--requests 2000] [--callers 4] [--sandbox]
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from execbox.network.allowlist import Allowlist
from execbox.network.proxy import EgressProxy, NetworkLimits

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


def _server() -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
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
    args = parser.parse_args()
    results = {"host": host_side(args.requests, args.callers, args.seconds)}
    if args.sandbox:
        results["sandbox"] = sandbox_side(min(args.requests, 500))
    print(json.dumps(results, indent=2))
    out = Path(__file__).parent / "results" / "proxy.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
