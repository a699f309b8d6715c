"""Attacks on the console through a real `execbox serve` over the real sandbox, as a hostile
tenant, hostile code and a hostile web page would make them: filters and ids that could widen
a tenant's view, markup smuggled through a session's outputs, the login link and forms sent
from elsewhere, and lists of runs whose output is large."""

from __future__ import annotations

import re

import httpx

from tests.console.conftest import Console

HELD = {"profile": "extended", "network": ["example.com"]}


def _cells(console: Console, key: str, *codes: str) -> tuple[str, list[dict[str, object]]]:
    with console.api(key) as client:
        sid = client.post("/v1/sessions", json={}).json()["session_id"]
        try:
            done = [
                client.post(f"/v1/sessions/{sid}/cells", json={"code": c}).json() for c in codes
            ]
        finally:
            client.delete(f"/v1/sessions/{sid}")
    return sid, done


def test_filters_and_another_tenants_ids_never_widen_a_tenants_view(console: Console) -> None:
    _, owner = console.key()
    _, stranger = console.key()
    marker = "secret_marker_of_the_owner"
    run = console.run(owner, f"print('{marker}')\nopen('chart.png', 'w').write('x')\n")
    held = console.run(owner, "print('held')\n", **HELD)
    sid, _ = _cells(console, owner, "x = 1\n")
    rid = run["run_id"]
    with console.api(stranger) as client:
        # LIKE wildcards and SQL in the text filter, SQL in an equality filter, the last page.
        for params in (
            {"q": "%"},
            {"q": "_"},
            {"q": "' OR 1=1 --"},
            {"q": marker},
            {"status": "ok' OR '1'='1"},
            {"status": "needs_approval"},
            {"page": "100000"},
        ):
            page = client.get("/console/runs", params=params)
            assert page.status_code == 200, params
            assert rid not in page.text and held["run_id"] not in page.text, params
            assert 'class="run status-' not in page.text, params  # the stranger has no runs
        for path in (
            f"/console/runs/{rid}",
            f"/console/runs/{rid}/artifacts/chart.png",
            f"/console/runs/{held['run_id']}",
            f"/console/sessions/{sid}",
        ):
            assert client.get(path).status_code == 404, path
        assert sid not in client.get("/console/sessions").text
        for action in ("approve", "reject"):
            assert client.post(f"/console/runs/{held['run_id']}/{action}").status_code == 404
        assert client.get("/console/asks/anything").status_code == 404  # admin's only
        # Huge or negative pages are refused before any query.
        assert client.get("/console/runs", params={"page": "0"}).status_code == 422
        assert client.get("/console/runs", params={"page": "10000000"}).status_code == 422
    with console.api(owner) as client:
        assert client.get(f"/v1/runs/{held['run_id']}").json()["approved_at"] is None
        assert marker in client.get("/console/runs", params={"q": marker}).text


def test_a_cells_outputs_cannot_smuggle_markup_into_a_data_url_or_the_page(
    console: Console,
) -> None:
    """A cell chooses its outputs' MIME types and bytes: an "image" whose data breaks out of
    the attribute, SVG with a handler, HTML: none becomes markup of the console's page."""
    _, key = console.key()
    cell = (
        "from IPython.display import display\n"
        "display({'image/png': 'AAAA\" onerror=\"alert(1)', 'text/plain': 'p'}, raw=True)\n"
        "display({'image/jpeg': 'data:text/html,<script>alert(2)</script>'}, raw=True)\n"
        "display({'image/svg+xml': '<svg onload=alert(3)>'}, raw=True)\n"
        "display({'text/html': '\"></iframe><script>alert(4)</script>'}, raw=True)\n"
    )
    sid, done = _cells(console, key, cell)
    assert done[0]["status"] == "ok", done
    with console.api(key) as client:
        page = client.get(f"/console/sessions/{sid}").text
    images = re.findall(r"<img [^>]*>", page)
    assert images == [
        '<img class="output-image" alt="chart" src="data:image/png;base64,">',
        '<img class="output-image" alt="chart" src="data:image/jpeg;base64,">',
    ]
    frames = re.findall(r"<iframe [^>]*>", page)
    assert frames == [
        '<iframe class="output-html" sandbox="" title="HTML output" '
        'srcdoc="&#34;&gt;&lt;/iframe&gt;&lt;script&gt;alert(4)&lt;/script&gt;">'
    ]
    assert "<svg onload" not in page and "&lt;svg onload=alert(3)&gt;" in page
    assert "<script>" not in page.replace('<script src="/console/static/console.js" defer>', "")


def test_login_and_forms_from_elsewhere_or_by_get_are_refused(console: Console) -> None:
    _, victim = console.key()
    _, attacker = console.key()
    held = console.run(victim, "print('held')\n", **HELD)
    with httpx.Client(base_url=console.url) as anon:
        # Login CSRF: a page (or a sandboxed frame, Origin null) logging the victim into the
        # attacker's key.
        for origin in (
            "null",
            "http://evil.example",
            console.url.replace("127.0.0.1", "localhost"),
        ):
            tossed = anon.post("/console/login", data={"key": attacker}, headers={"Origin": origin})
            assert tossed.status_code == 403, origin
            assert "set-cookie" not in tossed.headers, origin
        login = anon.post("/console/login", data={"key": victim}, headers={"Origin": console.url})
        assert login.status_code == 303
    with httpx.Client(base_url=console.url, timeout=120) as browser:
        browser.cookies.set("execbox_console", login.cookies["execbox_console"])
        token = re.search(
            r'name="csrf" value="([0-9a-f]+)"', browser.get(f"/console/runs/{held['run_id']}").text
        )
        assert token is not None
        for path in ("/console/logout", f"/console/runs/{held['run_id']}/approve"):
            assert browser.get(path).status_code == 405, path  # no side effect on a GET
            refused = browser.post(path, data={"csrf": token.group(1)}, headers={"Origin": "null"})
            assert refused.status_code == 403, path
            assert "set-cookie" not in refused.headers
        assert browser.get("/console/runs").status_code == 200  # still logged in
        with console.api(victim) as api:
            assert api.get(f"/v1/runs/{held['run_id']}").json()["approved_at"] is None


def test_the_login_link_and_reflected_values_stay_inert(console: Console) -> None:
    _, key = console.key()
    with httpx.Client(base_url=console.url) as anon:
        for target, kept in (
            ("javascript:alert(1)", "/console/runs"),
            ("//evil.example/console/", "/console/runs"),
            ("/console//evil.example", "/console/runs"),
            ("https://evil.example/console/runs", "/console/runs"),
            ('/console/"><script>alert(1)</script>', "/console/&#34;&gt;&lt;script&gt;"),
        ):
            form = anon.get("/console/login", params={"next": target}).text
            shown = re.findall(r'name="next" value="([^"]*)"', form)
            assert len(shown) == 1 and shown[0].startswith(kept), (target, shown)
            done = anon.post(
                "/console/login",
                data={"key": key, "next": target},
                headers={"Origin": console.url},
            )
            assert done.status_code == 303
            location = done.headers["location"]
            assert location.startswith("/console/") and not location.startswith("/console//")
            assert "<" not in location and '"' not in location
    with console.api(key) as client:
        page = client.get("/console/runs", params={"profile": '"><svg onload=alert(1)>'})
        assert "<svg onload" not in page.text
        assert 'value="&#34;&gt;&lt;svg onload=alert(1)&gt;"' in page.text
        # Errors name what was asked for, as JSON: never a page a browser would render.
        missing = client.get("/console/runs/<script>alert(1)</script>")
        assert missing.status_code == 404
        assert missing.headers["content-type"] == "application/json"


def test_an_image_named_file_of_html_is_served_only_as_an_inert_image(console: Console) -> None:
    """The MIME type comes from the name: a `.png` of HTML is served inline, but as an image
    the browser may not sniff, under a CSP that sandboxes it."""
    _, key = console.key()
    body = "<html><script>alert(document.cookie)</script></html>"
    run = console.run(key, f"open('plot.png', 'w').write({body!r})\n")
    with console.api(key) as client:
        art = client.get(f"/console/runs/{run['run_id']}/artifacts/plot.png")
    assert art.status_code == 200 and art.text == body
    assert art.headers["content-type"] == "image/png"
    assert art.headers["x-content-type-options"] == "nosniff"
    assert art.headers["content-security-policy"] == "default-src 'none'; sandbox"
    assert art.headers["content-disposition"] == "inline; filename*=UTF-8''plot.png"


def test_lists_of_runs_with_large_output_show_their_rows_and_figures(console: Console) -> None:
    """The runs list and the overview read a few columns, not each run's output; their rows
    and figures are still right."""
    _, key = console.key()
    big = "import sys\nsys.stdout.write('o' * 900_000)\nsys.stderr.write('e' * 900_000)\n"
    for i in range(3):
        console.run(key, big + f"# run {i} <b>\n")
    failed = console.run(key, "raise KeyError('k')\n")
    with console.api(key) as client:
        rows = client.get("/console/runs", params={"part": "rows"})
        overview = client.get("/console/overview")
    assert rows.status_code == 200 and overview.status_code == 200
    assert rows.text.count('class="run status-') == 4
    assert len(rows.text) < 20_000  # no output in a list
    assert "# run" in rows.text and "# run 0" not in rows.text  # the code's first 80 characters
    assert f'data-run="{failed["run_id"]}"' in rows.text
    assert re.search(r"<td>\d+\.\d ms</td>", rows.text)
    assert "4 runs" in overview.text
    assert "KeyError" in overview.text


def test_a_tenants_api_key_alone_cannot_release_its_own_held_run(console: Console) -> None:
    """The policy holds a run for someone to approve; the program that sent it holds only its
    API key. Through the console, that key, sent as a header (no form token needed), releases
    the run: the hold is no gate against the program it held."""
    _, key = console.key()
    held = console.run(key, "print('let out')\n", **HELD)
    assert held["status"] == "needs_approval", held
    with console.api(key) as client:
        released = client.post(f"/console/runs/{held['run_id']}/approve")
        approved_at = client.get(f"/v1/runs/{held['run_id']}").json()["approved_at"]
    assert released.status_code in (403, 404)
    assert approved_at is None


def test_a_session_of_many_cells_of_large_output_is_paged_and_clipped(console: Console) -> None:
    """A session's page showed every cell (up to 1000) with its whole output: a tenant's 100
    cells of 1 MB made one page of 400 MB. Now 50 cells a page, each text clipped."""
    _, key = console.key()
    loud = "import sys\nsys.stdout.write('<' * 30_000)\nsys.stderr.write('e' * 30_000)\n"
    sid, done = _cells(console, key, loud, *[f"print({i})\n" for i in range(2, 53)])
    assert len(done) == 52 and done[0]["status"] == "ok", done[0]
    with console.api(key) as client:
        first = client.get(f"/console/sessions/{sid}")
        second = client.get(f"/console/sessions/{sid}", params={"page": "2"})
        past = client.get(f"/console/sessions/{sid}", params={"page": "3"})
    assert first.status_code == 200 and second.status_code == 200
    assert first.text.count('<section class="cell"') == 50 and 'id="later"' in first.text
    assert 'id="cell-51"' in second.text and 'id="cell-52"' in second.text
    assert second.text.count('<section class="cell"') == 2 and 'id="later"' not in second.text
    assert 'id="earlier"' in second.text
    assert past.status_code == 404
    assert first.text.count("The first 20000 of 30000 characters") == 2
    assert len(first.text) < 200_000  # 20000 '<' written as '&lt;', and 20000 'e'
    run_link = f'the whole of it is on <a href="/console/runs/{done[0]["run_id"]}">'
    assert run_link in first.text
