"""Hostile code, output, error messages, artifact names and cell outputs stay text in the
console: nothing a run wrote runs in the browser (no dialog fires, no element is made from it),
and control characters are shown written out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from execbox.agent.trace import TraceStore, new_ask_id
from execbox.records import RunStore
from tests.console.conftest import Console, log_in

PAYLOADS = [
    "<script>alert('script')</script>",
    '"><img src=x onerror=alert("attr")>',
    "'><svg onload=alert('svg')>",
    "</pre></code><iframe srcdoc='<script>parent.alert(1)</script>'></iframe>",
    "{{ 7 * 7 }}{% raw %}",
]
# Names a run may give its files (no slash), each carrying markup or a control character.
NAMES = [
    '"><img src=x onerror=alert("name")>.html',
    "<svg onload=alert('n')>.svg",
    "<img src=x onerror=alert(9)>.png",
    "bell\x07and\x1b[31mred.txt",
]
HOSTILE = f"""
# {PAYLOADS[1]}
payloads = {PAYLOADS!r}
for p in payloads:
    print(p)
    print(p, file=__import__("sys").stderr)
print("ctl:\\x1b[31m\\x00\\x07\\u202e")
for name in {NAMES!r}:
    with open(name, "w") as f:
        f.write("<script>alert('artifact')</script><svg xmlns='http://www.w3.org/2000/svg' onload='alert(2)'/>")
raise ValueError({PAYLOADS[1]!r})
"""


def _no_markup_from_the_run(page: Any) -> None:
    assert page.dialogs == []
    assert page.locator("img[src=x]").count() == 0
    assert page.locator("main script, main iframe:not([sandbox='']), main svg[onload]").count() == 0


def test_hostile_code_output_error_and_names_stay_text(
    console: Console, browser_page: Any, screenshots: Path
) -> None:
    _, key = console.key()
    result = console.run(key, HOSTILE)
    assert result["status"] == "error", result
    run_id = result["run_id"]
    page = browser_page
    log_in(page, console, key)
    page.locator(f'tr[data-run="{run_id}"]').wait_for()
    _no_markup_from_the_run(page)
    page.goto(f"{console.url}/console/runs/{run_id}")
    stdout = page.locator("#stdout").inner_text()
    stderr = page.locator("#stderr").inner_text()
    for payload in PAYLOADS:
        assert payload in stdout and payload in stderr
    assert "ctl:\\x1b[31m\\x00\\x07\\u202e" in stdout  # control characters written out
    assert PAYLOADS[1] in page.locator("#error").inner_text()
    assert PAYLOADS[1] in page.locator("#code").inner_text()
    artifacts = page.locator("#artifacts").inner_text()
    for name in NAMES[:3]:
        assert name in artifacts
    assert "bell\\x07and\\x1b[31mred.txt" in artifacts
    # The PNG-named file is shown as an image (it is not one): it only fails to load.
    assert page.locator("img.artifact-image").count() == 1
    page.wait_for_timeout(500)  # any handler the markup could have set off has run by now
    _no_markup_from_the_run(page)
    page.screenshot(path=str(screenshots / "hostile-run.png"), full_page=True)


def test_script_capable_artifacts_are_downloads_never_pages(
    console: Console, browser_page: Any
) -> None:
    _, key = console.key()
    result = console.run(key, HOSTILE)
    page = browser_page
    log_in(page, console, key)
    page.goto(f"{console.url}/console/runs/{result['run_id']}")
    links = page.locator("#artifacts a[download]")
    assert links.count() == len(NAMES)
    for i in range(links.count()):
        href = links.nth(i).get_attribute("href")
        assert href is not None
        response = page.request.get(console.url + href)
        assert response.status == 200
        headers = response.headers
        assert headers["content-type"] == "application/octet-stream"
        assert headers["content-disposition"].startswith("attachment; filename*=UTF-8''")
        assert "\n" not in headers["content-disposition"]
        assert headers["content-security-policy"] == "default-src 'none'; sandbox"
    # Opened directly, the HTML and SVG files are downloaded, not rendered.
    before = page.url
    for suffix in (".html", ".svg"):
        href = page.locator(f'#artifacts a[href$="{suffix}?download=1"]').get_attribute("href")
        plain = (href or "").removesuffix("?download=1")
        with pytest.raises(Exception, match="Download is starting"):
            page.goto(console.url + plain)
        assert page.url == before  # the browser stayed on the run's page
    _no_markup_from_the_run(page)


def test_hostile_html_cell_output_cannot_script_the_console(
    console: Console, browser_page: Any
) -> None:
    _, key = console.key()
    cell = (
        "from IPython.display import HTML, display\n"
        "display(HTML(\"<b id='bold'>table</b><script>parent.alert('cell')</script>"
        '<img src=x onerror=\\"parent.alert(\'cell img\')\\">"))\n'
    )
    with httpx.Client(
        base_url=console.url, headers={"Authorization": f"Bearer {key}"}, timeout=120
    ) as client:
        sid = client.post("/v1/sessions", json={}).json()["session_id"]
        done = client.post(f"/v1/sessions/{sid}/cells", json={"code": cell}).json()
        client.delete(f"/v1/sessions/{sid}")
    assert any(o["mime_type"] == "text/html" for o in done["outputs"]), done
    page = browser_page
    log_in(page, console, key)
    page.goto(f"{console.url}/console/sessions/{sid}")
    frame = page.locator("iframe.output-html")
    assert frame.get_attribute("sandbox") == ""
    page.wait_for_timeout(500)
    _no_markup_from_the_run(page)
    assert page.frame_locator("iframe.output-html").locator("#bold").inner_text() == "table"


def test_a_hostile_agent_answer_stays_text(console: Console, browser_page: Any) -> None:
    """A model's words are as hostile as a run's output: question, answer, checklist, verdict
    details, stage names and model errors are all text on the answer's page."""
    traces = TraceStore(RunStore().engine)
    ask_id = new_ask_id()
    bad = PAYLOADS[1]
    traces.start(ask_id, f"question {bad}", f"model {bad}")
    traces.add_stage(ask_id, 1, f"plan{bad}"[:20], 0, f"s{bad}"[:40], 0.0, 1.0, None, {})
    traces.add_call(ask_id, 2, "plan", f"m{bad}", 1, 2, 1, 3.0, False, f"error {bad}")
    answer = {
        "answer": f"answer {bad}",
        "plan": {"checklist": [f"item {bad}"]},
        "verdicts": [{"check": "answer", "passed": False, "detail": f"detail {bad}"}],
    }
    traces.finish(ask_id, "answered", json.dumps(answer), [f"run{bad}"], 1, 2)
    _, admin = console.admin()
    page = browser_page
    log_in(page, console, admin)
    page.goto(f"{console.url}/console/asks")
    assert f"question {bad}" in page.locator("#asks").inner_text()
    page.goto(f"{console.url}/console/asks/{ask_id}")
    body = page.locator("main").inner_text()
    for text in (f"question {bad}", f"answer {bad}", f"item {bad}", f"detail {bad}"):
        assert text in body
    assert f"error {bad}" in page.locator("#calls").inner_text()
    assert page.locator("a.cited-run").inner_text() == f"run{bad}"
    page.wait_for_timeout(300)
    _no_markup_from_the_run(page)
