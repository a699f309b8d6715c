"""A real local Ray cluster for the cluster tests: a head and two worker nodes on this machine
(`ray.cluster_utils.Cluster`, the helper Ray's own tests use), each with a custom resource of
its own, no dashboard, health checks tuned to about a second and a half, and the throwaway
PostgreSQL server of the record tests as the shared store.

They run only under `make test-cluster`, inside a network namespace of their own with only `lo`
up: otherwise Ray finds its address by dialling public resolvers (8.8.8.8:53) and advertises
the machine's routable address; there it falls back to 127.0.0.1 and nothing leaves the
machine. Outside such a namespace the fixture fails and says so. Teardown proves that nothing
is left: no process of this namespace but pytest and its parents.
"""

from __future__ import annotations

import gc
import os
import socket
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import sandbox_missing

# The PostgreSQL server of the record tests, for this package's modules.
from tests.test_records_postgres import pg_server as pg_server  # noqa: F401

ray = pytest.importorskip("ray", reason="the cluster tests need Ray: pip install -e '.[cluster]'")
from ray.cluster_utils import Cluster  # noqa: E402

# A node missing three health checks half a second apart is dead: about 1.5 s, not a minute.
SYSTEM_CONFIG = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
}


def _netns(pid: int | str) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def _ours() -> list[int]:
    """Processes of this network namespace but this one and its ancestors."""
    me = _netns("self")
    keep = {os.getpid()}
    pid = os.getppid()
    while pid > 1:
        keep.add(pid)
        with open(f"/proc/{pid}/stat") as fh:
            pid = int(fh.read().rsplit(")", 1)[1].split()[1])
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in keep:
            continue
        try:
            if _netns(entry) == me:
                found.append(int(entry))
        except OSError:  # gone, or a kernel thread
            continue
    return found


def _describe(pids: list[int]) -> str:
    lines = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        lines.append(f"{pid}: {cmd[:120]}")
    return "\n".join(lines)


class MakesADirectory:
    """Unpickled, it creates a directory: proof that a peer's bytes were unpickled."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.mkdir, (str(self.path),))


@dataclass
class RayCluster:
    """The running cluster: its address, its Ray Client address (`ray://`), and its worker
    nodes (head first)."""

    cluster: Any
    address: str
    client_address: str
    nodes: list[Any] = field(default_factory=list)
    count: int = 0

    def add(self) -> Any:
        """A new worker node, with a resource of its own; its Ray node id is `.node_id`."""
        self.count += 1
        node = self.cluster.add_node(num_cpus=1, resources={f"execbox_node_{self.count}": 1})
        self.nodes.append(node)
        return node

    def kill(self, node: Any) -> None:
        """The node gone at once, as a machine that dies (no graceful shutdown)."""
        self.cluster.remove_node(node, allow_graceful=False)
        self.nodes.remove(node)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    if os.geteuid() != 0:
        sandbox_missing("the cluster tests need root (each node runs the sandbox)")
    interfaces = sorted(name for _, name in socket.if_nameindex())  # this namespace's
    if interfaces != ["lo"]:
        pytest.fail(
            f"the cluster tests run in a network namespace with only lo (found {interfaces}): "
            "run them with `make test-cluster`",
            pytrace=False,
        )
    before = _ours()
    t0 = time.monotonic()
    with socket.socket() as probe:  # a free port for the head's Ray Client server
        probe.bind(("127.0.0.1", 0))
        client_port = probe.getsockname()[1]
    with warnings.catch_warnings():
        # Ray's start of its Client server drops the handles of that server's log files open.
        warnings.simplefilter("ignore", ResourceWarning)
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "include_dashboard": False,
                "resources": {"execbox_node_0": 1},
                "ray_client_server_port": client_port,
                "_system_config": SYSTEM_CONFIG,
            },
        )
        gc.collect()
    made = RayCluster(
        cluster, cluster.address, f"ray://127.0.0.1:{client_port}", [cluster.head_node]
    )
    try:
        made.add()
        made.add()
        cluster.wait_for_nodes()
        print(f"\nRay cluster of 3 nodes up in {time.monotonic() - t0:.1f} s at {cluster.address}")
        yield made
    finally:
        cluster.shutdown()
    deadline = time.monotonic() + 30
    while (left := [p for p in _ours() if p not in before]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"left running after the cluster stopped:\n{_describe(left)}"
