"""The cluster's other corners, on the same three-node cluster (see conftest): callers that
share the nodes' hosts (another executor, a Ray Client `ray://` caller in another process, one
that dies) without ending each other's runs or sessions; JavaScript and bash; a session's
network allowlist and limits on its node; large output and artifacts, spooled or not.

It runs after test_cluster.py, whose executor has closed by then: the first tests here are the
only callers of the hosts they start.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from execbox import Executor, RunRequest, RunResult, Status
from execbox.cluster.backend import NAMESPACE, host_name
from execbox.cluster.host import LEASE_S
from execbox.policy import load_profiles
from tests.cluster.conftest import RayCluster, ray
from tests.network.servers import Upstream
from tests.probes import wait_until

pytestmark = pytest.mark.timeout(300)

SETTINGS: dict[str, Any] = {
    "cache": False,
    "max_concurrency": 4,
    "pool_size": 2,
    "rotate_after_runs": None,
    "rotate_after_s": None,
}
FETCH = """
import urllib.request, urllib.error
def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError as e:
        return type(e).__name__
"""
# A caller in another process, through the head's Ray Client server: it runs a batch and a
# session cell, says what it saw, then waits (holding its lease) until it is told to close.
CLIENT = """
import json, sys
from execbox import Executor
with Executor(cluster=sys.argv[1], records=sys.argv[2], cache=False, max_concurrency=4,
              pool_size=2, rotate_after_runs=None, rotate_after_s=None) as ex:
    runs = [r for _, r in sorted(ex.map(["print(%d)" % i for i in range(12)]))]
    with ex.session() as session:
        session.run("y = 20")
        cell = session.run("print(y + 1)")
    print(json.dumps({
        "stdout": [r.stdout for r in runs],
        "nodes": sorted({r.metrics.node for r in runs}),
        "cell": [cell.stdout, cell.metrics.node],
        "width": ex.max_concurrency,
    }), flush=True)
    sys.stdin.readline()
"""


@pytest.fixture(scope="module")
def pg_url(pg_server: Callable[[], str]) -> str:
    return str(pg_server())


@pytest.fixture(scope="module")
def driver(ray_cluster: RayCluster) -> Iterator[None]:
    """This process joined to the cluster for the whole module, so that the tests can look at
    the hosts between executors (an executor leaves Ray alone when it did not join it)."""
    ray.init(address=ray_cluster.address, namespace=NAMESPACE, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def hosts_alive(ray_cluster: RayCluster) -> dict[str, int | None]:
    """Each node's host's number of callers holding a lease; None where there is no host."""
    out: dict[str, int | None] = {}
    for node in ray_cluster.nodes:
        try:
            actor = ray.get_actor(host_name(node.node_id), namespace=NAMESPACE)
            out[node.node_id] = int(ray.get(actor.status.remote(), timeout=30)["callers"])
        except (ValueError, ray.exceptions.RayActorError):
            out[node.node_id] = None
    return out


def node_ids(ray_cluster: RayCluster) -> set[str]:
    return {node.node_id for node in ray_cluster.nodes}


def test_a_caller_closing_leaves_the_hosts_to_the_others(
    driver: None, ray_cluster: RayCluster, pg_url: str
) -> None:
    assert set(hosts_alive(ray_cluster).values()) == {None}, "a host outlived its callers"
    first = Executor(cluster=ray_cluster.address, records=pg_url, **SETTINGS)  # starts them
    second = Executor(cluster=ray_cluster.address, records=pg_url, **SETTINGS)
    try:
        assert set(hosts_alive(ray_cluster).values()) == {2}
        sessions = [second.session() for _ in range(3)]
        for n, session in enumerate(sessions):
            session.run(f"x = {n}")
        first.close()
        assert set(hosts_alive(ray_cluster).values()) == {1}
        assert [s.run("print(x)").stdout for s in sessions] == ["0\n", "1\n", "2\n"]
        nodes = {r.metrics.node for _, r in second.map(["import time\ntime.sleep(0.2)"] * 12)}
        assert nodes == node_ids(ray_cluster)
        for session in sessions:
            session.close()
    finally:
        first.close()
        second.close()
    # The last caller gone, its hosts are: nothing of the sandbox is left on the nodes.
    assert wait_until(lambda: set(hosts_alive(ray_cluster).values()) == {None}, 30)


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    servers = Upstream()
    yield servers
    servers.close()


@pytest.fixture(scope="module")
def net_ex(
    driver: None, ray_cluster: RayCluster, pg_url: str, upstream: Upstream, tmp_path_factory: Any
) -> Iterator[Executor]:
    """A cluster executor whose hosts pin the test names to 127.0.0.1 (every node is this
    machine) and trust the test CA, with a profile that lets requests ask for any host."""
    profiles = load_profiles()
    profiles["net"] = profiles["data"].model_copy(
        update={"name": "net", "network_allow": ["*:*", "0.0.0.0/0:*", "[::/0]:*"]}
    )
    ca_file = tmp_path_factory.mktemp("net-ca") / "ca.pem"
    ca_file.write_bytes(upstream.ca_pem)
    with Executor(
        cluster=ray_cluster.address,
        records=pg_url,
        profiles=profiles,
        network_resolve={"api.test": "127.0.0.1", "other.test": "127.0.0.1"},
        network_ca=str(ca_file),
        **SETTINGS,
    ) as ex:
        yield ex


def verdict(result: RunResult) -> tuple[Any, ...]:
    error = result.error
    return (result.status, result.exit_code, result.stdout, error.type if error else None)


def test_javascript_and_bash_go_through_the_cluster_as_locally(
    net_ex: Executor, executor: Executor, ray_cluster: RayCluster
) -> None:
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("javascript", "console.log(6 * 7)", {}),
        ("javascript", "throw new TypeError('no')", {}),
        ("javascript", "process.exit(3)", {}),
        ("javascript", "while (true) {}", {"timeout_s": 1}),
        ("bash", "echo $((6 * 7))", {}),
        ("bash", "echo out; echo err >&2; exit 4", {}),
    ]
    for language, code, limits in cases:
        here = executor.run(code, language=language, limits=limits)
        there = net_ex.run(code, language=language, limits=limits)
        assert verdict(there) == verdict(here), (language, code)
        assert there.stderr == here.stderr and there.metrics.node is not None
    batch = [RunRequest(code="console.log(1)", language="javascript")] * 12
    nodes = {r.metrics.node for _, r in net_ex.map(batch)}
    assert nodes == node_ids(ray_cluster)


def test_a_javascript_session_keeps_its_state_on_its_node(net_ex: Executor) -> None:
    with net_ex.session(language="javascript") as session:
        first = session.run("let x = 40")
        cells = [session.run("x += 1; console.log(x)") for _ in range(2)]
        failed = session.run("null.y")
    assert [c.stdout for c in cells] == ["41\n", "42\n"]
    assert {c.metrics.node for c in [first, *cells, failed]} == {first.metrics.node}
    assert failed.status is Status.error and failed.error is not None
    assert failed.error.type == "TypeError"


def test_a_sessions_network_allowlist_and_limits_hold_on_its_node(
    net_ex: Executor, upstream: Upstream
) -> None:
    port = upstream.http_port
    upstream.clear()
    with net_ex.session(profile="net", network=[f"api.test:{port}"]) as session:
        allowed = session.run(FETCH + f"print(fetch('http://api.test:{port}/hello'))")
        denied = session.run(f"print(fetch('http://other.test:{port}/hello'))")
    assert (allowed.stdout, denied.stdout) == ("200\n", "403\n")
    assert [(e.host, e.verdict) for e in allowed.network_log] == [("api.test", "allowed")]
    assert [(e.host, e.verdict) for e in denied.network_log] == [("other.test", "denied")]
    assert upstream.seen() == [("GET", "/hello", f"api.test:{port}")]
    # No allowlist: no network at all on the node either.
    with net_ex.session(profile="net") as session:
        cell = session.run(FETCH + f"print(fetch('http://127.0.0.1:{port}/hello'))")
    assert cell.stdout == "URLError\n" and cell.network_log == []
    # The session's network limit counts across its cells and ends it, as on one box.
    limits = {"network_connections": 2}
    url = f"http://api.test:{port}/hello"
    with net_ex.session(profile="net", network=[f"api.test:{port}"], limits=limits) as session:
        first = session.run(FETCH + f"print(fetch({url!r}), fetch({url!r}))")
        second = session.run(f"print(fetch({url!r}))")
        assert session.closed
    assert first.stdout == "200 200\n"
    assert second.status == "network_limit", second
    assert second.error is not None and "network_connections" in second.error.message
    # Its memory, pids and per-cell time limits are the node's sandbox's.
    limits = {"memory_mib": 128, "pids": 16, "timeout_s": 2}
    with net_ex.session(limits=limits) as session:
        session.run("x = 1")
        memory = session.run("b = bytearray(400 << 20)")
    with net_ex.session(limits=limits) as session:
        forks = session.run("import os\nfor _ in range(64):\n    os.fork() or os._exit(0)")
    with net_ex.session(limits=limits) as session:
        slow = session.run("while True: pass")
    assert memory.status is Status.memory_limit, memory
    assert forks.status is Status.error and forks.error is not None, forks
    assert forks.error.type in ("BlockingIOError", "OSError"), forks.error
    assert slow.status is Status.timeout, slow


def test_a_run_with_an_allowlist_reaches_only_its_hosts(
    net_ex: Executor, upstream: Upstream
) -> None:
    port = upstream.http_port
    code = (
        FETCH
        + f"print(fetch('http://api.test:{port}/hello'), fetch('http://other.test:{port}/hello'))"
    )
    result = net_ex.run(code, profile="net", network=[f"api.test:{port}"])
    assert result.stdout == "200 403\n", result
    assert [(e.host, e.verdict) for e in result.network_log] == [
        ("api.test", "allowed"),
        ("other.test", "denied"),
    ]


def test_large_output_and_artifacts_come_back_whole(
    net_ex: Executor, executor: Executor, tmp_path: Path
) -> None:
    code = (
        "import os\n"
        "blob = os.urandom(3 << 20)\n"  # random: the cluster path must not alter a byte
        "open('/workspace/blob.bin', 'wb').write(blob)\n"
        "open('/workspace/small.txt', 'w').write('hi')\n"
        "print('y' * (900 << 10))\n"
    )
    here = executor.run(code)
    there = net_ex.run(code)
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    spooled = net_ex.run_request(RunRequest(code=code), spool_dir=str(spool))
    for result in (here, there, spooled):
        assert result.ok and len(result.stdout) == (900 << 10) + 1, result.status
        assert not result.stdout_truncated
        assert sorted((a.path, a.size) for a in result.artifacts) == [
            ("blob.bin", 3 << 20),
            ("small.txt", 2),
        ]
    for index, artifact in enumerate(spooled.artifacts):
        data = (spool / str(index)).read_bytes()
        assert hashlib.sha256(data).hexdigest() == artifact.sha256
    big = next(a for a in there.artifacts if a.path == "blob.bin")
    assert big.data is not None and hashlib.sha256(big.data).hexdigest() == big.sha256
    over = net_ex.run("print('z' * (2 << 20))")
    assert over.status is Status.output_limit and over.stdout_truncated


RAY_CLIENT_START_FAILED = ("Starting Ray client server failed", "ZombieProcess")


def start_client(
    address: str, pg_url: str, tmp_path: Path
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """A `ray://` caller in a process of its own, and its report once it has run."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for attempt in range(3):
        log = tmp_path / f"client-{time.monotonic_ns()}.err"
        with log.open("w") as err:
            caller = subprocess.Popen(
                [sys.executable, "-c", CLIENT, address, pg_url],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
            )
        assert caller.stdout is not None
        line = caller.stdout.readline()
        if line:
            return caller, json.loads(line)
        code = caller.wait(60)
        for pipe in (caller.stdin, caller.stdout):
            if pipe is not None:
                pipe.close()
        # Ray's Client server sometimes loses the per-client server it starts, on a loaded
        # machine (its log: "Specific server ... is no longer running", or psutil's
        # ZombieProcess as it starts one): Ray's, not ours.
        said = log.read_text()
        if attempt == 2 or not any(mark in said for mark in RAY_CLIENT_START_FAILED):
            raise AssertionError(f"the ray:// caller ended first (exit {code}):\n{log.read_text()}")
    raise AssertionError("unreachable")


def test_a_ray_client_caller_shares_the_hosts_and_its_death_ends_nothing(
    net_ex: Executor, ray_cluster: RayCluster, pg_url: str, tmp_path: Path
) -> None:
    sessions = [net_ex.session() for _ in range(3)]
    for n, session in enumerate(sessions):
        session.run(f"x = {n}")
    callers: list[subprocess.Popen[str]] = []
    seen = []
    try:
        for _ in range(2):  # one after the other: their reports come in order
            caller, report = start_client(ray_cluster.client_address, pg_url, tmp_path)
            callers.append(caller)
            seen.append(report)
        for report in seen:
            assert report["stdout"] == [f"{i}\n" for i in range(12)]
            assert set(report["nodes"]) == node_ids(ray_cluster)
            assert report["cell"][0] == "21\n" and report["cell"][1] in node_ids(ray_cluster)
            assert report["width"] == 12
        assert set(hosts_alive(ray_cluster).values()) == {3}
        # One closes as it should, the other dies: neither ends what this caller uses.
        calm, killed = callers
        assert calm.stdin is not None
        calm.stdin.write("\n")
        calm.stdin.flush()
        assert calm.wait(60) == 0
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
        time.sleep(2)
        assert [s.run("print(x)").stdout for s in sessions] == ["0\n", "1\n", "2\n"]
        nodes = {r.metrics.node for _, r in net_ex.map(["import time\ntime.sleep(0.2)"] * 12)}
        assert nodes == node_ids(ray_cluster)
        # The dead caller's lease stays until it lapses; the closed one's is back.
        assert set(hosts_alive(ray_cluster).values()) == {2}
        assert wait_until(lambda: set(hosts_alive(ray_cluster).values()) == {1}, LEASE_S + 30)
        assert [s.run("print(x)").stdout for s in sessions] == ["0\n", "1\n", "2\n"]
    finally:
        for caller in callers:
            if caller.poll() is None:
                caller.kill()
                caller.wait(30)
            for pipe in (caller.stdin, caller.stdout):
                if pipe is not None:
                    pipe.close()
        for session in sessions:
            session.close()
