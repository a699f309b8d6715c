"""The network tests' servers and executor: real HTTP and HTTPS servers on 127.0.0.1 outside
the sandbox, and an executor whose resolver map pins the test names to them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import execbox
from execbox.policy import load_profiles
from tests.conftest import _host_can_sandbox, prove_jail, sandbox_missing
from tests.network.servers import Upstream

MIRROR_ENV = "netpip"  # an environment with pip, built by the mirror tests


@pytest.fixture(scope="session")
def upstream() -> Iterator[Upstream]:
    servers = Upstream()
    yield servers
    servers.close()


@pytest.fixture(scope="session")
def net(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[execbox.Executor]:
    """An executor of its own: one slot of each kind (consecutive runs share a slot), the
    test names pinned to 127.0.0.1, a profile that lets requests ask for any destination,
    the test CA the only one its proxy trusts for the hosts it intercepts."""
    reason = _host_can_sandbox()
    if reason:
        sandbox_missing(f"SANDBOX UNAVAILABLE, network tests skipped: {reason}")
    profiles = load_profiles()
    profiles["net"] = profiles["data"].model_copy(
        update={
            "name": "net",
            "network_allow": ["*:*", "0.0.0.0/0:*", "[::/0]:*"],
            "environments": [*(profiles["data"].environments or []), MIRROR_ENV],
        }
    )
    profiles["netheld"] = profiles["net"].model_copy(
        update={"name": "netheld", "network_approval": True}
    )
    names = ("api.test", "other.test", "denied.test", "pypi.test")
    pinned = {name: "127.0.0.1" for name in names}
    ca_file = tmp_path_factory.mktemp("net-ca") / "ca.pem"
    ca_file.write_bytes(upstream.ca_pem)
    with execbox.Executor(
        cache=False,
        pool_size=1,
        rotate_after_runs=None,
        rotate_after_s=None,
        profiles=profiles,
        network_resolve=pinned,
        network_ca=str(ca_file),
    ) as ex:
        problem = prove_jail(ex)
        if problem:
            sandbox_missing(f"JAIL NOT PROVEN, network tests skipped: {problem}")
        yield ex
