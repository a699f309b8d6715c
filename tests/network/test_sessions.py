"""A session with a network policy: the listener lives as long as the session, each cell's
result logs only what that cell asked for, the limits count across cells. Real sandbox, real
HTTP server on loopback, names pinned to it."""

from __future__ import annotations

import httpx

import execbox
from tests.network.servers import Upstream
from tests.server.conftest import own_server

FETCH = """
import urllib.request, urllib.error
def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError as e:
        return repr(e)
"""


def test_each_cell_logs_what_it_asked_for(net: execbox.Executor, upstream: Upstream) -> None:
    port = upstream.http_port
    upstream.clear()
    with net.session(profile="net", network=[f"api.test:{port}"]) as session:
        first = session.run(FETCH + f"print(fetch('http://api.test:{port}/hello'))")
        second = session.run(f"print(fetch('http://other.test:{port}/hello'))")
        third = session.run("print(1)")
    assert (first.stdout, second.stdout, third.stdout) == ("200\n", "403\n", "1\n")
    assert [(e.host, e.verdict) for e in first.network_log] == [("api.test", "allowed")]
    assert [(e.host, e.verdict, e.rule) for e in second.network_log] == [
        ("other.test", "denied", "network.host")
    ]
    assert third.network_log == []
    assert upstream.seen() == [("GET", "/hello", f"api.test:{port}")]
    record = net.store.get(first.run_id)
    assert record is not None and record.network == [f"api.test:{port}"]


def test_session_without_network_has_none(net: execbox.Executor, upstream: Upstream) -> None:
    port = upstream.http_port
    with net.session(profile="net") as session:
        cell = session.run(
            FETCH + "import os\n"
            f"print(os.environ.get('HTTP_PROXY'), fetch('http://127.0.0.1:{port}/hello'))"
        )
    assert cell.stdout.startswith("None ") and "Connection refused" in cell.stdout
    assert cell.network_log == []


def test_network_limit_counts_across_cells_and_ends_the_session(
    net: execbox.Executor, upstream: Upstream
) -> None:
    port = upstream.http_port
    limits = {"network_connections": 2}
    with net.session(profile="net", network=[f"api.test:{port}"], limits=limits) as session:
        url = f"http://api.test:{port}/hello"
        first = session.run(FETCH + f"print(fetch({url!r}), fetch({url!r}))")
        second = session.run(f"print(fetch({url!r}))")
        assert session.closed
    assert first.stdout == "200 200\n"
    assert second.status == "network_limit", second
    assert second.error is not None and "network_connections" in second.error.message
    assert second.error.type == "NetworkLimitExceeded"


def test_http_session_body_takes_a_network(net: execbox.Executor, upstream: Upstream) -> None:
    port = upstream.http_port
    with own_server(net) as (url, state):
        assert state.keys is not None
        key = state.keys.create("net-sessions", max_concurrent=4, max_sessions=1, rpm=1000)
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as client:
            body = {"profile": "net", "network": [f"api.test:{port}"]}
            created = client.post("/v1/sessions", json=body, timeout=60).json()
            sid = created["session_id"]
            code = FETCH + f"print(fetch('http://api.test:{port}/hello'))"
            cell = client.post(f"/v1/sessions/{sid}/cells", json={"code": code}, timeout=60)
            client.delete(f"/v1/sessions/{sid}", timeout=60)
    assert cell.json()["stdout"] == "200\n", cell.json()
    assert [e["verdict"] for e in cell.json()["network_log"]] == ["allowed"]


def test_a_background_process_is_logged_between_cells_and_after_the_last(
    net: execbox.Executor, upstream: Upstream
) -> None:
    """A process a cell leaves running asks for hosts while no cell runs (here during file
    calls): the next cell's log holds it, and what came after the last cell is the session's
    `network_log_after_cells` once it is closed."""
    port = upstream.http_port
    upstream.clear()
    background = f"""
import os, time, urllib.request
for n in (1, 2):
    while not os.path.exists(f"/workspace/go{{n}}"):
        time.sleep(0.05)
    urllib.request.urlopen(f"http://api.test:{port}/hello?n={{n}}", timeout=10).read()
"""
    start = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', {background!r}], start_new_session=True)\n"
    )
    session = net.session(profile="net", network=[f"api.test:{port}"])
    try:
        first = session.run(start)
        session.files.write("go1", "")
        _wait_for(upstream, 1)
        second = session.run("print(1)")
        session.files.write("go2", "")
        _wait_for(upstream, 2)
    finally:
        session.close()
    assert first.network_log == []
    assert [(e.method, e.host, e.verdict) for e in second.network_log] == [
        ("GET", "api.test", "allowed")
    ]
    assert [(e.method, e.host, e.verdict) for e in session.network_log_after_cells] == [
        ("GET", "api.test", "allowed")
    ]


def _wait_for(upstream: Upstream, requests: int) -> None:
    import time

    deadline = time.monotonic() + 20
    while len(upstream.seen()) < requests:
        assert time.monotonic() < deadline, upstream.seen()
        time.sleep(0.05)
