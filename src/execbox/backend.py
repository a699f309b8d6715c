"""The seam between the pipeline and the sandbox: what the executor asks a sandbox to do.

`SandboxBackend` is the interface; `LocalBackend` is the real one (this host's zygotes, run
slots and sessions, see `sandbox/host/`); `execbox.testing.FakeSandbox` answers from a test's
function. A backend turns a `RunSpec` into a `RawRun` and opens session channels; everything
around that (policy, budget, cache, redaction, records, admission) is the executor's, so it is
the same whichever backend runs the code.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from . import environments
from .cancel import Cancel
from .contract import MIB, Limits
from .errors import SandboxUnavailable, UsageError
from .hosts import Hosts
from .image import LIGHT_PRELOAD, Image
from .network.egress import RunEgress
from .network.proxy import EgressProxy, NetworkLimits
from .network.secrets import Binding
from .network.session import SessionNetwork
from .routing import DATA_STACK as DATA_STACK  # what zygotes preload: routing's tiers
from .routing import WARM_IMPORTS as WARM_IMPORTS
from .sandbox.host import capabilities, rootless
from .sandbox.host.errors import HostError, RunNotStarted
from .sandbox.host.pump import OutputCallback, RawRun
from .sandbox.host.zygotes import ZygoteProcess

if TYPE_CHECKING:
    from .sandbox.host.channel import SessionChannel

log = logging.getLogger(__name__)

BACKSTOP_GRACE_S = 15.0  # the supervisor enforces limits; this only catches a stuck supervisor
SLOT_WAIT_S = 30.0  # how long a run waits for a staged slot before it is a sandbox_error
# How many staged programs a request may find gone before its code (killed from outside: the
# machine's OOM killer, an operator) before it is a sandbox_error; none of them ran any of it.
NOT_STARTED_TRIES = 3
T = TypeVar("T")


@dataclass(frozen=True)
class RunSpec:
    """One run as the sandbox sees it: the request under the limits the policy and budget
    granted, and how its output and end reach the caller."""

    run_id: str
    code: str
    limits: Limits
    kind: str = "light"  # the slot kind (`routing.program_kind`)
    env: Mapping[str, str] | None = None
    files: Sequence[tuple[str, bytes]] = ()  # (name, bytes) of each input file
    stdin: bytes = b""
    tenant: str | None = None
    on_stdout: OutputCallback | None = None
    on_stderr: OutputCallback | None = None
    cancel: Cancel | None = None
    # With it, each artifact's bytes go to `<spool_dir>/<index>` and its RawRun data is None.
    spool_dir: str | None = None
    # The run's network allowlist (`RunRequest.network` entries); None: no network at all.
    network: Sequence[str] | None = None
    # Its secrets bound to hosts (`network.secrets.bind`): placeholders in, values at the proxy.
    bound: Sequence[Binding] = ()
    # The image digest of the environment it runs in (`SandboxBackend.environment`); None: the
    # default one.
    environment: str | None = None
    language: str = "python"  # `RunRequest.language`


class SessionBackend(Protocol):
    """A session's interpreter in a sandbox. Calls never overlap (the `Session` holds a lock);
    `kill` may come from any thread. A call on an interpreter that is gone raises
    `SessionEnded`; a failure of the sandbox itself raises `HostError`."""

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
        """Run one cell; the RawRun's meta carries `outputs`, and `ended` when the session
        ended with it."""
        ...

    def file_op(
        self, op: str, path: str = "", data: bytes | None = None
    ) -> tuple[dict[str, Any], bytes]:
        """One files API call (`write`, `read`, `list`, `remove`): (answer, bytes read)."""
        ...

    def kill(self) -> None:
        """End the session now, even mid-cell (the running cell returns)."""
        ...

    def close(self) -> None:
        """End the session; nothing of it runs when this returns."""
        ...


class SandboxBackend(Protocol):
    """Where the executor's runs and sessions run."""

    @property
    def digest(self) -> str:
        """What results and the cache key name as the environment the code ran in: the
        default environment's image digest."""
        ...

    @property
    def default_environment(self) -> str | None:
        """The name of the default environment (None: it has none)."""
        ...

    def environment(self, name: str) -> str:
        """The image digest of the environment named `name`, which a RunSpec or a session
        then names to run there; UsageError when no environment of that name is built."""
        ...

    def info(self) -> dict[str, Any]:
        """Facts for the executor's start-up log line (may be empty)."""
        ...

    def start(self, tenant: str | None, environment: str | None = None) -> None:
        """Have `tenant`'s sandbox in `environment` (a digest; None: the default) ready, started
        here if need be: SandboxUnavailable when it cannot be; called before a run waits for
        its turn."""
        ...

    def run(self, spec: RunSpec) -> RawRun:
        """Run `spec` to its end. What the code did is in the RawRun; a failure of the sandbox
        itself raises HostError."""
        ...

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
    ) -> SessionBackend:
        """A session's interpreter in `environment` (a digest; None: the default), ready for
        its first cell; HostError when it cannot start. `network`: its allowlist for the
        whole session (None: no network); past a network limit, `on_network_limit`.
        `language`: "python" (IPython) or "javascript" (a staged Node, see `session.js`)."""
        ...

    def close(self) -> None:
        """Stop everything the backend started."""
        ...


def rootless_options(allowed: frozenset[str]) -> dict[str, Any]:
    """The zygotes' rootless options: the delegated cgroup runs go in, or none when the
    caller accepted memory and pids unenforced; SandboxUnavailable when neither holds."""
    delegation = rootless.delegated_cgroup()
    refused = rootless.refusal(delegation, allowed)
    if refused:
        raise SandboxUnavailable(f"{refused}; see `execbox doctor`")
    held = [limit for limit in rootless.CGROUP_LIMITS if delegation.holds(limit)]
    if held and len(held) != len(rootless.CGROUP_LIMITS):
        # One cgroup serves both limits; half a delegation would lose the other silently.
        raise SandboxUnavailable(
            f"rootless mode: only {held[0]} is delegated ({delegation.missing}); delegate "
            "both memory and pids, or neither and accept both unenforced"
        )
    sub = rootless.subordinate()
    return {
        "cgroup_version": delegation.version if held else None,
        "cgroup_paths": delegation.paths if held else {},
        # Runs as a subordinate uid and gid (None: as the caller's own, the one mapped).
        "subordinate": None if sub is None else [sub.uid, sub.gid, sub.newuidmap, sub.newgidmap],
    }


class LocalBackend:
    """The sandbox on this host: zygote processes (one set shared, or one per tenant, replaced
    on a schedule, see `hosts`), their staged slots, sessions turned from slots. Each other
    environment a run names gets hosts of its own, started at its first run and closed once
    idle for `environment_idle_s`."""

    def __init__(
        self,
        *,
        image: Image | None,
        pool_size: int,
        rotate_after_runs: int | None,
        rotate_after_s: float | None,
        per_tenant: bool,
        tenant_idle_s: float | None,
        network_resolve: Mapping[str, str | Sequence[str]] | None = None,
        environment_idle_s: float | None = None,
        network_ca: str | None = None,
        allow_unenforced_limits: frozenset[str] = frozenset(),
    ) -> None:
        # Rootless mode: what the zygotes need to know (see `ZygoteProcess`); None as root.
        self._rootless: dict[str, Any] | None = None
        if rootless.is_rootless():
            self._rootless = rootless_options(allow_unenforced_limits)
        else:
            unprivileged = capabilities.unavailable_reason()
            if unprivileged:  # else the first run fails on a bare EPERM deep in the set-up
                raise SandboxUnavailable(f"{unprivileged}; see `execbox doctor`")
        self.image = image or Image.load()
        self.default_environment = _name_of(self.image.root)
        self.pool_size = pool_size
        # Started at the first run with a network allowlist; `network_resolve` pins names.
        try:
            self.egress_proxy = EgressProxy(network_resolve, network_ca)
        except ValueError as exc:
            raise UsageError(f"network_resolve: {exc}") from exc
        # The environments runs have named, by image digest (the default's included) and by
        # tree; a name rebuilt points at another tree, whose image is loaded then.
        self._images = {self.image.digest: self.image}
        self._by_root = {self.image.root: self.image}
        self.environment_names: dict[str, str] = {}  # digest -> the name it was asked by
        self._load_lock = threading.Lock()
        self.hosts = Hosts(
            self._start_host,
            rotate_after_runs=rotate_after_runs,
            rotate_after_s=rotate_after_s,
            per_tenant=per_tenant,
            tenant_idle_s=tenant_idle_s,
            environment_idle_s=environment_idle_s,
        )
        try:
            # A host per tenant starts at the tenant's first run; the shared one starts now,
            # so that a host that cannot sandbox says so here.
            self._info = {} if per_tenant else dict(self.hosts.get(None).info)
        except BaseException:
            self.hosts.close()
            raise

    @property
    def digest(self) -> str:
        return self.image.digest

    def info(self) -> dict[str, Any]:
        return self._info

    def environment(self, name: str) -> str:
        root = environments.lookup(name)
        image = self._by_root.get(root)
        if image is None:
            image = self._load(root)
        if image is not self.image:
            self.environment_names[image.digest] = name
        return image.digest

    def _load(self, root: Path) -> Image:
        """The image of the environment tree at `root`, its jail's C parts brought up to date
        (an environment built by an older execbox)."""
        with self._load_lock:
            image = self._by_root.get(root)
            if image is None:
                environments.refresh_native(root)
                image = Image.load(root)
                self._images.setdefault(image.digest, image)
                self._by_root[root] = image
            return image

    def _start_host(self, environment: str | None) -> ZygoteProcess:
        image = self.image if environment is None else self._images[environment]
        heavy, full = warm_tiers(image.root)
        try:
            return ZygoteProcess(
                image,
                heavy,
                list(LIGHT_PRELOAD),
                pool_size=self.pool_size,
                full_preload=full or None,
                rootless=self._rootless,
            )
        except HostError as exc:
            raise SandboxUnavailable(f"{exc}; see `execbox doctor`") from exc

    def _check_network(self) -> None:
        if self._rootless is not None:
            raise HostError(
                "network allowlists are not available in rootless mode: the egress proxy "
                "cannot enter the run's network namespace from outside its user namespace"
            )

    def start(self, tenant: str | None, environment: str | None = None) -> None:
        # The run's `take` checks the host's zygotes (and restarts a dead one): once a run.
        self.hosts.get(tenant, environment, check=False)

    def run(self, spec: RunSpec) -> RawRun:
        files = list(spec.files)
        limits = spec.limits
        network = None
        if spec.network is not None:
            self._check_network()
            caps = NetworkLimits(limits.network_bytes, limits.network_connections)
            valid_s = limits.timeout_s + BACKSTOP_GRACE_S
            network = RunEgress(self.egress_proxy, spec.network, caps, spec.bound, valid_s)
            files += network.files
        request = {
            "code": spec.code,
            "run_id": spec.run_id,
            "spec": sandbox_spec(spec.limits, spec.env or {}, files, spec.language),
        }

        def attempt() -> RawRun:
            host, slot = self.hosts.take(
                spec.tenant, spec.kind, SLOT_WAIT_S, environment=spec.environment
            )
            return host.execute(
                slot,
                request,
                files,
                spec.stdin,
                limits.output_bytes,
                limits.timeout_s + BACKSTOP_GRACE_S,
                spec.on_stdout,
                spec.on_stderr,
                spec.cancel,
                spec.spool_dir,
                network,
            )

        raw = until_started(f"run {spec.run_id}", attempt)
        if network is not None:
            raw.network_log, raw.network_limit = network.log, network.limit_message
        return raw

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
    ) -> SessionBackend:
        if (
            language == "python"
            and environment is not None
            and "IPython" not in environments.modules_of(self._images[environment].root)
        ):
            name = self.environment_names.get(environment, environment)
            raise UsageError(
                f"environment {name!r} has no IPython, which sessions run on: add ipython to "
                "its requirements and build it again (`execbox env build`)"
            )

        def attempt() -> SessionBackend:
            channel = self.hosts.open_session(tenant, SLOT_WAIT_S, environment, language)
            if network is None:
                spec = sandbox_spec(limits, env, files, language)
                channel.start(session_id, spec, list(files))
                return channel
            return self._with_network(
                channel, session_id, limits, env, files, network, on_limit, language
            )

        def on_limit(message: str) -> None:
            if on_network_limit is not None:
                on_network_limit(message)

        return until_started(f"session {session_id}", attempt)

    def _with_network(
        self,
        channel: SessionChannel,
        session_id: str,
        limits: Limits,
        env: Mapping[str, str],
        files: Sequence[tuple[str, bytes]],
        network: Sequence[str],
        on_limit: Callable[[str], None],
        language: str,
    ) -> SessionBackend:
        """Start `channel` with a listener in its namespace, served for the session's life."""
        self._check_network()
        caps = NetworkLimits(limits.network_bytes, limits.network_connections)
        egress = RunEgress(self.egress_proxy, network, caps)
        try:
            proxy_env = egress.open(channel.slot.sup_pidfd, on_limit)
        except OSError as exc:
            channel.close()
            raise HostError(f"network: cannot listen in the session's namespace: {exc}") from exc
        try:
            channel.start(
                session_id,
                sandbox_spec(limits, {**env, **proxy_env}, files, language),
                list(files),
            )
        except BaseException:
            egress.close()
            raise
        return SessionNetwork(channel, egress)

    def close(self) -> None:
        self.hosts.close()
        self.egress_proxy.close()


def warm_imports(tree: Path) -> list[str]:
    """The modules of WARM_IMPORTS whose top-level module the environment tree at `tree`
    has (its manifest's `modules`), in order."""
    found = environments.modules_of(tree)
    return [m for m in WARM_IMPORTS if m.split(".")[0] in found]


def warm_tiers(tree: Path) -> tuple[list[str], list[str]]:
    """What the heavy and the full zygote of the environment tree at `tree` preload: the heavy
    one its `warm_imports` of the data stack; the full one all of them, or nothing (no full
    zygote) when that is no more than the heavy one's, as in the default environment."""
    warm = warm_imports(tree)
    heavy = [m for m in warm if m in DATA_STACK]
    return heavy, (warm if warm != heavy else [])


def _name_of(root: Path) -> str | None:
    """The name of the environment whose tree is `root`, if one has it."""
    for name in dict.fromkeys([environments.default_name(), *environments.list_names()]):
        try:
            if environments.lookup(name) == root:
                return name
        except UsageError:
            continue
    return None


def sandbox_spec(
    limits: Limits,
    env: Mapping[str, str],
    files: Sequence[tuple[str, bytes]],
    language: str = "python",
) -> dict[str, Any]:
    """The sandbox's view of a run's limits, environment, inputs and language."""
    spec = {
        "timeout_s": limits.timeout_s,
        "cpu_s": limits.effective_cpu_s,
        "memory_bytes": limits.memory_mib * MIB,
        "pids": limits.pids,
        "disk_bytes": limits.disk_mib * MIB,
        "output_bytes": limits.output_bytes,
        "artifact_bytes": limits.artifact_bytes,
        "artifact_files": limits.artifact_files,
        "env": dict(env),
        "input_bytes": sum(len(data) for _, data in files),
        "input_count": len(files),
    }
    if language != "python":  # the default: a Python run's request stays as it was
        spec["language"] = language
    return spec


def until_started(what: str, attempt: Callable[[], T]) -> T:
    """`attempt()`, again while it finds its slot's program (or supervisor) gone before
    anything started (RunNotStarted: nothing ran, another slot may take it), at most
    NOT_STARTED_TRIES times in all; then a HostError."""
    for n in range(1, NOT_STARTED_TRIES + 1):
        try:
            return attempt()
        except RunNotStarted as exc:
            log.warning("%s: %s (try %d of %d)", what, exc, n, NOT_STARTED_TRIES)
            if n == NOT_STARTED_TRIES:
                raise HostError(f"{exc}, {n} times") from exc
    raise AssertionError("unreachable")
