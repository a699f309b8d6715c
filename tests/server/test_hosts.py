"""The Host check against DNS rebinding, through a real server on loopback: a request naming a
host the server was not told is its own is refused on every face, before its key is looked at
or its body read; addresses, localhost and the allowed names (wildcards too) pass; a missing,
doubled or malformed Host, or a URL as the request's target, cannot slip past it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import execbox
from execbox.errors import UsageError
from execbox.server import Settings, create_app
from execbox.server.background import Server, config
from execbox.server.hosts import AllowedHosts, default_patterns, parse_host, split_patterns
from execbox.server.local import bind_local_socket
from tests.server.conftest import Api, own_server, raw_connect, read_until_closed

MIB = 1 << 20
ALLOWED = ("api.example.com", "*.corp.example")
UNKNOWN_RUN = "/v1/runs/0123456789abcdef"


@pytest.fixture(scope="module")
def api(fake_api: Api) -> Iterator[Api]:
    yield fake_api  # the claims here are the server's: the fake sandbox runs the code


@pytest.fixture(scope="module")
def guarded(fake_api: Api) -> Iterator[str]:
    """A server (E2B face on) that answers to ALLOWED besides addresses and localhost."""
    with own_server(fake_api.executor, e2b=True, allowed_hosts=ALLOWED) as (url, _):
        yield url


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _exchange(url: str, head: str, body: bytes = b"", timeout_s: float = 10) -> bytes:
    """Send `head` (and `body`) on a connection of its own; what comes back until it closes."""
    with raw_connect(url, head.encode("latin-1") + body) as sock:
        return read_until_closed(sock, timeout_s)


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def _json(answer: bytes) -> dict[str, object]:
    body: dict[str, object] = json.loads(answer.partition(b"\r\n\r\n")[2])
    return body


def _get(url: str, host: str | None, path: str = UNKNOWN_RUN, key: str | None = None) -> bytes:
    lines = [f"GET {path} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host}")
    if key:
        lines.append(f"Authorization: Bearer {key}")
    return _exchange(url, "\r\n".join([*lines, "Connection: close", "", ""]))


def test_a_foreign_host_is_refused_on_every_face_before_its_key_or_body(
    api: Api, guarded: str
) -> None:
    """Each face's answer is the 421 naming the option, sent while the client still owes a
    30 MiB body (so it was never read), and the key's rate is untouched by them."""
    _, key = api.key("rebound", rpm=3)
    port = _port(guarded)
    faces = [
        ("POST", "/v1/runs", f"Authorization: Bearer {key}\r\n"),
        ("POST", "/v1/sessions", f"Authorization: Bearer {key}\r\n"),
        ("PUT", "/v1/sessions/s/files/a", f"Authorization: Bearer {key}\r\n"),
        ("POST", "/console/login", ""),
        ("POST", "/console/runs/run_x/approve", f"Authorization: Bearer {key}\r\n"),
        ("GET", "/console/runs", ""),
        ("GET", "/metrics", ""),
        ("POST", "/e2b/sandboxes", f"X-API-KEY: {key}\r\n"),
        ("POST", "/e2b/process.Process/Start", "E2b-Sandbox-Id: x\r\n"),
    ]
    for method, path, auth in faces:
        started = time.monotonic()
        answer = _exchange(
            guarded,
            f"{method} {path} HTTP/1.1\r\nHost: evil.example:{port}\r\n{auth}"
            f"Content-Type: application/json\r\nContent-Length: {30 * MIB}\r\n\r\n",
        )
        assert _status(answer) == 421, (path, answer[:300])
        assert time.monotonic() - started < 5, path
        assert b"connection: close" in answer.lower(), path
        body = _json(answer)
        error = body if path.startswith("/e2b/") else body["error"]
        assert isinstance(error, dict), body
        assert "--allowed-host evil.example" in str(error["message"]), body
        if not path.startswith("/e2b/"):
            assert error["code"] == "host_not_allowed"
    # Nine refusals, none counted: the key's three requests a minute are all still there.
    for _ in range(3):
        assert _status(_get(guarded, f"127.0.0.1:{port}", key=key)) == 404


def test_dns_rebinding_cannot_run_code_on_a_server_without_keys(api: Api) -> None:
    """A rebound page's same-origin request (its own name, the server's port) runs nothing on
    `--no-auth`; the same request naming the server runs."""
    with own_server(api.executor, auth=False) as (url, _):
        port = _port(url)
        body = json.dumps({"code": "print('ran-here')"}).encode()

        def post(host: str) -> bytes:
            return _exchange(
                url,
                f"POST /v1/runs HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n",
                body,
            )

        refused = post(f"evil.example:{port}")
        assert _status(refused) == 421 and b"ran-here" not in refused
        served = post(f"localhost:{port}")
        assert _status(served) == 200 and b"ran-here" in served
        for path in ("/console/runs", "/v1/runs/x/artifacts/a"):
            assert _status(_get(url, f"evil.example:{port}", path)) == 421, path


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "localhost:{port}",
        "LocalHost.:{port}",
        "127.0.0.1:{port}",
        "127.0.0.2",
        "10.1.2.3:80",
        "[::1]:{port}",
        "[::1]",
        "[2001:db8::1]",
        "api.example.com",
        "API.Example.com.:8443",
        "a.corp.example",
        "x.y.corp.example:{port}",
        "localhost:",
    ],
)
def test_addresses_localhost_and_allowed_names_pass(api: Api, guarded: str, host: str) -> None:
    _, key = api.key()
    answer = _get(guarded, host.format(port=_port(guarded)), key=key)
    assert _status(answer) == 404, answer[:300]  # past the check: no such run


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "corp.example",  # the wildcard is for subdomains only
        "evilcorp.example",
        "api.example.com.evil.example",
        "localhost.evil.example",
        "127.0.0.1.nip.io",
        "api-example.com",
        "xn--pple-43d.com",
    ],
)
def test_other_names_get_421(guarded: str, host: str) -> None:
    answer = _get(guarded, host)
    assert _status(answer) == 421, answer[:300]
    assert _json(answer)["error"]["code"] == "host_not_allowed"  # type: ignore[index]


@pytest.mark.parametrize(
    "host",
    [
        "evil.example@localhost",
        "localhost@evil.example",
        "[::1",
        "[::1]x",
        "[fe80::1%25eth0]",
        "::1",
        "localhost:80:80",
        "localhost:http",
        "local host",
        "evil.example/localhost",
        "localhost\\",
        "",
        "\xe9vil.example",
    ],
)
def test_a_malformed_host_is_400(guarded: str, host: str) -> None:
    """Refused (by the check, or earlier by h11), never taken for an allowed name."""
    answer = _get(guarded, host)
    assert _status(answer) == 400, answer[:300]


def test_a_missing_or_doubled_host_is_400_but_probes_need_none(guarded: str) -> None:
    http10 = _exchange(guarded, f"GET {UNKNOWN_RUN} HTTP/1.0\r\n\r\n")
    assert _status(http10) == 400
    assert _json(http10)["error"]["code"] == "bad_host"  # type: ignore[index]
    assert _status(_get(guarded, None)) == 400  # HTTP/1.1 without one: h11's own 400
    doubled = _exchange(
        guarded,
        f"GET {UNKNOWN_RUN} HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n"
        "Connection: close\r\n\r\n",
    )
    assert _status(doubled) == 400
    # Liveness and readiness read nothing: an orchestrator's probe passes whatever it names.
    for path in ("/healthz", "/readyz"):
        assert _status(_exchange(guarded, f"GET {path} HTTP/1.0\r\n\r\n")) == 200, path
        assert _status(_get(guarded, "evil.example", path)) == 200, path


@pytest.mark.parametrize(
    "target",
    [
        "http://evil.example{path}",
        "http://127.0.0.1:{port}{path}",
        "https://localhost{path}",
        "//evil.example{path}",
        "*",
    ],
)
def test_an_absolute_target_does_not_bypass_the_check(api: Api, guarded: str, target: str) -> None:
    """RFC 9112 lets a server take the host from an absolute target over Host: whichever a
    layer below took, a URL as the target is refused, or (`//name/...`) a path of this server."""
    _, key = api.key()
    port = _port(guarded)
    line = target.format(port=port, path=UNKNOWN_RUN)
    for host in ("evil.example", f"127.0.0.1:{port}"):
        answer = _exchange(
            guarded,
            f"GET {line} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
            "Connection: close\r\n\r\n",
        )
        status = _status(answer)
        if host == "evil.example":
            assert status in (400, 421), (line, answer[:300])
        elif line.startswith("//"):
            assert status == 404, (line, answer[:300])  # the path //evil.example/v1/...
        else:
            assert status == 400, (line, answer[:300])
            assert _json(answer)["error"]["code"] == "bad_request_target"  # type: ignore[index]


@contextmanager
def _with_local_socket(app: object, path: Path) -> Iterator[str]:
    """`app` on a loopback port and on the local socket at `path`: its TCP URL."""
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    unix = bind_local_socket(path)
    server = Server(config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [tcp, unix]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline
            time.sleep(0.01)
        yield f"http://127.0.0.1:{tcp.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        tcp.close()
        unix.close()


def test_the_local_socket_answers_any_host(fake_executor: execbox.Executor, tmp_path: Path) -> None:
    """No browser reaches a Unix socket: the CLI's requests there (Host: execbox) are served,
    while the same request on the TCP port is refused."""
    app = create_app(fake_executor, Settings())
    path = tmp_path / "serve.sock"
    with _with_local_socket(app, path) as url:
        head = "GET /console/runs HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n"
        with socket.socket(socket.AF_UNIX) as local:
            local.connect(str(path))
            local.sendall(head.encode())
            local.settimeout(10)
            answer = b""
            while chunk := local.recv(1 << 16):
                answer += chunk
        assert _status(answer) == 200, answer[:300]
        assert _status(_exchange(url, head)) == 421


def test_patterns_are_checked_and_split() -> None:
    assert split_patterns(["a.example, b.example", " *.c.example\td.example ", ""]) == [
        "a.example",
        "b.example",
        "*.c.example",
        "d.example",
    ]
    for bad in ("api.example.com:8443", "*.127.0.0.1", "**.example", "a@b", "http://x", "*."):
        with pytest.raises(UsageError, match="--allowed-host"):
            AllowedHosts([bad])
    allowed = AllowedHosts(["Api.Example.com.", "*.corp.example", "10.0.0.1", "[::1]"])
    assert allowed.allows(parse_host("api.example.com"))  # type: ignore[arg-type]
    assert not allowed.allows(parse_host("example.com"))  # type: ignore[arg-type]
    assert AllowedHosts(["*"]).allows(parse_host("anything.example"))  # type: ignore[arg-type]


def test_the_default_follows_the_bound_address() -> None:
    for loopback in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        assert default_patterns(loopback) == (), loopback
    everywhere = default_patterns("0.0.0.0")
    assert everywhere == (socket.gethostname().lower().removesuffix("."),)
    assert "api.internal" in default_patterns("api.internal")


def test_serve_refuses_a_bad_allowed_host_from_the_flag_or_the_environment(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "EXECBOX_HOME": str(tmp_path), "EXECBOX_ALLOWED_HOSTS": "ok.example,x:1"}
    for extra in ([], ["--allowed-host", "api.example.com:8443"]):
        proc = subprocess.run(
            [sys.executable, "-m", "execbox.cli", "serve", "--port", "0", "--no-socket", *extra],
            env=env if not extra else {**env, "EXECBOX_ALLOWED_HOSTS": ""},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, proc.stderr
        assert "--allowed-host" in proc.stderr and "without a port" in proc.stderr
