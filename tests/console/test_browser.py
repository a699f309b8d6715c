"""The console in a real browser (Debian's Chromium, headless) against a real `execbox serve`
over the real sandbox: log in, watch a run arrive, open it, see its chart, approve a held run,
filter, follow an agent answer to the run it cites; another tenant sees none of it."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest

import execbox
from execbox.agent import ask
from tests.agent.agent_scripts import answer_from_result, approve, plan, program
from tests.agent.chat_server import Reply, serve
from tests.console.conftest import Console, log_in

CHART = """
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(4, 3), dpi=50)
ax.bar(["a", "b", "c"], [3, 1, 2])
fig.savefig("chart.png")
print("drawn")
"""
SESSION_CHART = """
import matplotlib.pyplot as plt
plt.figure(figsize=(2, 1), dpi=50)
plt.plot([1, 3, 2])
plt.show()
"""
# The extended profile holds every run that asks for network until someone approves it.
HELD = {"profile": "extended", "network": ["example.com"]}


def test_login_then_a_submitted_run_appears_live_and_opens(
    console: Console, browser_page: Any, screenshots: Path
) -> None:
    _, key = console.key()
    page = browser_page
    log_in(page, console, key)
    assert page.locator("#rows tr.run").count() == 0  # a new tenant: nothing yet
    result = console.run(key, "x = 6 * 7\nprint('answer', x)\nraise ValueError('late')\n")
    run_id = result["run_id"]
    row = page.locator(f'tr[data-run="{run_id}"]')
    row.wait_for(timeout=20_000)  # the list fetches new rows by itself: no reload
    assert row.locator(".status").inner_text() == "error"
    page.screenshot(path=str(screenshots / "runs.png"), full_page=True)
    row.locator("a").first.click()
    page.wait_for_url(f"**/console/runs/{run_id}")
    assert page.locator("#stdout").inner_text().strip() == "answer 42"
    assert "ValueError" in page.locator("#error").inner_text()
    marked = page.locator("#code li.error-line")
    assert marked.count() == 1 and marked.get_attribute("id") == "L3"
    assert result["image_digest"] in page.locator("dl.facts").inner_text()
    page.screenshot(path=str(screenshots / "run.png"), full_page=True)
    assert page.dialogs == []


def test_chart_artifact_renders_inline_at_its_natural_size(
    console: Console, browser_page: Any, screenshots: Path
) -> None:
    _, key = console.key()
    result = console.run(key, CHART)
    assert result["status"] == "ok", result
    page = browser_page
    log_in(page, console, key)
    page.goto(f"{console.url}/console/runs/{result['run_id']}")
    image = page.locator("img.artifact-image")
    image.wait_for()
    page.wait_for_function("document.querySelector('img.artifact-image').complete")
    size = image.evaluate("img => [img.naturalWidth, img.naturalHeight]")
    assert size == [200, 150]  # 4 x 3 inches at 50 dpi: the PNG itself, decoded
    page.screenshot(path=str(screenshots / "run-chart.png"), full_page=True)


def test_a_held_run_is_approved_in_the_browser_and_runs(
    console: Console, browser_page: Any, screenshots: Path
) -> None:
    _, key = console.key()
    held = console.run(key, "print('released', 6 * 7)\n", **HELD)
    assert held["status"] == "needs_approval", held
    page = browser_page
    log_in(page, console, key)  # its own tenant is offered no approval
    page.goto(f"{console.url}/console/runs/{held['run_id']}")
    assert page.locator("#approve").count() == 0
    assert "admin key" in page.locator("#approve-note").inner_text()
    page.context.clear_cookies()
    log_in(page, console, console.admin()[1])
    page.goto(f"{console.url}/console/runs/{held['run_id']}")
    assert "network.approval" in page.locator("#policy").inner_text()
    page.screenshot(path=str(screenshots / "held.png"), full_page=True)
    page.click("#approve")
    page.wait_for_url(lambda url: held["run_id"] not in url, timeout=60_000)
    released = page.url.rsplit("/", 1)[-1]
    assert page.locator("#status").inner_text() == "ok"
    assert page.locator("#stdout").inner_text().strip() == "released 42"
    assert page.locator("#source").inner_text() == held["run_id"]
    # Released once: the held run's page no longer offers it.
    page.goto(f"{console.url}/console/runs/{held['run_id']}")
    assert page.locator("#approve").count() == 0
    assert page.locator("#derived").inner_text() == f"{released} (approval, ok)"


def test_a_held_run_rejected_in_the_browser_never_runs(
    console: Console, browser_page: Any, screenshots: Path
) -> None:
    _, key = console.key()
    held = console.run(key, "print('never')\n", **HELD)
    page = browser_page
    log_in(page, console, key)
    page.goto(f"{console.url}/console/runs/{held['run_id']}")
    page.click("#reject")
    page.wait_for_url(f"**/console/runs/{held['run_id']}")
    assert "Rejected by" in page.locator("#rejected").inner_text()
    assert page.locator("#approve").count() == 0
    with console.api(key) as client:  # and the record says so to the API too
        record = client.get(f"/v1/runs/{held['run_id']}").json()
    assert record["rejected_at"] is not None


def test_filter_by_status_shows_only_that_status(console: Console, browser_page: Any) -> None:
    _, key = console.key()
    good = console.run(key, "print('fine')\n")
    bad = console.run(key, "1 / 0\n")
    page = browser_page
    log_in(page, console, key)
    assert page.locator("#rows tr.run").count() == 2
    page.select_option("select[name=status]", "error")
    page.click("#filters button[type=submit]")
    page.wait_for_url("**status=error**")
    runs = page.locator("#rows tr.run")
    assert runs.count() == 1
    assert runs.first.get_attribute("data-run") == bad["run_id"]
    assert page.locator(f'tr[data-run="{good["run_id"]}"]').count() == 0


def test_an_agent_answer_links_to_the_run_it_cites(
    console: Console,
    executor: execbox.Executor,
    browser_page: Any,
    screenshots: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    for name in ("EXECBOX_MODEL", "EXECBOX_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EXECBOX_AGENT_CONFIG", str(tmp_path / "absent.toml"))
    code = "import json\nvalues = [3, 1, 2]\nprint('sum', sum(values))\nprint(json.dumps(sum(values)))\n"
    script: dict[str, list[Reply]] = {
        "submit_plan": [plan("the sum of 3, 1 and 2", invariants=[("positive", "result > 0")])],
        "submit_generate": [program(code)],
        "submit_verify": [approve],
        "submit_answer": [answer_from_result],
    }
    answers = []

    def asking() -> None:  # the model library's event loop wants a thread without Playwright's
        try:
            with serve(script) as (_chat, url):  # the scripted model; the records: the server's
                answers.append(
                    ask("What is 3 + 1 + 2?", executor=executor, model="served-model", base_url=url)
                )
        finally:  # the loop the model library left on this thread, with its sockets
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                loop: asyncio.AbstractEventLoop | None = None
                with contextlib.suppress(RuntimeError):  # none was made
                    loop = asyncio.get_event_loop_policy().get_event_loop()
            if loop is not None and not loop.is_closed():
                loop.close()

    thread = threading.Thread(target=asking)
    thread.start()
    thread.join(timeout=300)
    (answer,) = answers
    assert answer.ok, answer.failure
    _, admin = console.admin()
    page = browser_page
    log_in(page, console, admin)
    page.goto(f"{console.url}/console/asks")
    page.click(f'a[href="/console/asks/{answer.ask_id}"]')
    page.wait_for_url(f"**/console/asks/{answer.ask_id}")
    assert answer.answer in page.locator("#answer").inner_text()
    assert page.locator("#calls tbody tr, #calls tr").count() > 1
    page.screenshot(path=str(screenshots / "ask.png"), full_page=True)
    cited = page.locator("a.cited-run").first
    run_id = cited.inner_text()
    assert run_id in answer.run_ids
    cited.click()
    page.wait_for_url(f"**/console/runs/{run_id}")
    assert "sum 6" in page.locator("#stdout").inner_text()


def test_another_tenants_key_sees_none_of_it(console: Console, browser_page: Any) -> None:
    _, alice = console.key("alice")
    _, bob = console.key("bob")
    chart = console.run(alice, CHART)
    held = console.run(alice, "print('alice held')\n", **HELD)
    page = browser_page
    log_in(page, console, bob)
    assert page.locator("#rows tr.run").count() == 0
    assert chart["run_id"] not in page.content()
    for path in (
        f"/console/runs/{chart['run_id']}",
        f"/console/runs/{chart['run_id']}/artifacts/chart.png",
        f"/console/runs/{held['run_id']}",
    ):
        assert page.goto(console.url + path).status == 404, path
    page.goto(f"{console.url}/console/sessions")
    assert page.locator("#sessions td.empty").count() == 1
    page.goto(f"{console.url}/console/asks")
    assert page.locator("#asks td.empty").count() == 1
    page.goto(f"{console.url}/console/overview")
    assert page.locator("#totals").inner_text().startswith("0 runs")
    # Bob's own token cannot release Alice's held run either.
    token = page.locator("input[name=csrf]").first.get_attribute("value")
    response = page.request.post(
        f"{console.url}/console/runs/{held['run_id']}/approve", form={"csrf": token or ""}
    )
    assert response.status == 404
    with console.api(alice) as client:
        assert client.get(f"/v1/runs/{held['run_id']}").json()["status"] == "needs_approval"


def test_overview_and_sessions_pages_render(
    console: Console, browser_page: Any, screenshots: Path
) -> None:
    _, key = console.key()
    console.run(key, "print(1)\n")
    console.run(key, "import sys\nsys.exit(3)\n")
    with console.api(key) as client:
        session = client.post("/v1/sessions", json={}).json()
        sid = session["session_id"]
        for cell in ("x = 20", "x + 22", "print('cell', x)", SESSION_CHART):
            assert client.post(f"/v1/sessions/{sid}/cells", json={"code": cell}).status_code == 200
        page = browser_page
        log_in(page, console, key)
        page.goto(f"{console.url}/console/sessions")
        assert page.locator("#sessions td.state").inner_text() == "open"
        client.delete(f"/v1/sessions/{sid}")
    page.reload()
    assert page.locator("#sessions td.state").inner_text() == "ended"
    page.goto(f"{console.url}/console/overview")
    assert page.locator("#totals").inner_text().startswith("6 runs")  # 2 runs, 4 cells
    assert page.locator("#per-minute rect").count() == 60
    statuses = page.locator("#statuses").text_content() or ""
    assert "ok" in statuses and "error" in statuses
    page.screenshot(path=str(screenshots / "overview.png"), full_page=True)
    page.goto(f"{console.url}/console/sessions")
    page.click(f'a[href="/console/sessions/{sid}"]')
    page.wait_for_url(f"**/console/sessions/{sid}")
    assert page.locator("section.cell").count() == 4
    assert "42" in page.locator("#cell-2").inner_text()
    chart = page.locator("#cell-4 img.output-image")
    page.wait_for_function("document.querySelector('#cell-4 img.output-image').complete")
    assert chart.evaluate("img => [img.naturalWidth, img.naturalHeight]") == [100, 50]
    page.screenshot(path=str(screenshots / "session.png"), full_page=True)
