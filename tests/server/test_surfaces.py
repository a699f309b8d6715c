"""The surfaces beside the API: /metrics (every tenant's counts) needs an admin key, an admin
key runs nothing, and the API's documents are served only when asked for."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from execbox.cli import main
from execbox.server import Settings, create_app
from execbox.server.auth import ADMIN, TENANT, KeyStore
from execbox.server.background import serving
from tests.server.conftest import Api

DOCUMENTS = ("/docs", "/redoc", "/openapi.json")


@pytest.fixture(scope="module")
def api(fake_api: Api) -> Iterator[Api]:
    yield fake_api  # the claims here are the server's: the fake sandbox runs the code


def _code(response: httpx.Response) -> str:
    code: str = response.json()["error"]["code"]
    return code


def test_metrics_refuse_no_key_a_bad_key_and_a_tenants_key(api: Api) -> None:
    with api.http(None) as anon:
        missing = anon.get("/metrics")
    assert missing.status_code == 401 and _code(missing) == "missing_api_key"
    assert missing.headers["www-authenticate"] == "Bearer"
    with api.http("ebx_not-a-real-key") as wrong:
        assert _code(wrong.get("/metrics")) == "invalid_api_key"
    with api.http(api.key("tenant")[1]) as tenant:
        refused = tenant.get("/metrics")
    assert refused.status_code == 403 and _code(refused) == "admin_key_required"
    assert "execbox_runs" not in refused.text
    name, admin = api.key("ops", role=ADMIN)
    with api.http(admin) as ops:
        served = ops.get("/metrics")
        assert served.status_code == 200 and "execbox_runs" in served.text
        api.keys.revoke(name)
        assert _code(ops.get("/metrics")) == "revoked_api_key"


def test_an_admin_key_runs_no_code_and_opens_no_session(api: Api) -> None:
    with api.http(api.key("ops", role=ADMIN)[1]) as ops:
        for response in (
            ops.post("/v1/runs", json={"code": "print(1)"}),
            ops.post("/v1/sessions", json={}),
            ops.get("/v1/runs/" + "0" * 32),
        ):
            assert response.status_code == 403 and _code(response) == "admin_key", response.text


@pytest.mark.parametrize("path", DOCUMENTS)
def test_documents_are_not_served_by_default_with_or_without_a_key(api: Api, path: str) -> None:
    with api.http(None) as anon, api.http(api.key("tenant")[1]) as tenant:
        for client in (anon, tenant):
            response = client.get(path)
            assert response.status_code == 404 and _code(response) == "not_found"


def test_documents_are_served_when_the_server_is_asked_to(api: Api) -> None:
    with (
        serving(create_app(api.executor, Settings(docs=True))) as url,
        httpx.Client(base_url=url) as anon,
    ):
        for path in DOCUMENTS:
            assert anon.get(path).status_code == 200, path
        assert anon.get("/metrics").status_code == 401  # metrics stay behind the admin key


def test_keys_cli_makes_admin_keys_and_lists_them_as_such(api: Api) -> None:
    runner = CliRunner()
    db = os.environ["EXECBOX_DB_URL"]
    created = runner.invoke(main, ["keys", "create", "cli-admin", "--admin", "--db", db])
    assert created.exit_code == 0, created.output
    with api.http(created.output.strip()) as ops:
        assert ops.get("/metrics").status_code == 200
        assert ops.post("/v1/runs", json={"code": "print(1)"}).status_code == 403
    assert "cli-admin\tactive" in runner.invoke(main, ["keys", "list", "--db", db]).output


def test_keys_made_before_roles_stay_tenant_keys(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path}/old.db")
    key = "ebx_" + "k" * 43
    with engine.begin() as conn:  # the key table as it was before keys had roles
        conn.execute(
            sa.text(
                "CREATE TABLE api_keys (name VARCHAR(100) PRIMARY KEY, key_sha256 VARCHAR(64) "
                "NOT NULL UNIQUE, created_at FLOAT NOT NULL, revoked_at FLOAT, max_concurrent "
                "INTEGER NOT NULL, max_sessions INTEGER NOT NULL, rpm INTEGER NOT NULL)"
            )
        )
        conn.execute(
            sa.text("INSERT INTO api_keys VALUES ('old', :digest, 0, NULL, 1, 1, 1)"),
            {"digest": hashlib.sha256(key.encode()).hexdigest()},
        )
    tenant = KeyStore(engine).authenticate(key)
    assert tenant is not None and (tenant.name, tenant.role) == ("old", TENANT)
    assert KeyStore(engine).authenticate(key) == tenant  # a second open changes nothing
