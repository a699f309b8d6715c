"""The console's keys, cookie and cross-site defences over HTTP, against the real server:
who gets in, what the cookie allows, and which forms are refused."""

from __future__ import annotations

import re
import uuid

import httpx

from tests.console.conftest import Console

HELD = {"profile": "extended", "network": ["example.com"]}


def _login(console: Console, key: str, **headers: str) -> httpx.Response:
    with httpx.Client(base_url=console.url) as client:
        return client.post(
            "/console/login",
            data={"key": key, "next": "/console/runs"},
            headers={"Origin": console.url, **headers},
        )


def _browser(console: Console, key: str) -> httpx.Client:
    """A client holding the login cookie only, as a browser does."""
    response = _login(console, key)
    assert response.status_code == 303, response.text
    client = httpx.Client(base_url=console.url, timeout=120)
    client.cookies.set("execbox_console", response.cookies["execbox_console"])
    return client


def _token(client: httpx.Client, run_id: str) -> str:
    found = re.search(
        r'name="csrf" value="([0-9a-f]+)"', client.get(f"/console/runs/{run_id}").text
    )
    assert found is not None
    return found.group(1)


def test_pages_without_a_key_send_the_browser_to_the_login_form(console: Console) -> None:
    with console.api(None) as client:
        for path in ("/console/runs", "/console/overview", "/console/runs/run_x"):
            response = client.get(path)
            assert response.status_code == 303, path
            assert response.headers["location"].startswith("/console/login?next=")


def test_login_cookie_is_httponly_samesite_strict_and_secure_only_over_tls(
    console: Console,
) -> None:
    _, key = console.key()
    plain = _login(console, key).headers["set-cookie"].lower()
    assert "httponly" in plain and "samesite=strict" in plain and "path=/console" in plain
    assert "secure" not in plain
    # Behind a TLS-terminating proxy on loopback (uvicorn trusts its forwarded scheme).
    https_origin = console.url.replace("http://", "https://")
    tls_login = _login(console, key, **{"X-Forwarded-Proto": "https", "Origin": https_origin})
    tls = tls_login.headers["set-cookie"].lower()
    assert "; secure" in tls


def test_a_wrong_key_at_login_gets_no_cookie(console: Console) -> None:
    response = _login(console, "ebx_not-a-real-key")
    assert response.status_code == 401 and "set-cookie" not in response.headers
    assert "unknown API key" in response.text


def test_login_redirects_only_within_the_console(console: Console) -> None:
    _, key = console.key()
    for target in ("https://evil.example/", "//evil.example/x", "/console//evil.example"):
        with httpx.Client(base_url=console.url) as client:
            response = client.post(
                "/console/login", data={"key": key, "next": target}, headers={"Origin": console.url}
            )
        assert response.headers["location"] == "/console/runs", target


def test_a_login_form_posted_from_another_site_is_refused(console: Console) -> None:
    _, key = console.key()
    response = _login(console, key, Origin="https://evil.example")
    assert response.status_code == 403 and "set-cookie" not in response.headers


def test_the_bearer_header_reads_pages_and_a_bad_one_is_401(console: Console) -> None:
    _, key = console.key()
    run = console.run(key, "print('by header')\n")
    with console.api(key) as client:
        page = client.get(f"/console/runs/{run['run_id']}")
        assert page.status_code == 200 and "by header" in page.text
    with console.api("ebx_not-a-real-key") as client:
        assert client.get("/console/runs").status_code == 401


def test_a_revoked_keys_cookie_goes_back_to_the_login_form(console: Console) -> None:
    name, key = console.key()
    with _browser(console, key) as client:
        assert client.get("/console/runs").status_code == 200
        console.keys.revoke(name)
        response = client.get("/console/runs")
        assert response.status_code == 303
        assert response.headers["location"].startswith("/console/login")


def test_approving_with_the_cookie_needs_an_admin_the_forms_token_and_this_origin(
    console: Console,
) -> None:
    _, key = console.key()
    _, other = console.key()
    _, admin = console.admin()
    held = console.run(key, "print('held')\n", **HELD)
    run_id = held["run_id"]
    with (
        _browser(console, admin) as client,
        _browser(console, other) as stranger,
        _browser(console, key) as owner,
    ):
        token = _token(client, run_id)
        stranger_token = _token(stranger, console.run(other, "print(1)\n", **HELD)["run_id"])
        approve = f"/console/runs/{run_id}/approve"
        # The tenant whose run was held, with its own valid form: only an admin releases it.
        own = owner.post(
            approve, data={"csrf": _token(owner, run_id)}, headers={"Origin": console.url}
        )
        assert own.status_code == 403 and "admin key" in own.text, own.text
        for data, headers in (
            ({}, {}),  # a cross-site form carries the cookie but cannot know the token
            ({"csrf": "0" * 64}, {}),
            ({"csrf": stranger_token}, {}),  # another key's token
            ({"csrf": token}, {"Origin": "https://evil.example"}),
        ):
            response = client.post(approve, data=data, headers=headers)
            assert response.status_code == 403, (data, headers)
        assert client.post(f"/console/runs/{run_id}/reject", data={}).status_code == 403
        with console.api(key) as api:
            assert api.get(f"/v1/runs/{run_id}").json()["approved_at"] is None
        done = client.post(approve, data={"csrf": token}, headers={"Origin": console.url})
        assert done.status_code == 303
        assert client.post(approve, data={"csrf": token}).status_code == 409  # once only
        with console.api(key) as api:  # the released run is the held run's tenant's
            assert api.get(done.headers["location"].replace("/console", "/v1")).status_code == 200


def test_pages_and_artifacts_carry_a_strict_content_security_policy(console: Console) -> None:
    _, key = console.key()
    run = console.run(key, "open('page.html', 'w').write('<script>alert(1)</script>')\n")
    with console.api(key) as client:
        page = client.get(f"/console/runs/{run['run_id']}")
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp
        assert "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
        art = client.get(f"/console/runs/{run['run_id']}/artifacts/page.html")
        assert art.status_code == 200 and art.content == b"<script>alert(1)</script>"
        assert art.headers["content-type"] == "application/octet-stream"
        assert art.headers["content-disposition"].startswith("attachment;")
        assert art.headers["content-security-policy"] == "default-src 'none'; sandbox"
        assert art.headers["x-content-type-options"] == "nosniff"


def test_an_admin_key_sees_every_tenants_runs(console: Console) -> None:
    _, key = console.key()
    _, admin = console.admin()
    run = console.run(key, "print('a tenant run')\n")
    with console.api(admin) as client:
        assert run["run_id"] in client.get("/console/runs").text
        assert client.get(f"/console/runs/{run['run_id']}").status_code == 200


def test_runs_filter_by_code_language_and_time_and_page_by_fifty(console: Console) -> None:
    _, key = console.key()
    marker = "needle_" + key[-6:].replace("-", "_")
    console.run(key, f"{marker} = 1\nprint({marker})\n")
    console.run(key, "console.log('js')\n", language="javascript")
    with console.api(key) as client:

        def shown(**query: str) -> int:
            return client.get("/console/runs", params=query).text.count('class="run status-')

        assert shown() == 2
        assert shown(q=marker) == 1
        assert shown(q="no such text anywhere") == 0
        assert shown(language="javascript") == 1
        assert shown(period="15m") == 2
        for _ in range(49):
            console.run(key, "pass\n")
        first = client.get("/console/runs").text
        assert first.count('class="run status-') == 50 and 'id="older"' in first
        second = client.get("/console/runs", params={"page": "2"}).text
        assert second.count('class="run status-') == 1 and 'id="older"' not in second
        assert marker in second  # the oldest run is on the second page


def test_console_pages_count_against_the_keys_rate(console: Console) -> None:
    name = f"slow-{uuid.uuid4().hex[:8]}"
    key = console.keys.create(name, rpm=3)
    with console.api(key) as client:
        assert [client.get("/console/runs").status_code for _ in range(3)] == [200] * 3
        limited = client.get("/console/overview")
        assert limited.status_code == 429 and limited.json()["error"]["code"] == "rate_limited"
