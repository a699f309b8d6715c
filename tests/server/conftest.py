"""A real uvicorn server on loopback, shared by the server tests: over the real sandbox
(`api`), or over the fake one (`fake_api`) for claims about the server alone."""

from __future__ import annotations

import itertools
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import pytest

import execbox
from execbox.server import Settings, create_app
from execbox.server.auth import TENANT, KeyStore
from execbox.server.background import serving
from execbox.server.state import ServerState

from .e2b_support import E2BServer, e2b_serving, use_sdk


def raw_connect(url: str, head: bytes = b"") -> socket.socket:
    """A connection of its own to the server at `url`, `head` sent on it."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.sendall(head)
    return sock


def read_until_closed(sock: socket.socket, timeout_s: float) -> bytes:
    """What the server sends until it closes the connection (or `timeout_s` of silence)."""
    sock.settimeout(timeout_s)
    chunks = []
    try:
        while chunk := sock.recv(1 << 16):
            chunks.append(chunk)
    except TimeoutError:
        pass
    return b"".join(chunks)


MAX_REQUEST_BYTES = 256 * 1024
_names = itertools.count()


@dataclass
class Api:
    url: str
    keys: KeyStore
    executor: execbox.Executor

    def key(
        self,
        prefix: str = "tenant",
        *,
        concurrent: int = 8,
        sessions: int = 4,
        rpm: int = 10_000,
        role: str = TENANT,
    ) -> tuple[str, str]:
        """A fresh key: (tenant name, key)."""
        name = f"{prefix}-{next(_names)}-{uuid.uuid4().hex[:6]}"
        return name, self.keys.create(
            name, max_concurrent=concurrent, max_sessions=sessions, rpm=rpm, role=role
        )

    def http(self, key: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)


@contextmanager
def own_server(executor: execbox.Executor, **settings: object) -> Iterator[tuple[str, ServerState]]:
    """A server of its own with these `Settings`, over `executor`: (url, its state)."""
    app = create_app(executor, Settings(**settings))  # type: ignore[arg-type]
    with serving(app) as url:
        yield url, app.state.execbox


@contextmanager
def api_over(executor: execbox.Executor) -> Iterator[Api]:
    """The shared server's settings over `executor`."""
    app = create_app(executor, Settings(max_request_bytes=MAX_REQUEST_BYTES))
    with serving(app) as url:
        yield Api(url, app.state.execbox.keys, executor)


@pytest.fixture(scope="session")
def real_api(executor: execbox.Executor) -> Iterator[Api]:
    """The server over the real sandbox, under a name that a module's own `api` (set to
    `fake_api` where most claims are the server's) does not hide."""
    with api_over(executor) as api:
        yield api


@pytest.fixture(scope="session")
def api(real_api: Api) -> Api:
    return real_api


@pytest.fixture(scope="session")
def fake_api(fake_executor: execbox.Executor) -> Iterator[Api]:
    """The same server over the fake sandbox: for claims about the server, not the sandbox."""
    with api_over(fake_executor) as api:
        yield api


@pytest.fixture
def alice(api: Api) -> Iterator[httpx.Client]:
    with api.http(api.key("alice")[1]) as client:
        yield client


@pytest.fixture
def real_alice(real_api: Api) -> Iterator[httpx.Client]:
    with real_api.http(real_api.key("alice")[1]) as client:
        yield client


@pytest.fixture
def bob(api: Api) -> Iterator[httpx.Client]:
    with api.http(api.key("bob")[1]) as client:
        yield client


@pytest.fixture
def fake_alice(fake_api: Api) -> Iterator[httpx.Client]:
    with fake_api.http(fake_api.key("alice")[1]) as client:
        yield client


@pytest.fixture
def fake_bob(fake_api: Api) -> Iterator[httpx.Client]:
    with fake_api.http(fake_api.key("bob")[1]) as client:
        yield client


@pytest.fixture(scope="module")
def e2b_server(
    executor: execbox.Executor, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[E2BServer]:
    """A server with the E2B face on, per module (`e2b_support.e2b_serving`)."""
    del executor  # proves the host can sandbox (else the module is skipped), before its own
    with e2b_serving(tmp_path_factory) as (url, state):
        yield E2BServer(url, state)


@pytest.fixture
def e2b_tenant(e2b_server: E2BServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh key on `e2b_server`, set in the SDK's environment; its name."""
    name, key = e2b_server.key()
    use_sdk(monkeypatch, e2b_server.url, key)
    yield name
    e2b_server.revoke(name)
