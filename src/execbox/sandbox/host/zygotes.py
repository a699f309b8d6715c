"""The zygote processes: the three fork servers in the runtime image's interpreter, started
and stopped from here, and the host's entry points for one run (`execute`) and one session
(`open_session`) in the slots their pool keeps staged."""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ...image import ENV_DIR, FS_TYPE, PACKAGE_DIR
from ..inside import protocol
from ..inside.cgroup import CgroupUnavailable, Hierarchy
from ..inside.jail import RUN_UID, UID_FIRST
from . import loop
from .errors import HostError
from .pool import SLOT_KINDS, SlotPool
from .pump import OutputCallback, RawRun, RunPump
from .slot import Slot, readable

if TYPE_CHECKING:
    from ...cancel import Cancel
    from ...image import Image
    from .channel import SessionChannel

# The options arrive on the socket, not in argv: a run can read /proc/self/cmdline, and host
# paths are none of its business.
_BOOT = (
    "import json, socket, sys; sock = socket.socket(fileno=int(sys.argv[1])); "
    "opts = json.loads(sock.recv(1 << 20)); sys.path.insert(0, opts['src_paths'][0]); "
    "from execbox.sandbox.inside.zygote import main; main(sock, opts)"
)

log = logging.getLogger(__name__)

# Of program zygote: standard library only; the data stack too; and, in an environment whose
# tree has more (`backend.warm_tiers`), the full one: those modules too, started at its first run.
# The javascript and bash ones stage Node and bash processes (see `inside.staged`), each
# started at the first run of its language: a host that runs only Python starts neither.
KINDS = ("light", "heavy", "full", "javascript", "bash")
INTERPRETER_KINDS = ("javascript", "bash")
_NO_PROGRAM = {k: f"this sandbox host has no {k} zygote" for k in KINDS}
SUPERVISORS_END_S = 10.0  # how long `close` waits for the supervisors it let go to exit
CANCELLED = "cancelled"  # the KILL reason of a run its caller cancelled (see `Cancel`)
NETWORK_LIMIT = "network_limit"  # the KILL reason of a run past a network limit
# A request this soon after its slot's program got ready finds the slot in demand (see
# `inside.supervisor.Zygote`). Read when a host starts: a test widens it to make "in demand" sure.
DEMAND_S = 0.002


@dataclass
class _Late:
    """A program zygote that says hello after the host is ready (the heavy and full ones)."""

    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None
    final: bool = False  # its failure would repeat: not a death that a new host mends


class ZygoteProcess:
    """The running fork servers in the runtime image's interpreter (see `zygote`): one that
    forks supervisors and init, and the ones that fork only programs, a light one (standard
    library), a heavy one (the data stack imported) and, when `full_preload` is given, a full
    one (those and the rest of the environment's warm imports), started at the first run of
    a "full" slot: a numpy run forks the smaller heavy zygote, which costs less to fork."""

    def __init__(
        self,
        image: Image,
        preload: list[str],
        light_preload: list[str] | None = None,
        ready_timeout_s: float = 60.0,
        pool_size: int = 4,
        full_preload: list[str] | None = None,
        rootless: dict[str, Any] | None = None,
    ) -> None:
        import execbox

        # Every zygote starts in a mount namespace of its own, with the image and execbox's
        # package at fixed paths (see `native/enter.c`): what it forks shows no host path.
        # Rootless (`rootless` given: the zygotes' cgroup options), all of them in one user
        # namespace, with a /run of their own, the image's tree bound (no loop device).
        self._device: loop.LoopDevice | None = None
        self._rootless = rootless
        self._namespaces: _Namespaces | None = None
        program = str(image.libexec / "execbox-enter")
        keep: list[int] = []
        if rootless is None:
            for mount_point in (ENV_DIR, f"{PACKAGE_DIR}/execbox"):
                os.makedirs(mount_point, 0o755, exist_ok=True)
            self._device = loop.attach(image.fs_image)
            enter = [program, self._device.path, FS_TYPE]
        else:
            self._namespaces = _Namespaces(program, rootless.get("subordinate"))
            keep = self._namespaces.fds
            enter = [program, "--userns", *map(str, keep), str(image.root), "bind"]
        enter += [
            ENV_DIR,
            str(Path(execbox.__file__).resolve().parent),
            f"{PACKAGE_DIR}/execbox",
            f"{ENV_DIR}/bin/{image.python.name}",
        ]
        env = image.zygote_env()
        # Supervisors ask a program zygote for their programs on one of these pairs: one end
        # is the program zygote's, the other the supervisors' zygote's (and so every
        # supervisor's).
        kinds = [k for k in KINDS if k != "full" or full_preload]
        pairs = {kind: socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for kind in kinds}
        self._programs = frozenset(kinds)
        # Slots of "full" kind in a host without it run in heavy slots: there the heavy zygote
        # preloads everything the environment warms.
        self._kind_of = {} if full_preload else {"full": "heavy"}
        # The program zygotes not started yet, by kind: how to start each.
        self._dormant: dict[str, tuple[Callable[[], _Starting], socket.socket]] = {}
        self._dormant_lock = threading.Lock()
        self.full_pid: int | None = None
        common: dict[str, Any] = {
            "ro_paths": [ENV_DIR],
            "src_paths": [PACKAGE_DIR],
            "libexec": f"{ENV_DIR}/libexec",
        }
        if rootless is not None:
            common["rootless"] = rootless
        preloads = {"heavy": preload, "light": light_preload or [], "full": full_preload or []}
        preloads.update({kind: [] for kind in INTERPRETER_KINDS})

        def starter(kind: str) -> Callable[[], _Starting]:
            prog = pairs[kind][0]
            return lambda: _Starting(
                enter,
                env if kind in ("heavy", "full") else _small_heap(env),
                dict(
                    common,
                    role="programs",
                    # The full zygote trains as the heavy one does: its programs are theirs
                    # with more imported.
                    kind="heavy" if kind == "full" else kind,
                    preload=preloads[kind],
                    spawn_fd=prog.fileno(),
                ),
                [prog],
                keep,
            )

        self._starting: dict[str, _Starting] = {}
        try:
            # All start at once: the heavy one's imports are most of the wait.
            for kind in ("heavy", "light"):
                self._starting[kind] = starter(kind)()
            for kind in ("full", *INTERPRETER_KINDS):
                if kind in pairs:
                    self._dormant[kind] = (starter(kind), pairs[kind][0])
            sup_ends = [pairs[kind][1] for kind in kinds]
            self._starting["supervisors"] = _Starting(
                enter,
                env,
                dict(
                    common,
                    role="supervisors",
                    preload=[],
                    demand_s=DEMAND_S,
                    spawn_fds={k: pairs[k][1].fileno() for k in kinds},
                ),
                sup_ends,
                keep,
            )
        except BaseException:
            self.close()
            raise
        finally:
            dormant = {prog.fileno() for _, prog in self._dormant.values()}
            for pair in pairs.values():
                for end in pair:
                    if end.fileno() not in dormant:  # a dormant zygote's end, kept to start it
                        end.close()
        # The light and the supervisors' zygotes are ready at once, the heavy one much later
        # (numpy, pandas, matplotlib, its training): the host is ready without it, its
        # slots are staged meanwhile, and what runs there waits for it (`wait_heavy`).
        infos = {
            name: z.ready(ready_timeout_s) for name, z in self._starting.items() if name != "heavy"
        }
        failed = [(name, info) for name, info in infos.items() if not info.get("ready")]
        if failed:
            self.close()
            name, info = failed[0]
            raise HostError(f"the zygote ({name}) failed to start: {info.get('error')}")
        sup = self._starting["supervisors"]
        if self._device is not None:
            loop.keep_mounted(image.fs_image, sup.proc.pid)
        self._proc, self._sock = sup.proc, sup.sock
        self.heavy_pid = self._starting["heavy"].proc.pid
        self.light_pid = self._starting["light"].proc.pid
        # The heavy zygote's entries (preloaded, heavy_startup_ms, its warm pages) are added
        # once it is ready: read them after `wait_heavy`.
        self.info: dict[str, Any] = dict(
            infos["supervisors"],
            light_preloaded=infos["light"]["preloaded"],
            startup_ms=max(info["startup_ms"] for info in infos.values()),
            warm_pages={"light": infos["light"].get("warm_pages", 0)},
            warm_base_pages={"light": infos["light"].get("warm_base_pages", 0)},
        )
        self._warn_no_warm_pages("light", infos["light"])
        self._ready_timeout_s = ready_timeout_s
        self._late = {"heavy": _Late()}
        self._prefix = f"x{os.getpid()}-{infos['supervisors']['pid']}-"
        try:
            self._hierarchy().sweep_orphans()
        except OSError:
            pass
        self._counter = itertools.count()
        self._closed = False
        self.started_at = time.monotonic()
        self._close_lock = threading.Lock()  # a second `close` waits for the first to end
        self._close_done = False
        # While `close` runs: the supervisors of the slots it lets go, to wait for.
        self._ending: list[int] | None = None
        self._ending_lock = threading.Lock()
        self.pool = SlotPool(
            self, pool_size, [k for k in SLOT_KINDS if protocol.SLOT_KINDS[k][0] in self._dormant]
        )
        self._await_late("heavy")

    def _hierarchy(self) -> Hierarchy:
        """Where this host's supervisors make run cgroups, for removing those they left:
        rootless, the delegated cgroup (CgroupUnavailable with none)."""
        if self._rootless is None:
            return Hierarchy.discover()
        if self._rootless["cgroup_version"] is None:
            raise CgroupUnavailable("rootless mode without a cgroup")
        return Hierarchy.delegated(self._rootless["cgroup_version"], self._rootless["cgroup_paths"])

    def _await_late(self, kind: str) -> None:
        """Read the hello of the program zygote of `kind` in a thread of its own."""
        threading.Thread(
            target=self._await, args=(kind,), name=f"execbox-{kind}-start", daemon=True
        ).start()

    def _await(self, kind: str) -> None:
        """The hello of the `kind` program zygote (heavy or full), read in the background. Its
        slots are no longer staged and what needs it fails with its error when it did not
        start. A zygote that said why it failed, or hung (it is killed), would do the same
        again: that is final for this host. One that died (killed, crashed) is a zygote death
        like any other: the next call starts a new host (see `alive`)."""
        late, zygote = self._late[kind], self._starting[kind]
        try:
            info = zygote.ready(self._ready_timeout_s)
            if not info.get("ready"):
                late.final = not info.get("died")
                raise HostError(str(info.get("error")))
            if kind == "heavy":
                self.info.update(preloaded=info["preloaded"], heavy_startup_ms=info["startup_ms"])
            else:
                self.info.update(
                    {
                        f"{kind}_preloaded": info["preloaded"],
                        f"{kind}_startup_ms": info["startup_ms"],
                    }
                )
            self.info["warm_pages"][kind] = info.get("warm_pages", 0)
            self.info["warm_base_pages"][kind] = info.get("warm_base_pages", 0)
            self._warn_no_warm_pages(kind, info)
        except Exception as exc:  # noqa: BLE001 - whatever it was, its runs must learn it
            why = "the sandbox host was closed" if self._closed else str(exc)
            late.error = f"the zygote ({kind}) failed to start: {why}"
            if not self._closed:
                log.error("%s", late.error)
                if late.final:
                    zygote.kill()
                self.pool.drop_kinds([k for k in SLOT_KINDS if self.kind_error(k)])
        finally:
            late.done.set()

    def kind_error(self, slot_kind: str) -> str | None:
        """Why slots of `slot_kind` cannot run (their program zygote failed to start, or this
        host has none), or None."""
        program = protocol.SLOT_KINDS[slot_kind][0]
        if program not in self._programs:
            return _NO_PROGRAM[program]
        late = self._late.get(program)
        return late.error if late is not None else None

    def take(self, kind: str, timeout_s: float) -> Slot:
        """A staged slot of `kind` for a run (see `SlotPool.take`); the first of a kind whose
        program zygote has not started yet starts it, and waits for it."""
        kind = self._kind_of.get(kind, kind)
        if self._dormant:
            self.start_program(protocol.SLOT_KINDS[kind][0])
        return self.pool.take(kind, timeout_s)

    def start_program(self, kind: str) -> None:
        """Start the program zygote of `kind` if it has not started yet (its slots are staged
        from then on); a no-op for one started, or one this host does not have."""
        with self._dormant_lock:
            if self._closed or kind not in self._dormant:
                return
            start, prog = self._dormant.pop(kind)
            late = self._late[kind] = _Late()
            try:
                zygote = start()
            except Exception as exc:  # noqa: BLE001 - its runs must learn it, not wait
                late.error, late.final = f"the zygote ({kind}) failed to start: {exc}", True
                late.done.set()
                log.error("%s", late.error)
                return
            finally:
                prog.close()  # the zygote has its own copy now
            self._starting[kind] = zygote
            if kind == "full":
                self.full_pid = zygote.proc.pid
        self._await_late(kind)
        self.pool.stage_kind(kind)

    def started_programs(self) -> list[str]:
        """The program zygotes started so far (the dormant ones not), by kind."""
        return list(self._starting.keys() - {"supervisors"})

    @staticmethod
    def _warn_no_warm_pages(kind: str, info: dict[str, Any]) -> None:
        if "warm_error" in info:
            log.warning(
                "the %s program zygote learned no warm pages (its programs copy each "
                "page as they first write it): %s",
                kind,
                info["warm_error"],
            )

    def wait_heavy(self, timeout_s: float | None = None) -> None:
        """Wait until the heavy zygote serves (numpy and pandas runs and sessions have their
        programs there); HostError when it failed to start, or was not ready in `timeout_s`
        (by default the zygotes' start-up limit)."""
        self.wait_program("heavy", timeout_s)

    def wait_program(self, kind: str, timeout_s: float | None = None) -> None:
        """Wait until the started program zygote of `kind` serves (see `wait_heavy`)."""
        wait_s = self._ready_timeout_s + 1.0 if timeout_s is None else timeout_s
        late = self._late[kind]
        if not late.done.wait(wait_s):
            raise HostError(f"the {kind} zygote was not ready within {wait_s:g} s")
        if late.error is not None:
            raise HostError(late.error)

    def heavy_ready(self) -> bool:
        """Whether the heavy zygote has started and serves (`wait_heavy` would not wait)."""
        return self.program_ready("heavy")

    def program_ready(self, kind: str) -> bool:
        """Whether the program zygote of `kind` has started and serves."""
        late = self._late.get(kind)
        return late is not None and late.done.is_set() and late.error is None

    @property
    def slot_prefix(self) -> str:
        """The prefix of this host's slot cgroup names."""
        return self._prefix

    @property
    def pid(self) -> int:
        """The supervisors' zygote: the parent of every supervisor."""
        return self._proc.pid

    def alive(self) -> bool:
        """Whether every zygote started still runs; a program zygote whose failed start is
        final is not counted (see `_await`)."""
        for name, z in tuple(self._starting.items()):
            late = self._late.get(name)
            if late is not None and late.error is not None:
                if late.final:
                    continue
                return False  # it died starting (its process may not be reaped yet)
            if z.proc.poll() is not None:
                return False
        return True

    @property
    def taken(self) -> int:
        """How many runs and sessions this host has been asked for (its slots taken)."""
        return self.pool.taken

    @property
    def retired(self) -> bool:
        return self.pool.retired

    @property
    def closed(self) -> bool:
        """Whether `close` has ended: nothing of this host runs any more."""
        return self._close_done

    def in_use(self) -> int:
        """Runs in flight plus sessions open on this host."""
        return self.pool.in_use()

    def retire(self) -> None:
        """Serve no new runs or sessions (takers get HostRetired) and close, in a thread of
        its own, once the runs in flight and the sessions open here have ended: the
        replacement of a host is never on a run's path. Runs and sessions keep their host."""
        self.pool.retire()
        threading.Thread(
            target=self._close_when_drained, name="execbox-retire", daemon=True
        ).start()

    def _close_when_drained(self) -> None:
        self.pool.drained.wait()
        self.close()

    def start_slot(self, kind: str) -> Slot:
        """Ask for a new supervisor; it builds its slot and stages a run of `kind` (the pool
        reads its RDY, see `Slot.read_staging`). Raises HostError when the zygote is gone."""
        if self._closed:
            raise HostError("the sandbox host is closed")
        name = f"{self._prefix}{next(self._counter)}"
        ctrl, ctrl_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            socket.send_fds(self._sock, [f"{name} {kind}".encode()], [ctrl_child.fileno()])
        except OSError as exc:
            ctrl.close()
            raise HostError(f"the zygote is gone: {exc}") from exc
        finally:
            ctrl_child.close()
        return Slot(name, kind, ctrl)

    def open_session(self, slot_wait_s: float, language: str = "python") -> SessionChannel:
        """A staged slot, to be started as a session (see `channel`): a heavy one for
        Python (IPython on the data stack), a staged Node for JavaScript."""
        from .channel import SessionChannel

        if language == "javascript":
            self.start_program("javascript")
            kind = "javascript"
        else:
            self.wait_heavy()
            kind = "heavy"
        slot = self.pool.take(kind, slot_wait_s, session=True)
        return SessionChannel(slot, self._release)

    def _release(self, slot: Slot) -> None:
        """A slot back from a run: staged again for the next one when the run ended cleanly,
        else closed (its supervisor tears it down, or is dead and we remove its cgroup)."""
        if slot.reusable and not self._closed and self.pool.recycle(slot):
            return
        self.forget(slot)
        self.pool.discard(slot)

    def await_at_close(self, slot: Slot) -> None:
        """While `close` runs: wait for `slot`'s supervisor too before it returns."""
        with self._ending_lock:
            if self._ending is not None and slot.sup_pidfd >= 0:
                try:
                    self._ending.append(os.dup(slot.sup_pidfd))
                except OSError:  # its caller has just closed it: nothing left to wait for
                    pass

    def forget(self, slot: Slot) -> None:
        self.await_at_close(slot)
        if slot.killed:
            # A killed supervisor could not remove its cgroup: once it is gone, we do.
            slot.wait_gone(5.0)
            try:
                self._hierarchy().remove_named(slot.name)
            except OSError:
                pass
        slot.close()

    def unused_slot_names(self) -> set[str]:
        """Cgroup names of the slots that run nothing now: staged, or being staged."""
        return self.pool.unused_names()

    def execute(
        self,
        slot: Slot,
        request: dict[str, Any],
        files: list[tuple[str, bytes]],
        stdin: bytes,
        output_bytes: int,
        backstop_s: float,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        cancel: Cancel | None = None,
        spool_dir: str | None = None,
        network: SlotNetwork | None = None,
    ) -> RawRun:
        """Run one request in a staged slot (given back to the pool here); raises HostError
        for failures of the sandbox itself. `cancel` can end the run from another thread.
        With `spool_dir`, each artifact's bytes are written to `<spool_dir>/<index>` (mode
        0600) as they arrive instead of being held in memory."""
        try:
            program = protocol.SLOT_KINDS[slot.kind][0]
            if program != "light":
                self.wait_program(program)
            if network is not None:
                request = with_network(slot, request, network)
            go, go_lost = slot.send_request(request, files)
            pump = RunPump(
                slot,
                go,
                stdin,
                output_bytes,
                on_stdout,
                on_stderr,
                max_frame=protocol.MAX_JSON + int(request["spec"]["artifact_bytes"]),
                spool_dir=spool_dir,
                go_lost=go_lost,
            )
            if cancel is not None:
                cancel.attach(lambda: slot.end_run(CANCELLED))
            return pump.run(time.monotonic() + backstop_s)
        finally:
            if cancel is not None:
                cancel.detach()  # before the slot can serve another run
            try:
                if network is not None:
                    network.close()  # its listener and connections, before another run's code
            except BaseException as exc:
                slot.reusable = False  # its listener may be open still: it serves no other run
                if isinstance(exc, OSError):  # a proxy that did not close in time, say
                    raise HostError(f"network: closing the run's proxy: {exc}") from exc
                raise
            finally:
                self._release(slot)

    def close(self) -> None:
        """Stop the zygotes; staged slots are released, and their supervisors (with their
        init and staged program) have exited when this returns, within SUPERVISORS_END_S.
        Runs in flight end with their caller. A second call waits for the first."""
        with getattr(self, "_close_lock", threading.Lock()):
            if getattr(self, "_close_done", False):
                return
            self._close()
            self._close_done = True

    def _close(self) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None:
            with self._ending_lock:
                self._ending = []
            pool.close()
        with getattr(self, "_dormant_lock", threading.Lock()):
            self._closed = True
            for _, prog in getattr(self, "_dormant", {}).values():
                prog.close()
        for z in tuple(getattr(self, "_starting", {}).values()):
            z.stop()
        if pool is not None:
            with self._ending_lock:
                ending, self._ending = self._ending or [], None
            deadline = time.monotonic() + SUPERVISORS_END_S
            for pidfd in ending:
                try:
                    readable(pidfd, max(0.0, deadline - time.monotonic()))
                finally:
                    os.close(pidfd)
        device = getattr(self, "_device", None)
        if device is not None:
            device.close()  # the zygotes' mounts hold it for as long as they are needed
        namespaces = getattr(self, "_namespaces", None)
        if namespaces is not None:
            namespaces.close()  # whatever of the zygotes' pid namespace is left ends here
        prefix = getattr(self, "_prefix", None)
        if prefix:
            try:
                self._hierarchy().sweep(prefix)
            except OSError:
                pass


class SlotNetwork(Protocol):
    """A run's network (`execbox.network.egress.RunEgress`): a listener in the slot's
    network namespace, closed before the slot serves another run."""

    def open(self, pidfd: int, on_limit: Callable[[str], None]) -> dict[str, str]: ...

    def close(self) -> None: ...


def with_network(slot: Slot, request: dict[str, Any], network: SlotNetwork) -> dict[str, Any]:
    """`request` with the proxy's variables in its environment, the listener made in the
    network namespace the slot's staged run has (its supervisor's)."""
    try:
        env = network.open(slot.sup_pidfd, lambda _why: slot.end_run(NETWORK_LIMIT))
    except OSError as exc:
        raise HostError(f"network: cannot listen in the run's namespace: {exc}") from exc
    spec = request["spec"]
    return {**request, "spec": {**spec, "env": {**spec["env"], **env}}}


def _small_heap(env: dict[str, str]) -> dict[str, str]:
    """A small interpreter forks faster with Python's own allocator: the huge pages that make
    copying the heavy one's page tables cheap cost a split of a 2 MiB page at the first write
    to each in a child, which a small heap does not win back."""
    return {k: v for k, v in env.items() if k not in ("PYTHONMALLOC", "GLIBC_TUNABLES")}


class _Namespaces:
    """Rootless mode: a user namespace in which UID_FIRST is mapped to this process's uid (its
    gid likewise), and in it a pid namespace, made and held by `execbox-enter --hold-userns`;
    every zygote joins both. With `subordinate` ([uid, gid, newuidmap, newgidmap]) RUN_UID is
    mapped too, to that subordinate uid and gid, by those tools. `close` ends the pid
    namespace's init, and with it every process of the namespace. HostError when they cannot
    be made."""

    def __init__(self, enter: str, subordinate: list[Any] | None = None) -> None:
        hold = (
            ["--hold-userns-mapped"]
            if subordinate
            else ["--hold-userns", str(UID_FIRST), str(UID_FIRST)]
        )
        self.holder = subprocess.Popen(
            [enter, *hold],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.fds: list[int] = []
        assert self.holder.stdout is not None
        try:
            if subordinate:
                self._map(subordinate)
            said = self.holder.stdout.readline().split()
            if len(said) != 2 or said[0] != b"ready":
                raise HostError(f"rootless mode: {self._error()}")
            for name in ("user", "pid"):
                self.fds.append(os.open(f"/proc/{int(said[1])}/ns/{name}", os.O_RDONLY))
        except BaseException:
            self.close()
            raise

    def _map(self, subordinate: list[Any]) -> None:
        """Map the holder's ids: ours to UID_FIRST, the subordinate ones to RUN_UID."""
        assert self.holder.stdout is not None and self.holder.stdin is not None
        said = self.holder.stdout.readline().split()
        if len(said) != 2 or said[0] != b"map":
            raise HostError(f"rootless mode: {self._error()}")
        sub_uid, sub_gid, newuidmap, newgidmap = subordinate
        for tool, own, sub in (
            (newuidmap, os.geteuid(), sub_uid),
            (newgidmap, os.getegid(), sub_gid),
        ):
            argv = [
                tool,
                said[1].decode(),
                str(UID_FIRST),
                str(own),
                "1",
                str(RUN_UID),
                str(sub),
                "1",
            ]
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise HostError(
                    f"rootless mode: {' '.join(argv)} failed ({done.stderr.strip()}); check "
                    f"this user's ranges in /etc/subuid and /etc/subgid"
                )
        self.holder.stdin.write(b"mapped\n")
        self.holder.stdin.flush()

    def _error(self) -> str:
        assert self.holder.stdin is not None and self.holder.stderr is not None
        self.holder.stdin.close()
        self.holder.wait(timeout=10)
        return self.holder.stderr.read().decode(errors="replace").strip()

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        for pipe in (self.holder.stdin, self.holder.stdout, self.holder.stderr):
            if pipe is not None:
                pipe.close()
        try:
            self.holder.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.holder.pid, signal.SIGKILL)
            self.holder.wait()


class _Starting:
    """One zygote process and the host's socket to it."""

    def __init__(
        self,
        enter: list[str],
        env: dict[str, str],
        options: dict[str, Any],
        passed: list[socket.socket],
        keep: list[int] | None = None,
    ) -> None:
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                # Not -I: its -E would drop PYTHONMALLOC. The environment is ours alone (`env`),
                # -s skips user site-packages and -P keeps the working directory off sys.path.
                [*enter, "-s", "-P", "-B", "-c", _BOOT, str(child.fileno())],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=[child.fileno(), *(p.fileno() for p in passed), *(keep or [])],
                cwd="/",
                start_new_session=True,
            )
        except BaseException:
            self.sock.close()
            raise
        finally:
            child.close()
        self.sock.send(json.dumps(options).encode())
        self.said_hello = False

    def ready(self, timeout_s: float) -> dict[str, Any]:
        try:
            self.sock.settimeout(timeout_s)
            hello = self.sock.recv(65536)
            self.sock.settimeout(None)
        except TimeoutError:
            return {"ready": False, "error": f"the zygote did not start within {timeout_s:g} s"}
        except OSError as exc:
            return {"ready": False, "died": True, "error": f"its socket failed: {exc}"}
        info: dict[str, Any] = (
            json.loads(hello)
            if hello
            else {"ready": False, "died": True, "error": "exited at start"}
        )
        self.said_hello = bool(info.get("ready"))
        return info

    def kill(self) -> None:
        """End the zygote and what it forked while starting (its training programs): it leads
        its own process group."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()

    def stop(self) -> None:
        if not self.said_hello:  # still starting, or failed: nothing of it is worth a wait
            self.kill()
        try:
            self.sock.close()
        finally:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
