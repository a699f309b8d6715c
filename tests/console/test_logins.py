"""The console's login cookie holds a server-side login's random token, never the key: against
the real server, a cookie that leaks reveals no key, and stops working when its key is revoked,
at logout, after its idle time, or if it was never issued (the key itself included)."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

import execbox
from execbox.server import Settings, create_app
from execbox.server.auth import KeyStore
from execbox.server.background import serving
from execbox.server.console.access import COOKIE
from execbox.server.console.logins import PER_KEY, Logins, console_logins
from tests.console.conftest import Console
from tests.test_records_postgres import pg_server, pg_url  # noqa: F401 - fixtures


def _login(url: str, key: str) -> str:
    """The cookie a login with `key` sets."""
    with httpx.Client(base_url=url) as client:
        response = client.post(
            "/console/login", data={"key": key, "next": "/console/runs"}, headers={"Origin": url}
        )
    assert response.status_code == 303, response.text
    token: str = response.cookies[COOKIE]
    return token


def _with_cookie(url: str, token: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=120)
    client.cookies.set(COOKIE, token)
    return client


def _logged_in(url: str, token: str) -> bool:
    with _with_cookie(url, token) as client:
        response = client.get("/console/runs")
    if response.status_code == 303:
        assert response.headers["location"].startswith("/console/login")
        return False
    assert response.status_code == 200, response.text
    return True


def _csrf(client: httpx.Client) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', client.get("/console/runs").text)
    assert found is not None
    return found.group(1)


def test_the_cookie_is_a_random_token_that_names_no_key(console: Console) -> None:
    _, key = console.key()
    with httpx.Client(base_url=console.url) as client:
        response = client.post("/console/login", data={"key": key}, headers={"Origin": console.url})
    assert key not in response.headers["set-cookie"]
    first, second = response.cookies[COOKIE], _login(console.url, key)
    assert first != second and key not in (first, second)
    assert len(first) >= 43 and re.fullmatch(r"[A-Za-z0-9_-]+", first)
    assert _logged_in(console.url, first) and _logged_in(console.url, second)


def test_a_key_or_a_forged_token_in_the_cookie_is_no_login(console: Console) -> None:
    """What the cookie held before (the key itself) no longer logs anyone in."""
    _, key = console.key()
    for forged in (key, secrets.token_urlsafe(32), "x", "a" * 4000):
        assert not _logged_in(console.url, forged), forged[:20]


def test_a_revoked_keys_logins_end_at_once(console: Console) -> None:
    name, key = console.key()
    tokens = [_login(console.url, key) for _ in range(2)]
    assert all(_logged_in(console.url, t) for t in tokens)
    console.keys.revoke(name)
    assert not any(_logged_in(console.url, t) for t in tokens)


def test_logout_ends_that_login_and_no_other(console: Console) -> None:
    _, key = console.key()
    mine, other = _login(console.url, key), _login(console.url, key)
    with _with_cookie(console.url, mine) as client:
        out = client.post(
            "/console/logout", data={"csrf": _csrf(client)}, headers={"Origin": console.url}
        )
        assert out.status_code == 303
    assert not _logged_in(console.url, mine)  # the cookie kept by a proxy's log is dead too
    assert _logged_in(console.url, other)


def test_a_forms_token_is_its_own_logins(console: Console) -> None:
    """Two logins of one key: one's form token does not pass with the other's cookie."""
    _, key = console.key()
    first, second = _login(console.url, key), _login(console.url, key)
    with _with_cookie(console.url, first) as a, _with_cookie(console.url, second) as b:
        token_b = _csrf(b)
        assert _csrf(a) != token_b
        refused = a.post("/console/logout", data={"csrf": token_b}, headers={"Origin": console.url})
        assert refused.status_code == 403
    assert _logged_in(console.url, first)


def test_execbox_serve_refuses_a_rebound_host(console: Console) -> None:
    """Through the command's own wiring: a page renamed to the server's address (DNS
    rebinding) gets no login form, no login and no page; the server's own names do."""
    _, key = console.key()
    port = console.url.rsplit(":", 1)[1]
    with httpx.Client(base_url=console.url) as client:
        for host, status in ((f"evil.example:{port}", 421), (f"localhost:{port}", 200)):
            assert client.get("/console/login", headers={"Host": host}).status_code == status
        refused = client.post(
            "/console/login",
            data={"key": key},
            headers={"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"},
        )
        assert refused.status_code == 421 and "set-cookie" not in refused.headers
        assert refused.json()["error"]["code"] == "host_not_allowed"


@pytest.fixture
def quick_idle(fake_executor: execbox.Executor) -> Iterator[tuple[str, KeyStore]]:
    """A server whose console logins end after 2 s without a page view."""
    with serving(create_app(fake_executor, Settings(console_idle_s=2.0))) as url:
        yield url, KeyStore(fake_executor.store.engine)


def test_a_login_ends_after_its_idle_time_and_views_keep_it(
    quick_idle: tuple[str, KeyStore],
) -> None:
    url, keys = quick_idle
    key = keys.create(f"idle-{secrets.token_hex(4)}", rpm=100_000)
    kept, left = _login(url, key), _login(url, key)
    until = time.monotonic() + 3.5
    while time.monotonic() < until:  # past the idle time, with a view every half second
        assert _logged_in(url, kept)
        time.sleep(0.5)
    assert not _logged_in(url, left)
    time.sleep(2.5)
    assert not _logged_in(url, kept)


def _bounded_and_swept(engine: sa.Engine) -> None:
    keys = KeyStore(engine)
    now = [1000.0]
    logins = Logins(keys, idle_s=100.0, clock=lambda: now[0])
    alice, bob = (
        keys.create(f"alice-{secrets.token_hex(4)}"),
        keys.create(f"bob-{secrets.token_hex(4)}"),
    )
    tokens = []
    for _ in range(PER_KEY + 3):
        tokens.append(logins.open(alice))
        now[0] += 1
    assert [logins.find(t) is not None for t in tokens] == [False] * 3 + [True] * PER_KEY
    found = logins.find(tokens[-1])
    assert found is not None and found.tenant.name.startswith("alice-")
    now[0] += 101  # every alice login is now idle past its time
    logins.open(bob)
    with engine.connect() as conn:
        left = conn.scalar(sa.select(sa.func.count()).select_from(console_logins))
    assert left == 1
    assert logins.find(tokens[-1]) is None


def test_logins_are_bounded_per_key_and_expired_ones_are_removed(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'keys.db'}")
    try:
        _bounded_and_swept(engine)
    finally:
        engine.dispose()


def test_logins_work_on_postgresql(pg_url: str) -> None:  # noqa: F811
    engine = sa.create_engine(pg_url)
    try:
        assert engine.dialect.name == "postgresql"
        _bounded_and_swept(engine)
    finally:
        engine.dispose()
