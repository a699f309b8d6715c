"""API keys, tenancy and quotas over a real server. What they protect is the server's, so the
sandbox under it is the fake one (no root, no image)."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator

import httpx
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from execbox.cli import main
from tests.server.conftest import Api


@pytest.fixture(scope="module")
def api(fake_api: Api) -> Iterator[Api]:
    yield fake_api  # alice, bob and every test here use it


def _code(response: httpx.Response) -> str:
    code: str = response.json()["error"]["code"]
    return code


def test_missing_wrong_and_revoked_keys_are_401(api: Api) -> None:
    with api.http(None) as anon:
        missing = anon.post("/v1/runs", json={"code": "print(1)"})
        assert missing.status_code == 401 and _code(missing) == "missing_api_key"
        assert missing.headers["www-authenticate"] == "Bearer"
    with api.http("ebx_not-a-real-key") as wrong:
        response = wrong.post("/v1/runs", json={"code": "print(1)"})
        assert response.status_code == 401 and _code(response) == "invalid_api_key"
    name, key = api.key("revokee")
    with api.http(key) as client:
        assert client.post("/v1/runs", json={"code": "print(1)"}).status_code == 200
        api.keys.revoke(name)
        revoked = client.post("/v1/runs", json={"code": "print(1)"})
        assert revoked.status_code == 401 and _code(revoked) == "revoked_api_key"
        assert client.get("/v1/runs/" + "0" * 32).status_code == 401


def test_keys_are_stored_only_as_hashes(api: Api) -> None:
    _, key = api.key("hashed")
    with api.keys.engine.connect() as conn:
        stored = [tuple(row) for row in conn.execute(sa.text("SELECT * FROM api_keys"))]
    flat = " ".join(str(v) for row in stored for v in row)
    assert key not in flat
    assert hashlib.sha256(key.encode()).hexdigest() in flat


def test_a_tenant_sees_only_its_own_runs_and_artifacts(
    alice: httpx.Client, bob: httpx.Client
) -> None:
    run = alice.post("/v1/runs", json={"code": "open('secret.txt','w').write('alice only')"})
    run_id = run.json()["run_id"]
    assert alice.get(f"/v1/runs/{run_id}").status_code == 200
    assert alice.get(f"/v1/runs/{run_id}/artifacts/secret.txt").content == b"alice only"
    theirs = bob.get(f"/v1/runs/{run_id}")
    assert theirs.status_code == 404 and _code(theirs) == "run_not_found"
    art = bob.get(f"/v1/runs/{run_id}/artifacts/secret.txt")
    assert art.status_code == 404 and b"alice only" not in art.content


def test_runs_per_minute_quota_is_a_429_with_retry_after(api: Api) -> None:
    _, key = api.key("rpm", rpm=2)
    with api.http(key) as client:
        for _ in range(2):
            assert client.post("/v1/runs", json={"code": "print(1)"}).status_code == 200
        refused = client.post("/v1/runs", json={"code": "print(1)"})
        assert refused.status_code == 429 and _code(refused) == "rate_limited"
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        streamed = client.post("/v1/runs/stream", json={"code": "print(1)"})
        assert streamed.status_code == 429
    _, other = api.key("rpm-other", rpm=2)
    with api.http(other) as client:  # quotas are per key
        assert client.post("/v1/runs", json={"code": "print(1)"}).status_code == 200


def test_concurrent_runs_quota_is_a_429_while_a_run_is_in_flight(api: Api) -> None:
    _, key = api.key("conc", concurrent=1)
    started = threading.Event()
    results: list[httpx.Response] = []

    def slow() -> None:
        with (
            api.http(key) as client,
            client.stream(
                "POST",
                "/v1/runs/stream",
                json={"code": "import time\nprint('go', flush=True)\ntime.sleep(2)"},
            ) as resp,
        ):
            for line in resp.iter_lines():
                if line.startswith("event: stdout"):
                    started.set()
            results.append(resp)

    thread = threading.Thread(target=slow)
    thread.start()
    try:
        assert started.wait(30)
        with api.http(key) as client:
            refused = client.post("/v1/runs", json={"code": "print(1)"})
            assert refused.status_code == 429 and _code(refused) == "concurrency_limited"
            assert refused.headers["retry-after"] == "1"
    finally:
        thread.join()
    with api.http(key) as client:  # the slot is free again once the run ended
        assert client.post("/v1/runs", json={"code": "print(1)"}).status_code == 200


def test_keys_cli_creates_lists_and_revokes(api: Api) -> None:
    runner = CliRunner()
    db = os.environ["EXECBOX_DB_URL"]
    created = runner.invoke(main, ["keys", "create", "cli-tenant", "--rpm", "5", "--db", db])
    assert created.exit_code == 0, created.output
    key = created.output.strip()
    assert key.startswith("ebx_") and len(key) > 40
    listed = runner.invoke(main, ["keys", "list", "--db", db])
    assert "cli-tenant\tactive" in listed.output and "rpm 5" in listed.output
    assert key not in listed.output
    again = runner.invoke(main, ["keys", "create", "cli-tenant", "--db", db])
    assert again.exit_code == 2 and "already exists" in again.output
    with api.http(key) as client:
        assert client.post("/v1/runs", json={"code": "print(1)"}).status_code == 200
        revoked = runner.invoke(main, ["keys", "revoke", "cli-tenant", "--db", db])
        assert revoked.exit_code == 0
        assert client.post("/v1/runs", json={"code": "print(1)"}).status_code == 401
    assert "cli-tenant\trevoked" in runner.invoke(main, ["keys", "list", "--db", db]).output


@pytest.mark.parametrize("name", ["", "x" * 101, "tab\there"])
def test_bad_key_names_are_refused(api: Api, name: str) -> None:
    result = CliRunner().invoke(
        main, ["keys", "create", name, "--db", os.environ["EXECBOX_DB_URL"]]
    )
    assert result.exit_code == 2


def test_one_tenants_cached_result_never_answers_another_tenant(
    alice: httpx.Client, bob: httpx.Client
) -> None:
    code = f"print('cache probe {os.urandom(8).hex()}')"
    first = alice.post("/v1/runs", json={"code": code, "cache": True}).json()
    again = alice.post("/v1/runs", json={"code": code, "cache": True}).json()
    assert not first["cached"] and again["cached"], "control: the cache answers its own tenant"
    theirs = bob.post("/v1/runs", json={"code": code, "cache": True}).json()
    assert theirs["status"] == "ok" and not theirs["cached"]
