"""`execbox serve --zygotes-per-tenant`: each key's tenant runs on zygotes of its own, so no
memory layout (libc and heap addresses, hash secret) is shared across tenants."""

from __future__ import annotations

import tempfile

import pytest

import execbox
from execbox.server import Settings, create_app
from execbox.server.background import serving
from tests.server.conftest import Api

LAYOUT = (
    "import sys\n"
    "libc = next(l.split('-')[0] for l in open('/proc/self/maps') if 'libc.so' in l)\n"
    "print(libc, id(sys), hash('execbox'))"
)


@pytest.mark.slow
def test_each_tenant_runs_on_zygotes_of_its_own_through_http() -> None:
    with (
        tempfile.TemporaryDirectory() as tmp,
        execbox.Executor(
            cache=False,
            pool_size=1,
            zygotes_per_tenant=True,
            rotate_after_s=None,
            records=f"sqlite:///{tmp}/runs.db",
        ) as ex,
    ):
        app = create_app(ex, Settings())
        with serving(app) as url:
            api = Api(url, app.state.execbox.keys, ex)
            layouts = {}
            for who in ("alice", "bob"):
                with api.http(api.key(who)[1]) as client:
                    seen = []
                    for _ in range(2):
                        r = client.post("/v1/runs", json={"code": LAYOUT})
                        assert r.status_code == 200 and r.json()["status"] == "ok", r.text
                        seen.append(r.json()["stdout"])
                    assert seen[0] == seen[1], "control: one tenant's runs share a layout"
                    layouts[who] = seen[0]
            assert layouts["alice"] != layouts["bob"], layouts
            assert ex._hosts.current(None) is None, "the shared host was started"
