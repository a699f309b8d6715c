"""Sessions over HTTP: cells keep state, files round-trip, closing ends it, tenants are apart.
What a cell or a file does is tested over the real sandbox; the server's refusals, over the fake."""

from __future__ import annotations

import base64
import json

import httpx

from execbox.server.auth import ADMIN
from tests.probes import WORKSPACE_SWAPPER
from tests.server.conftest import Api


def _open(client: httpx.Client, **body: object) -> str:
    response = client.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    session_id: str = response.json()["session_id"]
    return session_id


def test_cells_share_state_and_return_outputs(alice: httpx.Client) -> None:
    sid = _open(alice, files=[{"name": "in.txt", "data": base64.b64encode(b"41").decode()}])
    try:
        first = alice.post(
            f"/v1/sessions/{sid}/cells", json={"code": "x = int(open('in.txt').read())"}
        )
        assert first.status_code == 200 and first.json()["status"] == "ok", first.text
        second = alice.post(f"/v1/sessions/{sid}/cells", json={"code": "x + 1"}).json()
        assert second["session_id"] == sid
        assert second["outputs"][-1] == {"mime_type": "text/plain", "data": "42"}
        record = alice.get(f"/v1/runs/{second['run_id']}")  # cells are the tenant's runs too
        assert record.status_code == 200 and record.json()["session_id"] == sid
    finally:
        alice.delete(f"/v1/sessions/{sid}")


def test_files_upload_list_download_delete(alice: httpx.Client) -> None:
    sid = _open(alice)
    try:
        put = alice.put(
            f"/v1/sessions/{sid}/files/data/blob.bin",
            content=b"\x00\x01binary",
            headers={"Content-Type": "application/octet-stream"},
        )
        assert put.status_code == 200, put.text
        assert put.json()["path"] == "data/blob.bin" and put.json()["size"] == 8
        cell = alice.post(
            f"/v1/sessions/{sid}/cells",
            json={
                "code": "open('made.txt', 'w').write(str(len(open('data/blob.bin','rb').read())))"
            },
        )
        assert cell.json()["status"] == "ok"
        assert [a["path"] for a in cell.json()["artifacts"]] == ["made.txt"]
        listed = {a["path"] for a in alice.get(f"/v1/sessions/{sid}/files").json()}
        assert {"data/blob.bin", "made.txt"} <= listed
        assert alice.get(f"/v1/sessions/{sid}/files/made.txt").content == b"8"
        assert alice.delete(f"/v1/sessions/{sid}/files/made.txt").status_code == 204
        assert "made.txt" not in {a["path"] for a in alice.get(f"/v1/sessions/{sid}/files").json()}
        bad = alice.put(f"/v1/sessions/{sid}/files/../escape", content=b"x")
        assert bad.status_code in (400, 404) and "error" in bad.json()
    finally:
        alice.delete(f"/v1/sessions/{sid}")


def test_files_racing_code_that_swaps_the_path_answer_400_and_the_session_goes_on(
    alice: httpx.Client,
) -> None:
    sid = _open(alice, limits={"cpu_s": 60})  # the threads spin between cells
    try:
        cell = alice.post(f"/v1/sessions/{sid}/cells", json={"code": WORKSPACE_SWAPPER})
        assert cell.json()["status"] == "ok", cell.text
        files = f"/v1/sessions/{sid}/files"
        calls = [
            ("PUT", "/p"),
            ("PUT", "/p/x"),
            ("GET", "/p"),
            ("GET", "/p/x"),
            ("GET", ""),
            ("DELETE", "/p"),
            ("DELETE", "/p/x"),
        ]
        codes: dict[int, int] = {}
        for _ in range(40):
            for method, path in calls:
                response = alice.request(method, files + path, content=b"d" * (method == "PUT"))
                codes[response.status_code] = codes.get(response.status_code, 0) + 1
                if response.status_code >= 400:
                    error = response.json()["error"]
                    assert (response.status_code, error["code"]) == (400, "bad_request"), error
        assert codes.get(400) and set(codes) <= {200, 204, 400}, codes
        assert alice.get(f"/v1/sessions/{sid}").json()["closed"] is False
        after = alice.post(f"/v1/sessions/{sid}/cells", json={"code": "print('alive')"})
        assert after.json()["stdout"] == "alive\n", after.text
    finally:
        alice.delete(f"/v1/sessions/{sid}")


def test_closed_session_answers_session_closed(fake_alice: httpx.Client) -> None:
    sid = _open(fake_alice)
    closed = fake_alice.delete(f"/v1/sessions/{sid}")
    assert closed.status_code == 200 and closed.json()["closed"] is True
    info = fake_alice.get(f"/v1/sessions/{sid}").json()
    assert info["closed"] is True and info["end_reason"]
    late = fake_alice.post(f"/v1/sessions/{sid}/cells", json={"code": "1"})
    assert late.status_code == 409 and late.json()["error"]["code"] == "session_closed"
    assert fake_alice.get(f"/v1/sessions/{sid}/files").status_code == 409


def test_an_ended_session_pruned_from_the_open_ones_still_answers_its_info(
    fake_alice: httpx.Client,
) -> None:
    sid = _open(fake_alice)
    assert fake_alice.delete(f"/v1/sessions/{sid}").status_code == 200
    other = _open(fake_alice)  # opening a session prunes the ended ones
    info = fake_alice.get(f"/v1/sessions/{sid}")
    assert info.status_code == 200, info.text
    assert info.json()["closed"] is True and info.json()["network_log_after_cells"] == []
    fake_alice.delete(f"/v1/sessions/{other}")


def test_stream_cell_sends_output_then_result(alice: httpx.Client) -> None:
    sid = _open(alice)
    try:
        with alice.stream(
            "POST",
            f"/v1/sessions/{sid}/cells/stream",
            json={"code": "print('a'); print('b')\n7 * 6"},
        ) as response:
            lines = [line for line in response.iter_lines() if line]
        names = [line.split(": ", 1)[1] for line in lines if line.startswith("event: ")]
        assert names[0] == "stdout" and names[-1] == "result"
        result = json.loads(lines[-1].split(": ", 1)[1])
        assert result["stdout"] == "a\nb\n" and result["outputs"][-1]["data"] == "42"
    finally:
        alice.delete(f"/v1/sessions/{sid}")


def test_a_tenant_cannot_reach_another_tenants_session(
    fake_alice: httpx.Client, fake_bob: httpx.Client
) -> None:
    sid = _open(fake_alice)
    try:
        fake_alice.put(f"/v1/sessions/{sid}/files/private.txt", content=b"fake_alice's")
        for response in (
            fake_bob.get(f"/v1/sessions/{sid}"),
            fake_bob.post(f"/v1/sessions/{sid}/cells", json={"code": "1"}),
            fake_bob.get(f"/v1/sessions/{sid}/files"),
            fake_bob.get(f"/v1/sessions/{sid}/files/private.txt"),
            fake_bob.delete(f"/v1/sessions/{sid}/files/private.txt"),
            fake_bob.delete(f"/v1/sessions/{sid}"),
        ):
            assert response.status_code == 404, response.text
            assert response.json()["error"]["code"] == "session_not_found"
        assert fake_alice.get(f"/v1/sessions/{sid}/files/private.txt").content == b"fake_alice's"
    finally:
        fake_alice.delete(f"/v1/sessions/{sid}")


def test_session_quota_is_a_429_and_frees_on_close(fake_api: Api) -> None:
    _, key = fake_api.key("sess", sessions=1)
    with fake_api.http(key) as client:
        sid = _open(client)
        refused = client.post("/v1/sessions", json={})
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "session_quota"
        assert "retry-after" in refused.headers
        client.delete(f"/v1/sessions/{sid}")
        again = _open(client)
        client.delete(f"/v1/sessions/{again}")


def test_active_sessions_gauge_follows_open_and_close(
    fake_api: Api, fake_alice: httpx.Client
) -> None:
    ops = fake_api.http(fake_api.key("ops", role=ADMIN)[1])

    def active() -> float:
        for line in ops.get("/metrics").text.splitlines():
            if line.startswith("execbox_active_sessions "):
                return float(line.split()[1])
        raise AssertionError("no execbox_active_sessions metric")

    before = active()
    sid = _open(fake_alice)
    assert active() == before + 1
    fake_alice.delete(f"/v1/sessions/{sid}")
    assert active() == before
    ops.close()
