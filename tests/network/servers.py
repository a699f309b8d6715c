"""Real HTTP and HTTPS servers on 127.0.0.1, outside the sandbox, for the network tests: the
HTTPS one with a certificate for `api.test` from a throwaway test CA (trustme)."""

from __future__ import annotations

import base64
import gzip
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import trustme


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    seen: list[tuple[str, str, str]]  # (method, path, Host header) of every request served
    heads: list[str]  # each request's target, then its header fields (names in lower case)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    wbufsize = 1 << 16  # a response in one write: no delayed-ACK stall between its parts

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        pass

    def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        ranged = self.headers.get("Range", "")
        if status == 200 and ranged.startswith("bytes="):  # as most servers and CDNs do
            first, _, last = ranged[6:].partition("-")
            end = int(last) if last else len(body) - 1
            headers = {**(headers or {}), "Content-Range": f"bytes {first}-{end}/{len(body)}"}
            status, body = 206, body[int(first) : end + 1]
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        self.server.seen.append((self.command, self.path, self.headers.get("Host", "")))
        fields = "".join(f"{name.lower()}: {value}\n" for name, value in self.headers.items())
        self.server.heads.append(f"{self.path}\n{fields}")
        if url.path == "/hello":
            self._reply(200, f"hello host={self.headers.get('Host')}".encode())
        elif url.path == "/redirect":
            self._reply(302, b"", {"Location": query["to"][0]})
        elif url.path == "/headers":  # an echo: what a careless API does in its errors
            self._reply(200, self.server.heads[-1].encode())
        elif url.path == "/reason":  # the header echoed in the status line's reason
            self.send_response(200, self.headers.get("X-Token", ""))
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif url.path == "/encoded":  # the header as APIs return stored content
            token = self.headers.get("X-Token", "")
            forms = {
                "base64": base64.b64encode(token.encode()).decode(),
                "basic": base64.b64encode(f"me:{token}".encode()).decode(),
                "urlsafe": base64.urlsafe_b64encode(b"x" + token.encode()).decode(),
                "upper": token.upper(),
            }
            self._reply(200, json.dumps(forms).encode())
        elif url.path == "/php":  # JSON as PHP and Java write it: '/' escaped as '\\/'
            body = json.dumps({"t": self.headers.get("X-Token", "")}).replace("/", "\\/")
            self._reply(200, body.encode())
        elif url.path == "/partial":  # a 206 without being asked for one
            self._reply(206, self.server.heads[-1].encode())
        elif url.path == "/gzip":
            self._reply(200, gzip.compress(b"compressed"), {"Content-Encoding": "gzip"})
        elif url.path == "/big":
            self._reply(200, b"x" * int(query["n"][0]))
        else:
            self._reply(404, b"no such page")

    do_HEAD = do_GET

    def do_POST(self) -> None:
        self.server.seen.append((self.command, self.path, self.headers.get("Host", "")))
        if self.headers.get("Transfer-Encoding") == "chunked":
            body = b""
            while size := int(self.rfile.readline().strip(), 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        length = self.headers.get("Content-Length")
        self._reply(200, b"echo " + body + f" content-length={length}".encode())


class Upstream:
    """An HTTP server and an HTTPS server (certificate for api.test and other.test) on
    127.0.0.1, and a rogue HTTPS one whose certificate for api.test no trusted CA issued."""

    def __init__(self) -> None:
        self.ca = trustme.CA()
        self.ca_pem = self.ca.cert_pem.bytes()
        self.http = self._start(None)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert("api.test", "other.test").configure_cert(context)
        self.https = self._start(context)
        rogue = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        trustme.CA().issue_cert("api.test").configure_cert(rogue)
        self.rogue = self._start(rogue)

    def _start(self, context: ssl.SSLContext | None) -> _Server:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.seen = []
        server.heads = []
        if context is not None:
            server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    @property
    def http_port(self) -> int:
        return int(self.http.server_address[1])

    @property
    def https_port(self) -> int:
        return int(self.https.server_address[1])

    @property
    def rogue_port(self) -> int:
        return int(self.rogue.server_address[1])

    def seen(self) -> list[tuple[str, str, str]]:
        return self.http.seen + self.https.seen

    def heads(self) -> list[str]:
        """What every server read of each request: target and headers."""
        return self.http.heads + self.https.heads + self.rogue.heads

    def clear(self) -> None:
        for server in (self.http, self.https, self.rogue):
            server.seen.clear()
            server.heads.clear()

    def close(self) -> None:
        for server in (self.http, self.https, self.rogue):
            server.shutdown()
            server.server_close()
