"""`NodeHost`: the long-lived Ray actor on one cluster node that owns that node's sandbox.

It holds the node's `LocalBackend` (its zygotes, staged slots and sessions), the same one a
one-box `Executor` has; the caller's executor keeps the rest of the pipeline (policy, budget,
cache, redaction, records). A session is a channel in this actor's table, never an actor of
its own (an actor costs about 0.6 s and 48 MiB to start; a call on one about 0.9 ms).

This module imports no Ray: `cluster.backend` wraps the class with `ray.remote` when it places
one on a node. Every method answers with a plain tuple, `("ok", value)` or
`(error type name, message)`, so that no exception has to cross the wire pickled. A run and a
cell, the calls on the hot path, take and give that tuple as `pickle` bytes: Ray passes bytes
through as they are, where it would walk a dataclass with cloudpickle each way. Callers that
reach the node's address send them over a connection of their own instead (`direct`): the
same bytes, without Ray's call machinery on either side.

The host outlives any one caller: each executor that uses it holds a lease (`attach`), renewed
every second, and gives it back when it closes (`detach`). The host closes its sandbox when
the last lease is given back or has lapsed (a caller that died), so one caller closing never
ends another's runs or sessions.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..backend import LocalBackend, RunSpec, SessionBackend
from ..cancel import Cancel
from ..contract import Limits
from ..errors import SandboxUnavailable, UsageError
from ..sandbox.host.channel import SessionEnded
from ..sandbox.host.errors import HostError
from ..sandbox.host.pump import RawRun
from . import wire
from .direct import Listener, ray_tls

log = logging.getLogger(__name__)

# The error types a host's answer may name; the caller raises the same type.
Answer = tuple[str, Any]
LEASE_S = 30.0  # a caller that has not renewed its lease for this long is gone
CLOSED = "the host was closed"
# A cancel can pass its run on the way (it comes through Ray, the run may come directly):
# the ids of that many runs cancelled before they arrived are kept.
EARLY_CANCELS = 1024


class NodeHost:
    """One node's sandbox, serving the cluster's executors. Thread-safe: Ray runs its methods
    on a pool of threads (the actor's `max_concurrency`)."""

    def __init__(self, node: str, settings: Mapping[str, Any], address: str | None = None) -> None:
        """`address`: the node's address, where callers reach the host directly (None: only
        through Ray)."""
        self.node = node
        self.settings = dict(settings)  # the first caller's: a later one is told if its differ
        self.capacity = int(settings.get("max_concurrency") or 4 * (os.cpu_count() or 1))
        self._lock = threading.Lock()
        self._cancels: dict[str, Cancel] = {}
        self._early: OrderedDict[str, None] = OrderedDict()
        self._sessions: dict[str, SessionBackend] = {}
        self._limit_messages: dict[str, str] = {}
        self._running = 0
        self._runs = 0
        self._problem: str | None = None
        self._leases: dict[str, float] = {}  # caller -> when it last renewed its lease
        self._backend: LocalBackend | None = None
        try:
            self._backend = LocalBackend(
                image=None,
                pool_size=int(settings["pool_size"]),
                rotate_after_runs=settings.get("rotate_after_runs"),
                rotate_after_s=settings.get("rotate_after_s"),
                per_tenant=bool(settings.get("zygotes_per_tenant")),
                tenant_idle_s=settings.get("tenant_idle_s"),
                network_resolve=settings.get("network_resolve"),
                environment_idle_s=settings.get("environment_idle_s"),
                network_ca=settings.get("network_ca"),
                allow_unenforced_limits=frozenset(settings.get("allow_unenforced_limits", ())),
            )
        except (SandboxUnavailable, UsageError) as exc:  # said by `ready`, not a dead actor
            self._problem = f"{type(exc).__name__}: {exc}"
        self._listener: Listener | None = None
        if address is not None and ray_tls(os.environ):
            log.info("node host %s: Ray uses TLS; no direct channel (it has none)", node)
            address = None
        if address is not None and self._backend is not None:
            try:
                self._listener = Listener(address, self._direct)
            except OSError as exc:  # callers use Ray's calls then
                log.warning("node host %s: no direct channel on %s: %s", node, address, exc)
        self._stop = threading.Event()
        threading.Thread(target=self._expire, name="execbox-leases", daemon=True).start()

    def _expire(self) -> None:
        """Drop the leases that lapsed (callers that died); with none left, close the sandbox."""
        while not self._stop.wait(LEASE_S / 3):
            now = time.monotonic()
            with self._lock:
                held = bool(self._leases)
                for caller, renewed in list(self._leases.items()):
                    if now - renewed > LEASE_S:
                        del self._leases[caller]
                lapsed = held and not self._leases
            if lapsed:
                log.warning("node host %s: every caller's lease lapsed; closing", self.node)
                self.close()

    def _local(self) -> LocalBackend:
        if self._backend is None:
            raise SandboxUnavailable(f"node {self.node}: {self._problem}")
        return self._backend

    def ready(self, caller: str) -> Answer:
        """The node's facts once its sandbox is up, or why it cannot sandbox; `caller` holds a
        lease on this host from now on (a closed host says so: the caller starts another)."""
        if not self.attach(caller):
            return ("HostError", f"node {self.node}: {CLOSED}")
        return _answer(
            lambda: {
                "node": self.node,
                "capacity": self.capacity,
                "settings": self.settings,
                "digest": self._local().digest,
                "default_environment": self._local().default_environment,
                "info": self._local().info(),
                "direct": self._direct_address(),
            }
        )

    def _direct_address(self) -> tuple[str, int, bytes] | None:
        listener = self._listener
        return None if listener is None else (*listener.address, listener.token)

    def _direct(self, frame: bytes) -> bytes:
        """A call that came over the direct channel: `(op, args)` pickled, its answer pickled."""
        op, args = pickle.loads(frame)
        if op == "run":
            answer = self._run(wire.unpack(args))
        elif op == "cell":
            answer = self._cell(*args)
        elif op == "file_op":
            answer = self.file_op(*args)
        elif op == "environment":
            answer = self.environment(args)
        elif op == "ping":
            answer = ("ok", self.node)
        else:
            answer = ("HostError", f"no such call: {op!r}")
        return pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)

    def environment(self, name: str) -> Answer:
        return _answer(lambda: self._local().environment(name))

    def attach(self, caller: str) -> bool:
        """Take or renew `caller`'s lease; False when the host is closed (the caller places a
        new one)."""
        with self._lock:
            if self._backend is None and self._problem == CLOSED:
                return False
            self._leases[caller] = time.monotonic()
            return True

    def detach(self, caller: str) -> bool:
        """Give back `caller`'s lease (and any that lapsed); with none left the host closes
        (True: the caller may end the actor)."""
        now = time.monotonic()
        with self._lock:
            self._leases.pop(caller, None)
            for other, renewed in list(self._leases.items()):
                if now - renewed > LEASE_S:
                    del self._leases[other]
            last = not self._leases
        if last:
            self.close()
        return last

    def run(self, packed: bytes) -> bytes:
        """Run the pickled `wire.pack` of a RunSpec here: the pickled answer, its RawRun's
        metrics naming this node."""
        return pickle.dumps(
            self._run(wire.unpack(pickle.loads(packed))), protocol=pickle.HIGHEST_PROTOCOL
        )

    def _run(self, spec: RunSpec) -> Answer:
        cancel = Cancel()
        with self._lock:
            if spec.run_id in self._early:
                del self._early[spec.run_id]
                cancel.cancel()
            self._cancels[spec.run_id] = cancel
            self._running += 1

        def run() -> RawRun:
            backend = self._local()
            backend.start(spec.tenant, spec.environment)
            raw = backend.run(replace(spec, cancel=cancel))
            raw.meta.setdefault("metrics", {})["node"] = self.node
            return raw

        try:
            return _answer(run)
        finally:
            with self._lock:
                del self._cancels[spec.run_id]
                self._running -= 1
                self._runs += 1

    def cancel(self, run_id: str) -> None:
        """End the run `run_id` if it is in flight here (a run not started yet is ended as it
        starts: its token stays cancelled)."""
        with self._lock:
            cancel = self._cancels.get(run_id)
            if cancel is None:
                self._early[run_id] = None
                while len(self._early) > EARLY_CANCELS:
                    self._early.popitem(last=False)
        if cancel is not None:
            cancel.cancel()

    def open_session(
        self,
        session_id: str,
        limits: Limits,
        env: Mapping[str, str],
        files: Sequence[tuple[str, bytes]],
        tenant: str | None,
        environment: str | None,
        network: Sequence[str] | None,
        language: str = "python",
    ) -> Answer:
        def on_limit(message: str) -> None:  # the proxy's thread: the caller's session says so
            self._limit_messages[session_id] = message
            channel = self._sessions.get(session_id)
            if channel is not None:
                channel.kill()

        def open_() -> None:
            backend = self._local()
            backend.start(tenant, environment)
            channel = backend.open_session(
                session_id, limits, env, files, tenant, environment, network, on_limit, language
            )
            with self._lock:
                self._sessions[session_id] = channel

        return _answer(open_)

    def cell(self, session_id: str, *args: Any) -> bytes:
        """One cell of a session here: `SessionBackend.cell`'s arguments, no callbacks; the
        pickled answer."""
        return pickle.dumps(self._cell(session_id, *args), protocol=pickle.HIGHEST_PROTOCOL)

    def _cell(self, session_id: str, *args: Any) -> Answer:
        channel = self._session(session_id)
        if channel is None:
            return ("SessionEnded", {"error": {"message": "the session is not on this node"}})
        with self._lock:
            self._running += 1
        try:
            answer = _answer(lambda: _with_node(channel.cell(*args), self.node))
        finally:
            with self._lock:
                self._running -= 1
        if answer[0] == "HostError" and session_id in self._limit_messages:
            return ("NetworkLimit", self._limit_messages[session_id])
        return answer

    def file_op(self, session_id: str, op: str, path: str, data: bytes | None) -> Answer:
        channel = self._session(session_id)
        if channel is None:
            return ("SessionEnded", {"error": {"message": "the session is not on this node"}})
        return _answer(lambda: channel.file_op(op, path, data))

    def kill_session(self, session_id: str) -> None:
        channel = self._session(session_id)
        if channel is not None:
            channel.kill()

    def close_session(self, session_id: str) -> None:
        with self._lock:
            channel = self._sessions.pop(session_id, None)
            self._limit_messages.pop(session_id, None)
        if channel is not None:
            channel.close()

    def _session(self, session_id: str) -> SessionBackend | None:
        with self._lock:
            return self._sessions.get(session_id)

    def status(self) -> dict[str, Any]:
        """What `execbox cluster status` shows of this node."""
        with self._lock:
            return {
                "node": self.node,
                "slots": self.capacity,
                "running": self._running,
                "runs": self._runs,
                "sessions": len(self._sessions),
                "load": round(self._running / self.capacity, 3),
                "callers": len(self._leases),
                "problem": self._problem,
            }

    def close(self) -> None:
        """End every session and stop the node's sandbox: nothing of it runs afterwards."""
        with self._lock:
            channels = list(self._sessions.values())
            self._sessions.clear()
        for channel in channels:
            channel.close()
        if self._listener is not None:
            self._listener.close()
        self._stop.set()
        with self._lock:
            backend, self._backend = self._backend, None
            self._problem = CLOSED
        if backend is not None:
            backend.close()


def _with_node(raw: RawRun, node: str) -> RawRun:
    raw.meta.setdefault("metrics", {})["node"] = node
    return raw


def _answer(call: Callable[[], Any]) -> Answer:
    """`call()` as an answer: its value, or the error the caller raises again."""
    try:
        return ("ok", call())
    except SessionEnded as exc:
        return ("SessionEnded", exc.meta)
    except (HostError, SandboxUnavailable, UsageError) as exc:
        return (type(exc).__name__, str(exc))
    except Exception as exc:  # a bug here: the caller's run says so rather than hanging
        log.exception("node host call failed")
        return ("HostError", f"{type(exc).__name__}: {exc}")
