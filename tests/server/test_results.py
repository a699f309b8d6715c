"""Result bytes over a real server: artifacts go to a private spool on disk and stream back
byte-exact, the spool is emptied after download or expiry, and a server-wide budget answers 503
with Retry-After instead of growing."""

from __future__ import annotations

import hashlib
import stat
import threading
import time
from pathlib import Path

import httpx

from tests.server.conftest import Api, own_server

MIB = 1 << 20
# Writes files of the given sizes (random bytes) and prints each one's sha256.
WRITER = """
import hashlib, os
for name, size in {files!r}:
    data = os.urandom(size)
    with open(name, "wb") as fh:
        fh.write(data)
    print(name, hashlib.sha256(data).hexdigest())
"""


def _run(client: httpx.Client, files: list[tuple[str, int]], **limits: int) -> httpx.Response:
    return client.post(
        "/v1/runs",
        json={
            "code": WRITER.format(files=files),
            "profile": "extended",
            "limits": {"artifact_bytes": 64 * MIB, "timeout_s": 60, **limits},
        },
        timeout=120,
    )


def _spooled(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_large_artifacts_stream_back_byte_exact_and_leave_no_spool_file(
    api: Api, tmp_path: Path
) -> None:
    with own_server(api.executor, spool_dir=str(tmp_path)) as (url, state):
        _, key = api.key("spooler")
        files = [("big1.bin", 12 * MIB), ("big2.bin", 11 * MIB), ("small.txt", 4096)]
        with (
            httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120
            ) as client,
            api.http(api.key("other")[1]) as other,
        ):
            other.base_url = httpx.URL(url)
            response = _run(client, files)
            assert response.status_code == 200, response.text
            assert len(response.content) < MIB  # no artifact bytes in the JSON result
            result = response.json()
            printed = dict(line.split() for line in result["stdout"].splitlines())
            listed = {a["path"]: a for a in result["artifacts"]}
            run_id = result["run_id"]
            # Over the records' cap: spooled, private to the server's user, held in the budget.
            spooled = _spooled(tmp_path)
            assert len(spooled) == 2
            for path in spooled:
                assert stat.S_IMODE(path.stat().st_mode) == 0o600
                assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
            assert stat.S_IMODE(state.spool.root.stat().st_mode) == 0o700
            assert state.results.used == 23 * MIB
            # Another tenant gets nothing of them.
            for name in printed:
                assert other.get(f"/v1/runs/{run_id}/artifacts/{name}").status_code == 404
            for name, size in files:
                digest = hashlib.sha256()
                with client.stream("GET", f"/v1/runs/{run_id}/artifacts/{name}") as download:
                    assert download.status_code == 200
                    assert int(download.headers["content-length"]) == size
                    for chunk in download.iter_bytes():
                        digest.update(chunk)
                assert digest.hexdigest() == printed[name] == listed[name]["sha256"]
            assert _spooled(tmp_path) == [] and state.results.used == 0
            # A spooled artifact is served once; the one the records kept, always.
            again = client.get(f"/v1/runs/{run_id}/artifacts/big1.bin")
            assert again.status_code == 404 and "once" in again.json()["error"]["message"]
            assert client.get(f"/v1/runs/{run_id}/artifacts/small.txt").status_code == 200
    assert list(tmp_path.iterdir()) == []  # the spool itself is gone with the server


def test_spooled_artifacts_not_downloaded_expire(api: Api, tmp_path: Path) -> None:
    with (
        own_server(api.executor, spool_dir=str(tmp_path), artifact_ttl_s=1.0) as (url, state),
        httpx.Client(
            base_url=url, timeout=120, headers={"Authorization": f"Bearer {api.key('late')[1]}"}
        ) as client,
    ):
        response = _run(client, [("big.bin", 11 * MIB)])
        assert response.status_code == 200, response.text
        assert len(_spooled(tmp_path)) == 1 and state.results.used == 11 * MIB
        # The budget is released just after the file goes: wait for both.
        deadline = time.monotonic() + 10
        while (_spooled(tmp_path) or state.results.used) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _spooled(tmp_path) == [] and state.results.used == 0
        run_id = response.json()["run_id"]
        assert client.get(f"/v1/runs/{run_id}/artifacts/big.bin").status_code == 404


def test_result_budget_answers_503_with_retry_after_instead_of_growing(
    api: Api, tmp_path: Path
) -> None:
    with (
        own_server(
            api.executor,
            spool_dir=str(tmp_path),
            max_result_bytes=48 * MIB,
            tenant_result_bytes=48 * MIB,
        ) as (url, state),
        httpx.Client(
            base_url=url, timeout=120, headers={"Authorization": f"Bearer {api.key('budget')[1]}"}
        ) as client,
    ):
        # A request that could never fit is a 400 that says which setting bounds it.
        huge = _run(client, [], artifact_bytes=64 * MIB)
        assert huge.status_code == 400 and huge.json()["error"]["code"] == "over_result_budget"
        assert "--max-result-mib" in huge.json()["error"]["message"]
        # 30 MiB of artifacts wait for their download: 10 MiB of room is left.
        held = _run(client, [("held.bin", 30 * MIB)], artifact_bytes=32 * MIB)
        assert held.status_code == 200, held.text
        assert state.results.used == 30 * MIB
        refused = client.post("/v1/runs", json={"code": "print(1)"})  # may cost 22 MiB
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "result_budget"
        assert int(refused.headers["retry-after"]) >= 1
        streamed = client.post("/v1/runs/stream", json={"code": "print(1)"})
        assert streamed.status_code == 503
        assert state.results.used == 30 * MIB  # refusals hold nothing
        run_id = held.json()["run_id"]
        assert len(client.get(f"/v1/runs/{run_id}/artifacts/held.bin").content) == 30 * MIB
        assert state.results.used == 0
        # A run in flight holds what its result may cost: 44 MiB until it ends (two outputs
        # of 1 MiB, six copies each, and 32 MiB of artifacts).
        slow: dict[str, httpx.Response] = {}
        thread = threading.Thread(
            target=lambda: slow.update(
                r=client.post(
                    "/v1/runs",
                    json={
                        "code": "import time; time.sleep(3)",
                        "profile": "extended",
                        "limits": {"artifact_bytes": 32 * MIB},
                    },
                )
            )
        )
        thread.start()
        deadline = time.monotonic() + 10
        while state.results.used == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert state.results.used == 44 * MIB
        assert client.post("/v1/runs", json={"code": "print(1)"}).status_code == 503
        thread.join()
        assert slow["r"].status_code == 200 and state.results.used == 0
        assert client.post("/v1/runs", json={"code": "print(1)"}).status_code == 200


def test_session_file_downloads_hold_the_result_budget_until_sent(api: Api) -> None:
    """A download is held in memory until the client has it: while one is unread, the next
    that could not fit beside it is a 503, not another copy (an attack grew the server by
    200 MiB per unread download)."""
    with (
        own_server(api.executor, max_result_bytes=48 * MIB, tenant_result_bytes=48 * MIB) as (
            url,
            state,
        ),
        httpx.Client(
            base_url=url, timeout=120, headers={"Authorization": f"Bearer {api.key('files')[1]}"}
        ) as client,
    ):
        made = client.post("/v1/sessions", json={"limits": {"disk_mib": 40}})
        assert made.status_code == 201, made.text
        sid = made.json()["session_id"]
        try:
            cell = client.post(
                f"/v1/sessions/{sid}/cells",
                json={"code": "open('big.bin', 'wb').write(bytes(30 << 20))"},
            )
            assert cell.status_code == 200 and cell.json()["status"] == "ok", cell.text
            with client.stream("GET", f"/v1/sessions/{sid}/files/big.bin") as unread:
                assert unread.status_code == 200
                assert state.results.used == 30 * MIB  # the file's size, until it is sent
                second = client.get(f"/v1/sessions/{sid}/files/big.bin")
                assert second.status_code == 503, second.status_code
                assert second.json()["error"]["code"] == "result_budget"
                assert int(second.headers["retry-after"]) >= 1
                assert len(unread.read()) == 30 * MIB
            deadline = time.monotonic() + 5
            while state.results.used and time.monotonic() < deadline:
                time.sleep(0.02)
            assert state.results.used == 0
            again = client.get(f"/v1/sessions/{sid}/files/big.bin")
            assert again.status_code == 200 and len(again.content) == 30 * MIB
        finally:
            client.delete(f"/v1/sessions/{sid}")
