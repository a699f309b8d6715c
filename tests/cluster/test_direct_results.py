"""A run over a host's direct connection, attacked from both ends on the three-node cluster (see
conftest): registered secrets are redacted as in a local run (result, stream, error, session
cell, record), and a host's port that strangers flood and broken peers abuse goes on serving
its callers directly, none of them lost to Ray or "node lost"."""

from __future__ import annotations

import json
import pickle
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from execbox import Executor, RunResult, Status
from execbox.backend import RunSpec
from execbox.cluster import wire
from execbox.cluster.direct import HEADER, Client, send_frame
from execbox.contract import Limits
from execbox.records import RunStore
from tests.cluster.conftest import RayCluster

pytestmark = pytest.mark.timeout(300)

SECRET = "sk-direct-7f3a9c1e5b"
LEAKS = """
import os, sys
s = os.environ["TOKEN"]
print("out", s)
print("err", s, file=sys.stderr)
open("/workspace/note.txt", "w").write(s)
raise RuntimeError("failed with " + s)
"""


@pytest.fixture(scope="module")
def pg_url(pg_server: Callable[[], str]) -> str:
    return str(pg_server())


@pytest.fixture(scope="module")
def direct_ex(ray_cluster: RayCluster, pg_url: str) -> Iterator[Executor]:
    with Executor(
        cluster=ray_cluster.address,
        records=pg_url,
        cache=False,
        max_concurrency=4,
        pool_size=2,
        rotate_after_runs=None,
        rotate_after_s=None,
    ) as ex:
        backend: Any = ex._backend
        assert backend._serving() and all(h.channel is not None for h in backend._serving())
        yield ex


def seen(result: RunResult) -> tuple[Any, ...]:
    error = result.error
    return (
        result.status,
        result.stdout,
        result.stderr,
        error.type if error else None,
        error.message if error else None,
        sorted((a.path, a.size, a.sha256) for a in result.artifacts),
    )


def test_registered_secrets_are_redacted_over_the_direct_path_as_locally(
    direct_ex: Executor, executor: Executor, pg_url: str
) -> None:
    backend: Any = direct_ex._backend
    results = []
    for ex in (executor, direct_ex):
        streamed: list[bytes] = []
        results.append(
            ex.run(
                LEAKS,
                env={"TOKEN": SECRET},
                secrets=[SECRET],
                on_stdout=streamed.append,
                on_stderr=streamed.append,
            )
        )
        assert SECRET.encode() not in b"".join(streamed)
    here, there = results
    assert there.metrics.node is not None and any(h.channel._idle for h in backend._serving())
    assert seen(there) == seen(here)
    assert there.status is Status.error and SECRET not in there.model_dump_json()
    store = RunStore(pg_url)
    try:
        record = store.get(there.run_id)
    finally:
        store.close()
    assert record is not None and SECRET not in json.dumps(record.model_dump(mode="json"))
    with direct_ex.session() as session:
        cell = session.run(f"print({SECRET!r})", secrets=[SECRET])
        assert cell.ok and SECRET not in cell.stdout and cell.metrics.node is not None


def test_a_hosts_port_serves_on_through_strangers_and_broken_peers(
    direct_ex: Executor,
) -> None:
    backend: Any = direct_ex._backend
    host = backend._serving()[0]
    address, token = host.channel.address, host.channel._token
    held: list[socket.socket] = []

    def peer(hello: bytes) -> socket.socket:
        sock = socket.create_connection(address, timeout=10)
        sock.sendall(hello)
        held.append(sock)
        return sock

    try:
        for _ in range(150):  # strangers who never say the token
            peer(b"")
        peer(token[:16])  # half a token, then silence
        garbage = peer(token)
        send_frame(garbage, b"\x80\x05not a pickle at all")
        huge = peer(token)  # says an exabyte follows, sends a few bytes, leaves
        huge.sendall(HEADER.pack(1 << 60) + b"abc")
        huge.close()
        # Holds the token, asks for a megabyte of output, never reads the answer.
        deaf = peer(token)
        deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        spec = RunSpec(run_id="deaf-peer", code="print('d' * (1 << 20))", limits=Limits())
        send_frame(deaf, pickle.dumps(("run", wire.pack(spec))))
        t0 = time.monotonic()
        nodes = {r.metrics.node for _, r in direct_ex.map(["print(7)"] * 12)}
        assert time.monotonic() - t0 < 60
        assert host.node in nodes and host.lost is None and host.channel._idle
        assert garbage.recv(100) == b"", "the host answered a frame that was no pickle"
    finally:
        for sock in held:
            sock.close()


def test_a_connect_that_fails_sends_the_call_through_ray_and_loses_no_node(
    direct_ex: Executor,
) -> None:
    # A failed connect (a full listen queue, no descriptor left) proves no host dead: losing
    # the node for it would fail every run in flight there.
    backend: Any = direct_ex._backend
    host = backend._serving()[0]
    with socket.socket() as gone:
        gone.bind(("127.0.0.1", 0))
        refused = gone.getsockname()
    kept = host.channel
    host.channel = Client(refused, kept._token)
    try:
        results = [r for _, r in direct_ex.map(["print(8)"] * 24)]
        assert all(r.ok and r.stdout == "8\n" for r in results), {r.status for r in results}
        assert host.node in {r.metrics.node for r in results}
        assert host.lost is None and host in backend._serving()
    finally:
        host.channel.close()
        host.channel = kept
