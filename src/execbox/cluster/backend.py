"""`RayBackend`: the executor's runs and sessions on the nodes of a Ray cluster.

One `NodeHost` actor per node, pinned to it (node affinity, hard), named by its node id in
the `execbox` namespace and detached from any one caller, owns that node's sandbox; every
executor that uses it holds a lease on it (renewed every second, given back on close), and
the host closes its sandbox when the last lease goes. A run goes to the host with the
smallest share of its slots in use; a session to the one with the fewest sessions, and all its cells
follow it there. A watcher thread lists the cluster's nodes every `REFRESH_S`: a node that
joins gets a host and takes work from the next run on (the executor's admission widens with
it, `on_capacity`); one that leaves is dropped.

A run and a session's cell go to their host over a connection of this executor's own
(`direct`) when the host's node address takes one, else as a Ray actor call; Ray still places
the hosts, carries every other call and says when a node is gone (its host's connections are
then closed under the calls in flight).

Nothing waits without a bound: every `ray.get` and every direct call has a timeout, and a host
that dies or stops answering turns the run into a `HostError` "node lost: ..." (the executor's
`sandbox_error`) and a session there into `SessionEnded` (the caller's `SessionClosed`).
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..backend import BACKSTOP_GRACE_S, SLOT_WAIT_S, RunSpec
from ..contract import Limits
from ..errors import SandboxUnavailable, UsageError
from ..sandbox.host.channel import SessionEnded
from ..sandbox.host.errors import HostError
from ..sandbox.host.pump import OutputCallback, RawRun
from . import direct, wire
from .host import CLOSED, Answer, NodeHost

log = logging.getLogger(__name__)

NAMESPACE = "execbox"
REFRESH_S = 1.0  # how often the node list is read: a new node serves within about this
HOST_START_S = 120.0  # a node's sandbox start (its image checked, its zygotes forked)
CALL_S = 30.0  # a short call on a host (an environment's digest, a session's file, closing)
# Past a run's own time and the host's waits: no answer then means the node is gone.
MARGIN_S = SLOT_WAIT_S + 10.0
# A host that died on a node Ray still lists alive is started again after this long (a node on
# its way out stays listed for a second or two).
RELOST_S = 10.0
# "0": every call through Ray; "1": direct connections for a Ray Client (`ray://`) caller too.
DIRECT_ENV = "EXECBOX_CLUSTER_DIRECT"
ERRORS: dict[str, type[Exception]] = {
    "SandboxUnavailable": SandboxUnavailable,
    "UsageError": UsageError,
}


class NetworkLimitPassed(HostError):
    """A session's network passed a limit on its node, which ended its interpreter."""


def direct_wanted(address: str, environ: Mapping[str, str]) -> bool:
    """Whether a caller of the cluster at `address` tries direct connections to the hosts:
    as EXECBOX_CLUSTER_DIRECT says ("0" or "1"), else unless it is a Ray Client (`ray://`: a
    caller outside the nodes' network, where each node's connection would be tried in vain)."""
    said = environ.get(DIRECT_ENV)
    return said == "1" if said in ("0", "1") else not address.startswith("ray://")


def host_name(node_id: str) -> str:
    """The actor name of the host on node `node_id`."""
    return f"execbox-host-{node_id}"


@dataclass
class Host:
    """A node's host as this executor sees it."""

    node: str
    actor: Any
    capacity: int
    running: int = 0
    sessions: set[str] = field(default_factory=set)
    lost: str | None = None  # why it is gone (None: serving)
    lost_at: float = 0.0
    channel: direct.Client | None = None  # None: its calls go through Ray

    def lose(self, reason: str) -> None:
        if self.lost is None:
            self.lost, self.lost_at = reason, time.monotonic()
        if self.channel is not None:  # the calls waiting on it end now, "node lost"
            self.channel.close()

    def lost_for(self) -> float:
        return time.monotonic() - self.lost_at


class RayBackend:
    """Runs and sessions on the hosts of a Ray cluster (see the module's docstring)."""

    def __init__(
        self, address: str, settings: Mapping[str, Any], direct: bool | None = None
    ) -> None:
        """`direct`: send runs and cells over connections of their own where a host's node
        takes them (None: `direct_wanted`)."""
        self.address = address
        self._settings = dict(settings)
        self._direct = direct_wanted(address, os.environ) if direct is None else direct
        self._started_ray = False
        if not ray.is_initialized():
            try:
                ray.init(
                    address=address,
                    namespace=NAMESPACE,
                    log_to_driver=False,
                    configure_logging=False,
                )
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise UsageError(f"cannot join the Ray cluster at {address!r}: {exc}") from exc
            self._started_ray = True
        self._lock = threading.RLock()  # `_pick` reads the hosts under a caller's hold
        self._hosts: dict[str, Host] = {}
        self._caller = uuid.uuid4().hex  # this executor's name on the hosts' leases
        # Told the serving slots, all told, whenever they change (the executor's admission).
        self.on_capacity: Callable[[int], None] | None = None
        self._capacity = 0
        self._digest: str | None = None
        self._default_environment: str | None = None
        self._closed = threading.Event()
        # Leases renewed on a thread of their own: placing a new node's host can take longer
        # than a lease lasts.
        self._keeper = threading.Thread(target=self._keep, name="execbox-leases", daemon=True)
        self._keeper.start()
        try:
            self._refresh()
            if not self._serving():
                raise SandboxUnavailable(
                    f"no node of the Ray cluster at {address!r} can run sandboxes (each needs "
                    "root and the runtime image: `execbox image build`, `execbox doctor`)"
                )
        except BaseException:
            self.close()
            raise
        self._watcher = threading.Thread(target=self._watch, name="execbox-cluster", daemon=True)
        self._watcher.start()

    # ---- the nodes --------------------------------------------------------------------------

    def _serving(self) -> list[Host]:
        with self._lock:
            return [h for h in self._hosts.values() if h.lost is None]

    def _keep(self) -> None:
        while not self._closed.wait(REFRESH_S):
            try:
                self._renew(self._serving())
            except Exception:  # the cluster's hiccup; the next round tries again
                log.exception("cluster: renewing the hosts' leases failed")

    def _watch(self) -> None:
        while not self._closed.wait(REFRESH_S):
            try:
                self._refresh()
            except Exception:  # the cluster's hiccup; the next look tries again
                log.exception("cluster: reading the node list failed")

    def _refresh(self) -> None:
        """Hosts for nodes that joined; nodes that left marked lost."""
        alive = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
        with self._lock:
            for node, host in list(self._hosts.items()):
                if node not in alive:
                    host.lose(f"node lost: {node} left the cluster")
                elif node in alive and host.lost is not None and host.lost_for() > RELOST_S:
                    del self._hosts[node]  # its host died, the node did not: a new one
            new = [node for node in alive if node not in self._hosts]
        for node in new:
            placed = self._place(node, alive[node].get("NodeManagerAddress"))
            if placed is not None:
                with self._lock:
                    self._hosts[node] = placed
        capacity = self.capacity
        if capacity != self._capacity:
            self._capacity = capacity
            if self.on_capacity is not None:
                self.on_capacity(capacity)

    def _renew(self, hosts: list[Host]) -> None:
        """Renew this executor's lease on each of `hosts`; one closed under it is lost."""
        refs = {host.actor.attach.remote(self._caller): host for host in hosts}
        if not refs:
            return
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=REFRESH_S)
        for ref in ready:
            try:
                held = ray.get(ref, timeout=0)
            except RayError:  # a dead host: its runs say so, and the next read replaces it
                held = True
            if not held:
                refs[ref].lose(f"node lost: {refs[ref].node}: {CLOSED}")

    def _place(self, node: str, address: str | None) -> Host | None:
        """The host on `node` (started there if none is, or if the one there closed), with a
        lease of this executor's; None (logged) when it cannot serve."""
        try:
            facts, actor = self._start(node, address)
        except HostError as exc:
            if CLOSED not in str(exc):
                log.warning("cluster: node %s does not serve: %s", node, exc)
                return None
            try:  # every caller of that host had left: a new one in its place
                facts, actor = self._start(node, address)
            except HostError as again:
                log.warning("cluster: node %s does not serve: %s", node, again)
                return None
        except SandboxUnavailable as exc:
            log.warning("cluster: node %s cannot sandbox: %s", node, exc)
            return None
        if self._digest is None:
            self._digest = facts["digest"]
            self._default_environment = facts["default_environment"]
        elif facts["digest"] != self._digest:
            log.warning(
                "cluster: node %s runs image %s, not the cluster's %s: not used (build the "
                "same runtime image on every node)",
                node,
                facts["digest"],
                self._digest,
            )
            return None
        if facts["settings"] != self._settings:
            log.warning(
                "cluster: node %s's host keeps the sandbox settings of the caller that started "
                "it (%s), not this executor's (%s)",
                node,
                facts["settings"],
                self._settings,
            )
        channel = self._connect(node, facts.get("direct"))
        log.info(
            "cluster: node %s serves, %d slots, %s",
            node,
            facts["capacity"],
            "through Ray" if channel is None else "over a direct connection",
        )
        return Host(node=node, actor=actor, capacity=int(facts["capacity"]), channel=channel)

    def _connect(self, node: str, where: Any) -> direct.Client | None:
        """A direct channel to `node`'s host at `where` (its address, port and token), if it
        answers there; None: its calls go through Ray."""
        if not self._direct or where is None:
            return None
        host, port, token = where
        client = direct.Client((host, int(port)), token)
        try:
            kind, value = pickle.loads(client.call(pickle.dumps(("ping", ())), direct.CONNECT_S))
            if kind == "ok" and value == node:
                return client
        except (OSError, pickle.UnpicklingError, ValueError) as exc:
            log.warning("cluster: node %s: no direct connection (%s); through Ray", node, exc)
        client.close()
        return None

    def _start(self, node: str, address: str | None) -> tuple[dict[str, Any], Any]:
        """The facts of the host on `node` and its handle, the host started if there is none;
        a host found closed is ended (HostError naming CLOSED: the caller starts another)."""
        capacity = self._settings.get("max_concurrency") or 0
        actor = (
            ray.remote(NodeHost)
            .options(
                name=host_name(node),
                namespace=NAMESPACE,
                get_if_exists=True,
                lifetime="detached",  # callers come and go; the leases end it (see host.py)
                num_cpus=0,
                max_concurrency=max(64, 4 * capacity),
                max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            )
            .remote(node, self._settings, address)
        )
        try:
            facts: dict[str, Any] = self._ask(actor.ready.remote(self._caller), HOST_START_S, node)
        except HostError as exc:
            if CLOSED in str(exc):
                ray.kill(actor)
            raise
        except SandboxUnavailable:
            self._leave([actor])  # a host that cannot serve ends with its last caller
            raise
        return facts, actor

    def _leave(self, actors: list[Any]) -> None:
        """Give back this executor's lease on each of `actors`; a host that no other caller
        holds closes its sandbox, and its actor is ended here."""
        refs = {}
        for actor in actors:
            try:
                refs[actor.detach.remote(self._caller)] = actor
            except RayError:
                continue
        if not refs:
            return
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=CALL_S)
        for ref in ready:
            try:
                last = ray.get(ref, timeout=0)
            except RayError:  # gone already
                continue
            if last:
                ray.kill(refs[ref])

    def _ask(self, ref: Any, timeout_s: float, node: str) -> Any:
        """The value of a host's answer; its error raised again here; "node lost" when the
        host died or did not answer within `timeout_s`."""
        try:
            got: Answer | bytes = ray.get(ref, timeout=timeout_s)
        except GetTimeoutError as exc:
            ray.cancel(ref, force=False)
            raise HostError(f"node lost: {node} did not answer within {timeout_s:g} s") from exc
        except RayActorError as exc:
            self._lose(node, f"node lost: {node}: its host died ({type(exc).__name__})")
            raise HostError(self._lost_reason(node)) from exc
        except RayError as exc:
            raise HostError(f"node lost: {node}: {type(exc).__name__}: {exc}") from exc
        # A run's and a cell's answer come pickled (host.py).
        return _value(pickle.loads(got) if isinstance(got, bytes) else got)

    def _call(
        self,
        host: Host,
        op: str,
        args: Any,
        timeout_s: float,
        remote: Callable[[], Any],
        on_timeout: Callable[[], None] | None = None,
    ) -> Any:
        """The value of `host`'s answer to `op(args)`, sent over its direct channel, or through
        Ray as `remote()` (the call's ref) when it has none; errors as `_ask`'s. A direct call
        unanswered in `timeout_s` calls `on_timeout` (a Ray call is cancelled by `_ask`)."""
        channel = host.channel
        if channel is None:
            return self._ask(remote(), timeout_s, host.node)
        request = pickle.dumps((op, args), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            got = channel.call(request, timeout_s)
        except TimeoutError as exc:
            if on_timeout is not None:
                on_timeout()
            raise HostError(
                f"node lost: {host.node} did not answer within {timeout_s:g} s"
            ) from exc
        except direct.Unreachable as exc:
            # Nothing was sent, and a failed connect is no proof the host died (a full listen
            # queue, no descriptor here): Ray, which knows, carries this call.
            log.warning("cluster: node %s: %s; this call through Ray", host.node, exc)
            return self._ask(remote(), timeout_s, host.node)
        except direct.ChannelBroken as exc:
            self._lose(host.node, f"node lost: {host.node}: its host's connection closed ({exc})")
            raise HostError(self._lost_reason(host.node)) from exc
        return _value(pickle.loads(got))

    def _lose(self, node: str, reason: str) -> None:
        with self._lock:
            host = self._hosts.get(node)
            if host is not None:
                host.lose(reason)

    def _lost_reason(self, node: str) -> str:
        with self._lock:
            host = self._hosts.get(node)
        return (host.lost if host else None) or f"node lost: {node}"

    def _pick(self, load: Callable[[Host], float]) -> Host:
        serving = self._serving()
        if not serving:
            raise HostError("node lost: no node of the cluster is serving")
        # Of hosts as loaded, one with a direct channel: its calls cost less.
        return min(serving, key=lambda h: (load(h), h.channel is None))

    # ---- SandboxBackend ---------------------------------------------------------------------

    @property
    def digest(self) -> str:
        assert self._digest is not None  # set by the first host, or the start failed
        return self._digest

    @property
    def default_environment(self) -> str | None:
        return self._default_environment

    @property
    def capacity(self) -> int:
        """Slots on the serving nodes, all told."""
        return sum(h.capacity for h in self._serving())

    def nodes(self) -> list[str]:
        """The serving nodes' ids."""
        return [h.node for h in self._serving()]

    def info(self) -> dict[str, Any]:
        return {"nodes": len(self._serving()), "cluster": self.address}

    def environment(self, name: str) -> str:
        host = self._pick(lambda h: h.running / h.capacity)
        # Asked before every run that names an environment: the direct channel when it can.
        digest: str = self._call(
            host, "environment", name, CALL_S, lambda: host.actor.environment.remote(name)
        )
        return digest

    def start(self, tenant: str | None, environment: str | None = None) -> None:
        """Nothing here: the host that takes the run starts its sandbox then."""

    def run(self, spec: RunSpec) -> RawRun:
        with self._lock:
            host = self._pick(lambda h: h.running / h.capacity)
            host.running += 1
        cancel = spec.cancel
        try:
            packed = wire.pack(spec)
            timeout_s = spec.limits.timeout_s + BACKSTOP_GRACE_S + MARGIN_S
            if cancel is not None:
                cancel.attach(lambda: self._cancel(host, spec.run_id))
            raw: RawRun = self._call(
                host,
                "run",
                packed,
                timeout_s,
                lambda: host.actor.run.remote(
                    pickle.dumps(packed, protocol=pickle.HIGHEST_PROTOCOL)
                ),
                on_timeout=lambda: self._cancel(host, spec.run_id),
            )
        finally:
            if cancel is not None:
                cancel.detach()
            with self._lock:
                host.running -= 1
        _deliver(raw, spec.on_stdout, spec.on_stderr)
        if spec.spool_dir is not None:
            _spool(raw, spec.spool_dir)
        return raw

    def _cancel(self, host: Host, run_id: str) -> None:
        """Tell `host` to end the run `run_id` (it is ended as it arrives, if it has not yet)."""
        if host.lost is not None:
            return
        try:
            host.actor.cancel.remote(run_id)
        except RayError:  # its node is gone, and the run with it
            pass

    def open_session(
        self,
        session_id: str,
        limits: Limits,
        env: Mapping[str, str],
        files: Sequence[tuple[str, bytes]],
        tenant: str | None,
        environment: str | None = None,
        network: Sequence[str] | None = None,
        on_network_limit: Callable[[str], None] | None = None,
        language: str = "python",
    ) -> RemoteSession:
        with self._lock:
            host = self._pick(lambda h: len(h.sessions) / h.capacity)
            host.sessions.add(session_id)
        try:
            ref = host.actor.open_session.remote(
                session_id, limits, dict(env), list(files), tenant, environment, network, language
            )
            self._ask(ref, HOST_START_S, host.node)
        except BaseException:
            with self._lock:
                host.sessions.discard(session_id)
            raise
        return RemoteSession(self, host, session_id, on_network_limit)

    def status(self) -> list[dict[str, Any]]:
        """Each node's `NodeHost.status`, and the nodes lost since this executor started."""
        rows = []
        with self._lock:
            hosts = list(self._hosts.values())
        for host in hosts:
            if host.lost is not None:
                rows.append({"node": host.node, "problem": host.lost})
                continue
            try:
                rows.append(self._ask_status(host))
            except HostError as exc:
                rows.append({"node": host.node, "problem": str(exc)})
        return rows

    def _ask_status(self, host: Host) -> dict[str, Any]:
        try:
            row: dict[str, Any] = ray.get(host.actor.status.remote(), timeout=CALL_S)
        except RayError as exc:
            raise HostError(f"node lost: {host.node}: {type(exc).__name__}") from exc
        return row

    def close(self) -> None:
        """Give back this executor's lease on each host (a host no other caller holds closes
        its sessions and zygotes, and its actor ends) and leave Ray."""
        self._closed.set()
        for thread in (getattr(self, "_watcher", None), self._keeper):
            if thread is not None:
                thread.join(CALL_S)  # a host the watcher is placing gets its lease back below
        with self._lock:
            everyone = list(self._hosts.values())
            hosts = [h for h in everyone if h.lost is None]
            self._hosts.clear()
        for host in everyone:
            if host.channel is not None:
                host.channel.close()
        self._leave([host.actor for host in hosts])
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False


def cluster_status(address: str) -> list[dict[str, Any]]:
    """Each alive node of the cluster at `address` with its host's status (a node without a
    host says so); it starts nothing."""
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
    try:
        rows: list[dict[str, Any]] = []
        for node in ray.nodes():
            if not node.get("Alive"):
                continue
            node_id = node["NodeID"]
            try:
                actor = ray.get_actor(host_name(node_id), namespace=NAMESPACE)
                row: dict[str, Any] = ray.get(actor.status.remote(), timeout=CALL_S)
            except ValueError:
                row = {"node": node_id, "problem": "no execbox host (no executor has used it)"}
            except RayError as exc:
                row = {"node": node_id, "problem": f"host not answering: {type(exc).__name__}"}
            row["address"] = node.get("NodeManagerAddress")
            rows.append(row)
        return rows
    finally:
        if started:
            ray.shutdown()


class RemoteSession:
    """A session's interpreter on a node's host (`SessionBackend` over Ray). Output reaches
    the callbacks when the cell ends; a host lost ends the session ("node lost")."""

    def __init__(
        self,
        backend: RayBackend,
        host: Host,
        session_id: str,
        on_network_limit: Callable[[str], None] | None,
    ) -> None:
        self._backend = backend
        self._host = host
        self.session_id = session_id
        self._on_network_limit = on_network_limit
        self._closed = False

    @property
    def node(self) -> str:
        return self._host.node

    def _call(self, op: str, args: tuple[Any, ...], timeout_s: float) -> Any:
        """`op(*args)` on the session's host, directly or through Ray."""
        host = self._host
        return self._ended_if_lost(
            lambda: self._backend._call(
                host, op, args, timeout_s, lambda: getattr(host.actor, op).remote(*args)
            )
        )

    def _ended_if_lost(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except HostError as exc:
            if str(exc).startswith("node lost"):
                raise SessionEnded(
                    {"status": "sandbox_error", "error": {"message": str(exc)}}
                ) from exc
            raise

    def cell(
        self,
        code: str,
        timeout_s: float,
        cpu_s: float,
        output_bytes: int,
        backstop_s: float,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> RawRun:
        args = (self.session_id, code, timeout_s, cpu_s, output_bytes, backstop_s)
        try:
            raw: RawRun = self._call("cell", args, backstop_s + MARGIN_S)
        except NetworkLimitPassed as exc:
            # The caller's session ends itself with status network_limit, as on one box.
            if self._on_network_limit is not None:
                self._on_network_limit(str(exc))
            raise HostError(str(exc)) from exc
        _deliver(raw, on_stdout, on_stderr)
        return raw

    def file_op(
        self, op: str, path: str = "", data: bytes | None = None
    ) -> tuple[dict[str, Any], bytes]:
        answer: tuple[dict[str, Any], bytes] = self._call(
            "file_op", (self.session_id, op, path, data), CALL_S
        )
        return answer

    def kill(self) -> None:
        try:
            self._host.actor.kill_session.remote(self.session_id)
        except RayError:  # the node is gone, and the session with it
            pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._backend._lock:
            self._host.sessions.discard(self.session_id)
        if self._host.lost is not None:
            return
        try:
            ray.get(self._host.actor.close_session.remote(self.session_id), timeout=CALL_S)
        except RayError as exc:
            log.warning("session %s: closing on %s: %s", self.session_id, self._host.node, exc)


def _value(answer: Answer) -> Any:
    """The value of a host's answer; its error raised again here."""
    kind, value = answer
    if kind == "ok":
        return value
    if kind == "SessionEnded":
        raise SessionEnded(value)
    if kind == "NetworkLimit":
        raise NetworkLimitPassed(value)
    raise ERRORS.get(kind, HostError)(value)


def _deliver(
    raw: RawRun, on_stdout: OutputCallback | None, on_stderr: OutputCallback | None
) -> None:
    """The run's output to the caller's callbacks, at its end (it ran on another machine)."""
    for callback, data in ((on_stdout, raw.stdout), (on_stderr, raw.stderr)):
        if callback is not None and data:
            callback(data)


def _spool(raw: RawRun, spool_dir: str) -> None:
    """Each artifact's bytes to `<spool_dir>/<index>`, as a local run spools them."""
    kept: list[bytes | None] = []
    for index, data in enumerate(raw.artifact_data):
        if data is not None:
            path = Path(spool_dir) / str(index)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        kept.append(None)
    raw.artifact_data = kept
