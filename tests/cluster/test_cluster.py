"""execbox on a real three-node Ray cluster (see conftest): runs spread over the nodes and say
which ran them, sessions stay on their node, a batch gives the local verdicts, records land in
the shared PostgreSQL store, the jail holds as on one box, and a node that dies or joins is
handled without a hang or a restart.

The tests run in file order: the last two take a node away and add one.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import execbox
from execbox import Cancel, Executor, RunResult, Status
from execbox.cluster.backend import RayBackend
from execbox.cluster.direct import TOKEN_BYTES, Client, send_frame
from execbox.errors import SessionClosed, UsageError
from execbox.records import RunStore
from tests.cluster.conftest import MakesADirectory, RayCluster, ray
from tests.conftest import prove_jail
from tests.probes import wait_until

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def pg_url(pg_server: Callable[[], str]) -> str:
    return str(pg_server())


RAY_SETTINGS = {
    "max_concurrency": 4,
    "pool_size": 2,
    "rotate_after_runs": None,
    "rotate_after_s": None,
}


@pytest.fixture(scope="module")
def cluster_ex(ray_cluster: RayCluster, pg_url: str) -> Iterator[Executor]:
    with Executor(
        cluster=ray_cluster.address,
        records=pg_url,
        cache=False,
        max_concurrency=4,
        pool_size=2,
        rotate_after_runs=None,
        rotate_after_s=None,
    ) as ex:
        yield ex


def node_ids(ray_cluster: RayCluster) -> set[str]:
    return {node.node_id for node in ray_cluster.nodes}


def verdict(result: RunResult) -> tuple[Any, ...]:
    """What must match between a local run and one through the cluster."""
    error = result.error
    return (
        result.status,
        result.exit_code,
        result.stdout,
        error.type if error else None,
        result.stdout_truncated,
    )


def test_runs_spread_over_every_node_and_say_which(
    cluster_ex: Executor, ray_cluster: RayCluster
) -> None:
    assert cluster_ex.max_concurrency == 12  # 4 slots on each of the 3 nodes
    code = "import time\ntime.sleep(0.3)\nprint(sum(range({})))"
    results = dict(cluster_ex.map([code.format(i) for i in range(24)]))
    assert [results[i].stdout for i in range(24)] == [f"{sum(range(i))}\n" for i in range(24)]
    assert all(r.status is Status.ok for r in results.values())
    assert {r.metrics.node for r in results.values()} == node_ids(ray_cluster)


CASES: list[tuple[str, dict[str, Any]]] = [
    ("print('hi')", {}),
    ("raise ValueError('no')", {}),
    ("import sys\nsys.exit(3)", {}),
    ("while True: pass", {"timeout_s": 1}),
    # Never ends by itself: whether a program past the cap exits first is a race.
    ("while True: print('x' * 1000)", {"output_bytes": 2048}),
    ("import pandas\nprint(pandas.DataFrame({'a': [1, 2]}).a.sum())", {}),
    ("x = bytearray(400 << 20)", {"memory_mib": 128}),
]


def test_results_statuses_and_limits_are_a_local_runs(
    cluster_ex: Executor, executor: Executor
) -> None:
    for code, limits in CASES:
        here = executor.run(code, limits=limits)
        there = cluster_ex.run(code, limits=limits)
        assert verdict(there) == verdict(here), code
        assert there.limits == here.limits
        assert here.metrics.node is None and there.metrics.node is not None
    denied = cluster_ex.run("import socket", profile="minimal")
    assert denied.status is Status.policy_denied
    assert denied.error is not None and denied.error.type == "PolicyDenied"


def test_streamed_output_and_cancel_reach_the_caller(cluster_ex: Executor) -> None:
    seen: list[bytes] = []
    result = cluster_ex.run("print('streamed')", on_stdout=seen.append)
    assert b"".join(seen) == b"streamed\n" and result.stdout == "streamed\n"
    cancel = Cancel()
    threading.Timer(1.0, cancel.cancel).start()
    t0 = time.monotonic()
    result = cluster_ex.run("import time\ntime.sleep(60)", cancel=cancel)
    assert result.status is Status.error and result.error is not None
    assert result.error.type == "Cancelled"
    assert time.monotonic() - t0 < 10


def test_session_cells_stay_on_its_node_and_keep_state(
    cluster_ex: Executor, ray_cluster: RayCluster
) -> None:
    sessions = [cluster_ex.session() for _ in range(3)]
    try:
        homes = []
        for n, session in enumerate(sessions):
            first = session.run(f"x = {n * 100}")
            nodes = {first.metrics.node}
            for k in range(1, 4):
                result = session.run("x += 1\nprint(x)")
                assert result.stdout == f"{n * 100 + k}\n"
                nodes.add(result.metrics.node)
            session.files.write("note.txt", f"session {n}")
            assert session.files.read("note.txt") == f"session {n}".encode()
            assert len(nodes) == 1
            homes.append(nodes.pop())
        # The fewest sessions first: one session on each node.
        assert set(homes) == node_ids(ray_cluster)
    finally:
        for session in sessions:
            session.close()


def test_map_of_500_gives_the_local_verdicts(cluster_ex: Executor, executor: Executor) -> None:
    programs = [
        "print({0} * {0})",
        "raise KeyError({0})",
        "import sys\nsys.exit({0} % 5)",
        "import json\nprint(json.dumps({{'n': {0}}}))",
    ]
    items = [programs[i % len(programs)].format(i) for i in range(500)]
    here = dict(executor.map(items))
    there = dict(cluster_ex.map(items))
    assert [verdict(there[i]) for i in range(500)] == [verdict(here[i]) for i in range(500)]
    assert len({r.metrics.node for r in there.values()}) == 3


def test_records_of_every_node_are_in_the_shared_store(
    cluster_ex: Executor, ray_cluster: RayCluster, pg_url: str
) -> None:
    results = [r for _, r in cluster_ex.map([f"print({i})" for i in range(12)])]
    # Another machine's `execbox runs list` reads the same database.
    other = RunStore(pg_url)
    try:
        nodes = set()
        for result in results:
            record = other.get(result.run_id)
            assert record is not None, result.run_id
            assert record.result.stdout == result.stdout
            nodes.add(record.result.metrics.node)
        assert nodes == node_ids(ray_cluster)
    finally:
        other.close()


def test_the_jail_holds_through_the_cluster_as_on_one_box(
    cluster_ex: Executor, jailed: Executor
) -> None:
    assert prove_jail(cluster_ex) is None
    hostile = [
        ("import os\nos.kill(-1, 9)\nprint('survived')", {}),
        ("import os\nwhile True: os.fork()", {"pids": 32, "timeout_s": 3}),
        ("import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)", {}),
        ("print(open('/etc/shadow').read())", {}),
        ("import os\nos.setuid(0)", {}),
        (
            "import ctypes\nctypes.CDLL(None).mount(b'none', b'/mnt', b'tmpfs', 0, None)\n"
            "print(ctypes.get_errno())",
            {},
        ),
        ("open('/workspace/big', 'wb').write(b'x' * (200 << 20))", {"disk_mib": 64}),
    ]
    for code, limits in hostile:
        here = jailed.run(code, limits=limits)
        there = cluster_ex.run(code, limits=limits)
        assert verdict(there) == verdict(here), code


def test_cluster_status_lists_nodes_slots_and_sessions(
    cluster_ex: Executor, ray_cluster: RayCluster
) -> None:
    with cluster_ex.session() as session:
        session.run("pass")
        out = subprocess.run(
            [str(Path(sys.executable).parent / "execbox"), "cluster", "status", "--json"],
            env={**os.environ, "EXECBOX_CLUSTER": ray_cluster.address},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    assert {row["node"] for row in rows} == node_ids(ray_cluster)
    assert all(row["slots"] == 4 for row in rows)
    assert sum(row["sessions"] for row in rows) == 1


def test_runs_and_cells_go_to_each_host_over_its_direct_connection(
    cluster_ex: Executor, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    backend: Any = cluster_ex._backend
    hosts = backend._serving()
    assert len(hosts) == 3 and all(h.channel is not None for h in hosts)
    for host in hosts:  # what earlier tests left connected
        host.channel.close()
        host.channel = Client(host.channel.address, host.channel._token)
    nodes = {r.metrics.node for _, r in cluster_ex.map(["import time\ntime.sleep(0.3)"] * 12)}
    assert nodes == node_ids(ray_cluster)
    assert all(host.channel._idle for host in hosts), "a host's runs did not come directly"
    # A run naming its environment asks a host for the environment's digest first.
    named = cluster_ex.run("print(2)", environment=cluster_ex.default_environment)
    assert named.ok and named.image_digest == cluster_ex.image_digest
    with cluster_ex.session() as session:
        session.run("z = 5")
        host = next(h for h in hosts if h.node == session.run("pass").metrics.node)
        host.channel.close()  # the cell must come over a new direct connection
        host.channel = Client(host.channel.address, host.channel._token)
        assert session.run("print(z)").stdout == "5\n"
        assert host.channel._idle
    # Its port takes no one without the token: these bytes make a directory when unpickled.
    target = tmp_path / "unpickled"
    with socket.create_connection(hosts[0].channel.address, timeout=10) as sock:
        sock.sendall(b"\0" * TOKEN_BYTES)
        send_frame(sock, pickle.dumps(MakesADirectory(target)))
        try:
            assert sock.recv(100) == b""
        except ConnectionResetError:
            pass
    assert not target.exists()


def test_the_ray_call_path_gives_a_local_runs_results_too(
    cluster_ex: Executor, executor: Executor, ray_cluster: RayCluster, pg_url: str
) -> None:
    backend = RayBackend(ray_cluster.address, RAY_SETTINGS, direct=False)
    with Executor(backend=backend, records=pg_url, cache=False, max_concurrency=12) as ex:
        assert all(h.channel is None for h in backend._serving())
        for code, limits in CASES:
            assert verdict(ex.run(code, limits=limits)) == verdict(
                executor.run(code, limits=limits)
            )
        cancel = Cancel()
        threading.Timer(1.0, cancel.cancel).start()
        result = ex.run("import time\ntime.sleep(60)", cancel=cancel)
        assert result.error is not None and result.error.type == "Cancelled"
        with ex.session() as session:
            session.run("w = 6")
            assert session.run("print(w * 7)").stdout == "42\n"
            session.files.write("note.txt", "through Ray")
            assert session.files.read("note.txt") == b"through Ray"


def test_a_host_that_dies_mid_run_fails_it_at_once_and_is_replaced(
    cluster_ex: Executor, ray_cluster: RayCluster
) -> None:
    backend: Any = cluster_ex._backend
    victim = next(h for h in backend._serving() if h.node == ray_cluster.nodes[1].node_id)
    cancels = [Cancel() for _ in range(3)]
    results: list[tuple[RunResult, float]] = []

    def run(n: int) -> None:
        result = cluster_ex.run("import time\ntime.sleep(120)", cancel=cancels[n])
        results.append((result, time.monotonic()))

    threads = [threading.Thread(target=run, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    assert wait_until(lambda: sum(h.running for h in backend._serving()) == 3, 30)
    time.sleep(2)  # the sleeps have started on their nodes
    killed_at = time.monotonic()
    ray.kill(victim.actor, no_restart=True)
    assert wait_until(lambda: len(results) == 1, 20), "no run ended after its host was killed"
    ((lost, ended_at),) = results
    assert lost.status is Status.sandbox_error and lost.error is not None
    assert lost.error.message.startswith(f"node lost: {victim.node}"), lost.error.message
    assert ended_at - killed_at < 5
    for cancel in cancels:
        cancel.cancel()
    for thread in threads:
        thread.join(30)
    assert len(results) == 3
    # Its node is alive: a new host takes its place, and runs there over a new connection.
    assert wait_until(
        lambda: any(h.node == victim.node and h is not victim for h in backend._serving()), 120
    ), "the dead host was never replaced"
    nodes = {r.metrics.node for _, r in cluster_ex.map(["import time\ntime.sleep(0.3)"] * 12)}
    assert nodes == node_ids(ray_cluster)


def test_a_node_lost_mid_run_gives_sandbox_error_in_seconds(
    cluster_ex: Executor, ray_cluster: RayCluster
) -> None:
    victim = ray_cluster.nodes[-1]  # a worker, never the head
    sessions = [cluster_ex.session() for _ in range(3)]
    for session in sessions:
        session.run("x = 1")
    on_victim = [s for s in sessions if s.run("pass").metrics.node == victim.node_id]
    assert len(on_victim) == 1
    cancels = [Cancel() for _ in range(3)]
    results: dict[int, tuple[RunResult, float]] = {}

    def run(n: int) -> None:
        result = cluster_ex.run("import time\ntime.sleep(120)", cancel=cancels[n])
        results[n] = (result, time.monotonic())

    threads = [threading.Thread(target=run, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    backend: Any = cluster_ex._backend
    assert wait_until(lambda: sum(h.running for h in backend._serving()) == 3, 30)
    time.sleep(2)  # the sleeps have started on their nodes
    killed_at = time.monotonic()
    ray_cluster.kill(victim)
    assert wait_until(lambda: len(results) == 1, 20), "no run ended after its node was killed"
    ((lost, ended_at),) = results.values()
    assert lost.status is Status.sandbox_error and lost.error is not None
    assert lost.error.message.startswith("node lost"), lost.error.message
    assert ended_at - killed_at < 15
    with pytest.raises(SessionClosed, match="node lost"):
        on_victim[0].run("print(x)")
    with pytest.raises(SessionClosed):
        on_victim[0].run("print(x)")
    for cancel in cancels:
        cancel.cancel()
    for thread in threads:
        thread.join(30)
    assert len(results) == 3
    # The other nodes serve on: their sessions keep their state, new runs avoid the lost node.
    for session in sessions:
        if session not in on_victim:
            assert session.run("print(x)").stdout == "1\n"
        session.close()
    nodes = {r.metrics.node for _, r in cluster_ex.map(["print(1)"] * 12)}
    assert victim.node_id not in nodes and len(nodes) == 2
    # Admission follows the serving slots: two nodes of 4.
    assert wait_until(lambda: cluster_ex.max_concurrency == 8, 10)


def test_a_node_added_later_takes_runs(cluster_ex: Executor, ray_cluster: RayCluster) -> None:
    node = ray_cluster.add()
    backend: Any = cluster_ex._backend
    assert cluster_ex.max_concurrency == 8
    assert wait_until(lambda: node.node_id in backend.nodes(), 120), "the new node never served"
    # The admission widens with it, without a restart: a batch fills every node's slots.
    assert wait_until(lambda: cluster_ex.max_concurrency == 12, 10)
    nodes = {r.metrics.node for _, r in cluster_ex.map(["import time\ntime.sleep(0.3)"] * 12)}
    assert node.node_id in nodes


def test_a_cluster_needs_a_shared_store(ray_cluster: RayCluster, tmp_path: Any) -> None:
    with pytest.raises(UsageError, match="shared run store"):
        Executor(cluster=ray_cluster.address, records=f"sqlite:///{tmp_path}/runs.db")
    assert not execbox.__name__.startswith("ray")
