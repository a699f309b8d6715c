"""The host side of the boundary: start the zygotes, keep run slots staged, hand them one run at a
time, stream the run's stdin, stdout and stderr with caps, and read the supervisor's result.

Output caps are enforced while streaming: past the cap the bytes are read and dropped, and the
supervisor is told to end the run, so the host never buffers more than the cap.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import logging
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..inside import protocol
from ..inside.cgroup import Hierarchy

if TYPE_CHECKING:
    from .channel import SessionChannel

# The options arrive on the socket, not in argv: a run can read /proc/self/cmdline, and host
# paths are none of its business.
_BOOT = (
    "import json, socket, sys; sock = socket.socket(fileno=int(sys.argv[1])); "
    "opts = json.loads(sock.recv(1 << 20)); sys.path.insert(0, opts['src_paths'][0]); "
    "from execbox.sandbox.inside.zygote import main; main(sock, opts)"
)
_CHUNK = 65536

OutputCallback = Callable[[bytes], None]


class HostError(Exception):
    """The zygote or a supervisor failed; the message says where."""


class HostRetired(HostError):
    """The host was replaced (see `ZygoteProcess.retire`) and takes no new runs or sessions:
    ask for the one that replaced it."""


class RunNotStarted(HostError):
    """The slot's staged program, or its supervisor, was gone before the program took the
    code (killed from outside): no code ran, so the request may be sent again."""


class Cancel:
    """Ends a run from another thread. `cancel()` kills the run in flight that was given this
    token (its supervisor ends it and reports it `error`, type Cancelled), or, when none is in
    flight yet, the next one as soon as it starts (a run waiting for its turn gives up its
    place). The kill is sent under the token's lock, which the run takes to let go of its
    slot: it can never reach the slot's next run. One token per run: two runs in flight at
    once on one token would share one kill hook, and a cancelled token stays cancelled."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._kill: Callable[[], None] | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._kill is not None:
                self._kill()

    def attach(self, kill: Callable[[], None]) -> None:
        """The run in flight is killed by `kill` (at once if already cancelled)."""
        with self._lock:
            self._kill = kill
            if self._cancelled:
                kill()

    def detach(self) -> None:
        with self._lock:
            self._kill = None


@dataclass
class RawRun:
    meta: dict[str, Any]
    # None: the artifact's bytes were spooled to `<spool_dir>/<its index>` (see `execute`)
    artifact_data: Sequence[bytes | None] = field(default_factory=list)
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False


log = logging.getLogger("execbox")

KINDS = ("light", "heavy")  # of program zygote: standard library only, or the data stack too
SLOT_KINDS = tuple(protocol.SLOT_KINDS)  # of run slot (the pool keeps `size` of each)
STAGE_TIMEOUT_S = 30.0  # a slot not staged by then is killed and replaced


class ZygoteProcess:
    """The three running fork servers in the runtime image's interpreter (see `zygote`): one
    that forks supervisors and init, and two that fork only programs, a light one (standard
    library) and a heavy one (the runtime's data modules imported)."""

    def __init__(self, python: Path, env: dict[str, str], ro_paths: list[str], libexec: Path,
                 preload: list[str], light_preload: list[str] | None = None,
                 ready_timeout_s: float = 60.0, pool_size: int = 4) -> None:
        import execbox

        src = str(Path(execbox.__file__).resolve().parent.parent)
        # Supervisors ask a program zygote for their programs on one of these pairs: one end
        # is the program zygote's, the other the supervisors' zygote's (and so every
        # supervisor's).
        pairs = {kind: socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for kind in KINDS}
        common = {"ro_paths": ro_paths, "src_paths": [src], "libexec": str(libexec)}
        preloads = {"heavy": preload, "light": light_preload or []}
        self._starting: dict[str, _Starting] = {}
        try:
            # All start at once: the heavy one's imports are most of the wait.
            for kind in ("heavy", "light"):
                prog = pairs[kind][0]
                self._starting[kind] = _Starting(
                    python, env if kind == "heavy" else _small_heap(env),
                    dict(common, role="programs", kind=kind, preload=preloads[kind],
                         spawn_fd=prog.fileno()), [prog])
            sup_ends = [pairs[kind][1] for kind in KINDS]
            self._starting["supervisors"] = _Starting(
                python, env, dict(common, role="supervisors", preload=[],
                                  spawn_fds={k: pairs[k][1].fileno() for k in KINDS}), sup_ends)
        except BaseException:
            self.close()
            raise
        finally:
            for pair in pairs.values():
                for end in pair:
                    end.close()
        # The light and the supervisors' zygotes are ready in ~50 ms, the heavy one in a second
        # or more (numpy, pandas, matplotlib, its training): the host is ready without it, its
        # slots are staged meanwhile, and what runs there waits for it (`wait_heavy`).
        infos = {name: z.ready(ready_timeout_s) for name, z in self._starting.items()
                 if name != "heavy"}
        failed = [(name, info) for name, info in infos.items() if not info.get("ready")]
        if failed:
            self.close()
            name, info = failed[0]
            raise HostError(f"the zygote ({name}) failed to start: {info.get('error')}")
        sup = self._starting["supervisors"]
        self._proc, self._sock = sup.proc, sup.sock
        self.heavy_pid = self._starting["heavy"].proc.pid
        self.light_pid = self._starting["light"].proc.pid
        # The heavy zygote's entries (preloaded, heavy_startup_ms, its warm pages) are added
        # once it is ready: read them after `wait_heavy`.
        self.info: dict[str, Any] = dict(
            infos["supervisors"], light_preloaded=infos["light"]["preloaded"],
            startup_ms=max(info["startup_ms"] for info in infos.values()),
            warm_pages={"light": infos["light"].get("warm_pages", 0)},
            warm_base_pages={"light": infos["light"].get("warm_base_pages", 0)})
        self._warn_no_warm_pages("light", infos["light"])
        self._ready_timeout_s = ready_timeout_s
        self._heavy_done = threading.Event()
        self._heavy_error: str | None = None
        self._heavy_final = False
        self._prefix = f"x{os.getpid()}-{infos['supervisors']['pid']}-"
        try:
            Hierarchy.discover().sweep_orphans()
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
        self.pool = SlotPool(self, pool_size)
        threading.Thread(target=self._await_heavy, name="execbox-heavy-start",
                         daemon=True).start()

    def _await_heavy(self) -> None:
        """The heavy zygote's hello, read in the background. Its slots are no longer staged and
        what needs it fails with its error when it did not start. A zygote that said why it
        failed, or hung (it is killed), would do the same again: that is final for this host.
        One that died (killed, crashed) is a zygote death like any other: the next call starts
        a new host (see `alive`)."""
        heavy = self._starting["heavy"]
        try:
            info = heavy.ready(self._ready_timeout_s)
            if not info.get("ready"):
                self._heavy_final = not info.get("died")
                raise HostError(str(info.get("error")))
            self.info.update(preloaded=info["preloaded"], heavy_startup_ms=info["startup_ms"])
            self.info["warm_pages"]["heavy"] = info.get("warm_pages", 0)
            self.info["warm_base_pages"]["heavy"] = info.get("warm_base_pages", 0)
            self._warn_no_warm_pages("heavy", info)
        except Exception as exc:  # noqa: BLE001 - whatever it was, heavy runs must learn it
            why = "the sandbox host was closed" if self._closed else str(exc)
            self._heavy_error = f"the zygote (heavy) failed to start: {why}"
            if not self._closed:
                log.error("%s", self._heavy_error)
                if self._heavy_final:
                    heavy.kill()
                self.pool.drop_kinds([k for k in SLOT_KINDS if self.kind_error(k)])
        finally:
            self._heavy_done.set()

    def kind_error(self, slot_kind: str) -> str | None:
        """Why slots of `slot_kind` cannot run (their program zygote failed to start), or
        None."""
        return self._heavy_error if protocol.SLOT_KINDS[slot_kind][0] == "heavy" else None

    @staticmethod
    def _warn_no_warm_pages(kind: str, info: dict[str, Any]) -> None:
        if "warm_error" in info:
            log.warning("the %s program zygote learned no warm pages (its programs copy each "
                        "page as they first write it): %s", kind, info["warm_error"])

    def wait_heavy(self, timeout_s: float | None = None) -> None:
        """Wait until the heavy zygote serves (numpy and pandas runs and sessions have their
        programs there); HostError when it failed to start, or was not ready in `timeout_s`
        (by default the zygotes' start-up limit)."""
        wait_s = self._ready_timeout_s + 1.0 if timeout_s is None else timeout_s
        if not self._heavy_done.wait(wait_s):
            raise HostError(f"the heavy zygote was not ready within {wait_s:g} s")
        if self._heavy_error is not None:
            raise HostError(self._heavy_error)

    @property
    def pid(self) -> int:
        """The supervisors' zygote: the parent of every supervisor."""
        return self._proc.pid

    def alive(self) -> bool:
        """Whether every zygote still runs; a heavy zygote whose failed start is final is not
        counted (see `_await_heavy`)."""
        if self._heavy_error is not None and not self._heavy_final:
            return False  # it died starting (its process may not be reaped yet)
        return all(z.proc.poll() is None for name, z in self._starting.items()
                   if not (name == "heavy" and self._heavy_final))

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
        threading.Thread(target=self._close_when_drained, name="execbox-retire",
                         daemon=True).start()

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

    def open_session(self, slot_wait_s: float) -> SessionChannel:
        """A staged slot, to be started as a session (see `channel`)."""
        from .channel import SessionChannel

        self.wait_heavy()
        slot = self.pool.take("heavy", slot_wait_s, session=True)
        return SessionChannel(slot, self._release)

    def _release(self, slot: Slot) -> None:
        """A slot back from a run: staged again for the next one when the run ended cleanly,
        else closed (its supervisor tears it down, or is dead and we remove its cgroup)."""
        if slot.reusable and not self._closed and self.pool.recycle(slot):
            return
        self._forget(slot)
        self.pool.discard(slot)

    def _ending_too(self, slot: Slot) -> None:
        """While `close` runs: wait for `slot`'s supervisor too before it returns."""
        with self._ending_lock:
            if self._ending is not None and slot.sup_pidfd >= 0:
                try:
                    self._ending.append(os.dup(slot.sup_pidfd))
                except OSError:  # its caller has just closed it: nothing left to wait for
                    pass

    def _forget(self, slot: Slot) -> None:
        self._ending_too(slot)
        if slot.killed:
            # A killed supervisor could not remove its cgroup: once it is gone, we do.
            slot.wait_gone(5.0)
            try:
                Hierarchy.discover().remove_named(slot.name)
            except OSError:
                pass
        slot.close()

    def unused_slot_names(self) -> set[str]:
        """Cgroup names of the slots that run nothing now: staged, or being staged."""
        return self.pool.unused_names()

    def execute(self, slot: Slot, request: dict[str, Any], files: list[tuple[str, bytes]],
                stdin: bytes, output_bytes: int, backstop_s: float,
                on_stdout: OutputCallback | None = None,
                on_stderr: OutputCallback | None = None,
                cancel: Cancel | None = None, spool_dir: str | None = None) -> RawRun:
        """Run one request in a staged slot (given back to the pool here); raises HostError
        for failures of the sandbox itself. `cancel` can end the run from another thread.
        With `spool_dir`, each artifact's bytes are written to `<spool_dir>/<index>` (mode
        0600) as they arrive instead of being held in memory."""
        spec = request["spec"]
        go = b""
        go_lost = False
        code_sent = False  # whether any of the code may have reached a program
        try:
            if protocol.SLOT_KINDS[slot.kind][0] == "heavy":
                self.wait_heavy()
            try:
                if not files and slot.take_offer() and slot.staged_for(spec):  # see `protocol`
                    go = protocol.frame(protocol.REQ, json.dumps(
                        {"code": request["code"], "spec": spec, "token": slot.token}).encode())
                    # The run's clocks start now. RUN goes first, the code (what fits the
                    # pipe; the pump writes the rest) last: writing it wakes the program,
                    # which the scheduler often runs on this CPU at once, and a RUN still
                    # unsent waited for the program to run and tear down before the
                    # supervisor heard of the run.
                    sent = time.monotonic()
                    slot.ctrl.sendall(protocol.json_frame(
                        protocol.RUN, {"spec": spec, "sent": sent}))
                    written = slot.write_go(go)
                    go_lost = written < 0
                    code_sent = not go_lost
                    go = b"" if go_lost else go[written:]
                else:
                    slot.close_go()
                    request = dict(request, files=[{"name": n, "size": len(d)}
                                                   for n, d in files])
                    slot.ctrl.sendall(protocol.json_frame(protocol.REQ, request))
                    for _name, data in files:
                        slot.ctrl.sendall(protocol.frame(protocol.FILE, data))
            except (OSError, HostError) as exc:
                # A supervisor gone before it had the whole request (killed while its slot
                # waited: its init and program die with it) ran none of the code; on the
                # long way it writes the code only once it has all of it.
                error = HostError if code_sent else RunNotStarted
                raise error(f"the run supervisor did not take the request: {exc}") from exc
            pump = _Pump(slot, go, stdin, output_bytes, on_stdout, on_stderr,
                         max_frame=protocol.MAX_JSON + int(spec["artifact_bytes"]),
                         spool_dir=spool_dir)
            pump.go_lost = go_lost
            if cancel is not None:
                cancel.attach(lambda: _send_quiet(slot.ctrl, protocol.frame(
                    protocol.KILL, CANCELLED.encode())))
            return pump.run(time.monotonic() + backstop_s)
        finally:
            if cancel is not None:
                cancel.detach()  # before the slot can serve another run
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
        self._closed = True
        for z in getattr(self, "_starting", {}).values():
            z.stop()
        if pool is not None:
            with self._ending_lock:
                ending, self._ending = self._ending or [], None
            deadline = time.monotonic() + SUPERVISORS_END_S
            for pidfd in ending:
                try:
                    _readable(pidfd, max(0.0, deadline - time.monotonic()))
                finally:
                    os.close(pidfd)
        prefix = getattr(self, "_prefix", None)
        if prefix:
            try:
                Hierarchy.discover().sweep(prefix)
            except OSError:
                pass


def _small_heap(env: dict[str, str]) -> dict[str, str]:
    """A small interpreter forks faster with Python's own allocator: the huge pages that make
    copying the heavy one's page tables cheap cost a split of a 2 MiB page at the first write
    to each in a child, which a 9 MB heap does not win back (measured: ~15% less CPU per
    program)."""
    return {k: v for k, v in env.items() if k not in ("PYTHONMALLOC", "GLIBC_TUNABLES")}


class _Starting:
    """One zygote process and the host's socket to it."""

    def __init__(self, python: Path, env: dict[str, str], options: dict[str, Any],
                 passed: list[socket.socket]) -> None:
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                # Not -I: its -E would drop PYTHONMALLOC. The environment is ours alone (`env`),
                # -s skips user site-packages and -P keeps the working directory off sys.path.
                [str(python), "-s", "-P", "-B", "-c", _BOOT, str(child.fileno())],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                pass_fds=[child.fileno(), *(p.fileno() for p in passed)], cwd="/",
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
        info: dict[str, Any] = (json.loads(hello) if hello
                                else {"ready": False, "died": True, "error": "exited at start"})
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


SUPERVISORS_END_S = 10.0  # how long `close` waits for the supervisors it let go to exit
CANCELLED = "cancelled"  # the KILL reason of a run its caller cancelled (see `Cancel`)
GROW_AFTER_S = 0.05  # how long a taker waits, every slot of its kind busy, for one more
SHRINK_AFTER_S = 2.0  # how long a slot beyond the pool's size stays staged unused


class SlotPool:
    """Keeps `size` run slots of each kind staged, so a request never pays for forks,
    namespaces, mounts or the cgroup. A slot serves one run at a time and, when the run ended
    cleanly, is staged again for the next (fresh pid and ipc namespaces, init, scratch mounts
    and program: see `supervisor`). One thread reads what staging slots report.

    `size` is what is kept staged, not a cap: a taker that has waited GROW_AFTER_S while
    every slot of its kind runs something (none staging, none staged) has one more started for
    it (the executor's admission bounds how many runs ask at once); slots beyond `size` close
    once they have stayed staged and unused for SHRINK_AFTER_S. Short runs that only queue for
    slots being restaged (the CPU is what is short) grow nothing, and a load that grew the pool
    keeps it while it lasts instead of closing and starting slots run after run. A session's
    slot leaves the pool as it is taken, which stages another in its place.

    A retired pool (its host was replaced) stages nothing and hands out nothing; it is
    `drained` once the runs in flight and the sessions it gave slots to have ended."""

    def __init__(self, zygote: ZygoteProcess, size: int) -> None:
        self._zygote = zygote
        self._size = size
        self._lock = threading.RLock()
        # Takers wait on their kind's condition, and a slot staged wakes one of them: a
        # wake-up costs the waker a futex call and the woken a GIL hand-off, and waking all
        # of them for every slot was ~4% of the caller's CPU under eight callers.
        self._staged = {k: threading.Condition(self._lock) for k in SLOT_KINDS}
        self._ready: dict[str, collections.deque[Slot]] = {k: collections.deque()
                                                           for k in SLOT_KINDS}
        self._alive: dict[str, set[str]] = {k: set() for k in SLOT_KINDS}  # slot names
        self._busy: dict[str, Slot] = {}  # the slots taken for a run, by name
        self._busy_n = {k: 0 for k in SLOT_KINDS}  # how many of each kind (all are alive)
        self._sessions: set[str] = set()  # the slots taken for a session, by name
        self.taken = 0  # slots handed out, for runs and sessions
        self.retired = False
        self.drained = threading.Event()  # set once retired with nothing in use, or closed
        self._waiting = {k: 0 for k in SLOT_KINDS}  # takers that found no slot of the kind
        # The slots being staged, by control socket: each is registered with the epoll where
        # it is added (a recycled slot by the thread that ran it), so a slot coming back from
        # a run costs the staging thread one wake-up, for its RDY.
        self._staging: dict[int, Slot] = {}
        self._epoll = select.epoll()
        self._closed = False
        self._error: str | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._thread = threading.Thread(target=self._loop, name="execbox-stage", daemon=True)
        self._thread.start()

    def ready_count(self, kind: str | None = None) -> int:
        with self._lock:
            return sum(len(self._ready[k]) for k in ([kind] if kind else SLOT_KINDS))

    def unused_names(self) -> set[str]:
        with self._lock:
            return set().union(*self._alive.values()) - self._busy.keys()

    @property
    def size(self) -> int:
        """How many slots of each kind are kept staged."""
        return self._size

    def in_use(self) -> int:
        with self._lock:
            return len(self._busy) + len(self._sessions)

    def take(self, kind: str, timeout_s: float, session: bool = False) -> Slot:
        """A staged slot of `kind`, for a run, or a `session`'s from now on (it leaves the
        pool for the session's life, and another is staged in its place); HostError when
        staging keeps failing or none is ready in time, HostRetired once the pool retired."""
        started = time.monotonic()
        deadline = started + timeout_s
        with self._lock:
            while True:
                if self.retired:
                    raise HostRetired("the sandbox host was replaced")
                if self._closed:
                    raise HostError("the sandbox host is closed")
                failed = self._zygote.kind_error(kind)
                if failed:
                    raise HostError(failed)
                if self._ready[kind]:
                    slot = self._ready[kind].popleft()
                    self.taken += 1
                    if session:
                        self._alive[kind].discard(slot.name)
                        self._sessions.add(slot.name)
                        self._wake()
                    else:
                        self._busy[slot.name] = slot
                        self._busy_n[kind] += 1
                    return slot
                now = time.monotonic()
                if self._error and now > started + 1.0:  # failing for a second
                    raise HostError(f"cannot stage a run slot: {self._error}")
                if now > deadline:
                    raise HostError(f"no run slot was ready within {timeout_s:g} s")
                # A slot back from a short run is staged again within milliseconds: only a
                # taker that has waited GROW_AFTER_S, with no slot of its kind on its way
                # back, asks for one more.
                grow = now - started >= GROW_AFTER_S and self._all_busy(kind)
                self._waiting[kind] += grow
                try:
                    if grow:  # every slot of the kind is busy: the loop stages one more
                        self._wake()
                    wait_s = 0.1 if grow else started + GROW_AFTER_S - now
                    self._staged[kind].wait(min(wait_s, deadline - now) + 0.001)
                finally:
                    self._waiting[kind] -= grow

    def _all_busy(self, kind: str) -> bool:
        """Whether every slot of `kind` runs something (called with the lock held)."""
        return self._busy_n[kind] >= len(self._alive[kind])

    def _not_busy(self, slot: Slot) -> None:
        """`slot` runs nothing any more (called with the lock held)."""
        if self._busy.pop(slot.name, None) is not None:
            self._busy_n[slot.kind] -= 1
        if self.retired and not self._busy and not self._sessions:
            self.drained.set()

    def _wanted(self, kind: str) -> int:
        """How many slots of `kind` to keep (called with the lock held): `size`, or one for
        each run in flight and each taker waiting when they are more."""
        return max(self._size, self._busy_n[kind] + self._waiting[kind])

    def recycle(self, slot: Slot) -> bool:
        """Have the slot staged again; False when it cannot be (the caller discards it)."""
        slot.close_run()
        try:
            slot.ctrl.send(protocol.frame(protocol.NEXT, b""))
        except OSError:
            return False
        with self._lock:
            if self._closed or self.retired:
                return False
            self._not_busy(slot)
            self._watch(slot)
        return True

    def retire(self) -> None:
        """Stage and hand out nothing more: the staged slots are closed, takers waiting get
        HostRetired, and a slot back from its run is closed (see `drained`)."""
        with self._lock:
            self.retired = True
            ready = [slot for q in self._ready.values() for slot in q]
            for q in self._ready.values():
                q.clear()
            for slot in ready:
                self._alive[slot.kind].discard(slot.name)
            if not self._busy and not self._sessions:
                self.drained.set()
            self._notify_all()
        for slot in ready:
            self._zygote._forget(slot)

    def drop_kinds(self, kinds: list[str]) -> None:
        """Close the staged slots of `kinds`: their program zygote failed to start."""
        with self._lock:
            dropped = [slot for kind in kinds for slot in self._ready[kind]]
            for kind in kinds:
                self._ready[kind].clear()
            for slot in dropped:
                self._alive[slot.kind].discard(slot.name)
        for slot in dropped:
            self._zygote._forget(slot)

    def discard(self, slot: Slot) -> None:
        """The slot is gone (closed by the caller): stage a new one in its place."""
        with self._lock:
            self._sessions.discard(slot.name)
            self._not_busy(slot)
            self._alive[slot.kind].discard(slot.name)
        self._wake()

    def _wake(self) -> None:
        # Under the lock, and never once `close` has let go of the pipe: its number may name
        # another file by then (a run that ends after `close` releases its slot here, and a
        # stray byte once landed in the records' SQLite file).
        with self._lock:
            if self._wake_w < 0:
                return
            try:
                os.write(self._wake_w, b"x")
            except OSError:  # full: the loop is awake anyway
                pass

    def _notify_all(self) -> None:
        """Wake every taker (called with the lock held): the pool closed or staging failed."""
        for cond in self._staged.values():
            cond.notify_all()

    def _lost(self, slot: Slot, error: str) -> None:
        self._zygote._forget(slot)
        with self._lock:
            self._alive[slot.kind].discard(slot.name)
            self._error = error
            self._notify_all()

    def _watch(self, slot: Slot) -> None:
        """Start reading what the slot says while it stages (called with the lock held)."""
        slot.staging_since = time.monotonic()
        self._staging[slot.ctrl.fileno()] = slot
        self._epoll.register(slot.ctrl.fileno(), select.EPOLLIN)

    def _unwatch(self, slot: Slot) -> None:
        """Stop reading the slot (before it is closed or handed out)."""
        with self._lock:
            fd = slot.ctrl.fileno()
            if self._staging.pop(fd, None) is not None:
                self._epoll.unregister(fd)

    def _loop(self) -> None:
        retry_at = 0.0
        try:
            while True:
                with self._lock:
                    if self._closed:
                        return
                    missing = [] if self.retired else [
                        k for k in SLOT_KINDS if not self._zygote.kind_error(k)
                        for _ in range(self._wanted(k) - len(self._alive[k]))]
                now = time.monotonic()
                if now >= retry_at:
                    for kind in missing:
                        try:
                            new = self._zygote.start_slot(kind)
                        except HostError as exc:
                            with self._lock:
                                self._error = str(exc)
                            retry_at = now + 0.2  # do not spin on a broken host
                            break
                        with self._lock:
                            self._alive[kind].add(new.name)
                            self._watch(new)
                for fd, _events in self._epoll.poll(0.2):
                    if fd == self._wake_r:
                        protocol.drain(self._wake_r)
                        continue
                    with self._lock:
                        slot = self._staging.get(fd)
                    if slot is None:
                        continue
                    try:
                        staged = slot.read_staging()
                    except HostError as exc:
                        self._unwatch(slot)
                        self._lost(slot, str(exc))
                        retry_at = time.monotonic() + 0.2
                        continue
                    if staged:
                        self._unwatch(slot)
                        with self._lock:
                            # When closed, `close` has taken the ready slots; a kind whose
                            # program zygote failed to start serves nothing.
                            unusable = (self._closed or self.retired
                                        or bool(self._zygote.kind_error(slot.kind)))
                            if not unusable:
                                self._error = None
                                slot.staged_at = time.monotonic()
                                self._ready[slot.kind].append(slot)
                                self._staged[slot.kind].notify()
                        if unusable:
                            self._alive[slot.kind].discard(slot.name)
                            self._zygote._forget(slot)
                self._shrink()
                late = time.monotonic() - STAGE_TIMEOUT_S
                with self._lock:
                    stuck = [s for s in self._staging.values() if s.staging_since < late]
                for slot in stuck:
                    self._unwatch(slot)
                    slot.kill()
                    self._lost(slot, f"staging took over {STAGE_TIMEOUT_S:g} s")
        finally:
            with self._lock:
                left = list(self._staging.values())
            for slot in left:
                self._unwatch(slot)
                self._zygote._forget(slot)

    def _shrink(self) -> None:
        """Close the slots beyond `size` that have stayed staged unused for SHRINK_AFTER_S."""
        idle_since = time.monotonic() - SHRINK_AFTER_S
        closing = []
        with self._lock:
            for kind, ready in self._ready.items():
                # Cheapest test first: the loop comes here at every slot staged.
                while (ready and ready[0].staged_at < idle_since
                       and len(self._alive[kind]) > self._wanted(kind)):
                    slot = ready.popleft()  # the longest unused
                    self._alive[kind].discard(slot.name)
                    closing.append(slot)
        for slot in closing:
            self._zygote._forget(slot)

    def close(self) -> None:
        """Let go of the staged slots and end the runs in flight: their supervisors are
        killed (init and the program with them), so nothing of a run outlives the pool; each
        run's caller then gets a sandbox error and forgets its slot."""
        with self._lock:
            self._closed = True
            ready = [slot for q in self._ready.values() for slot in q]
            for q in self._ready.values():
                q.clear()
            running = list(self._busy.values())
            self._notify_all()
        self.drained.set()  # nothing waits for it any more: a retired host closes now
        self._wake()
        self._thread.join(timeout=10)
        for slot in ready:
            self._zygote._forget(slot)
        for slot in running:
            self._zygote._ending_too(slot)
            slot.kill()
        self._epoll.close()
        with self._lock:
            wake_r, wake_w, self._wake_r, self._wake_w = self._wake_r, self._wake_w, -1, -1
        os.close(wake_r)
        os.close(wake_w)


class Slot:
    """The host's handle on one run slot: the control socket to its supervisor (for the slot's
    life) and the current run's stdio (new for every run). Each descriptor is closed exactly
    once: a second close could hit a number another thread has just been given."""

    def __init__(self, name: str, kind: str, ctrl: socket.socket) -> None:
        self.name = name  # of the slot's cgroup
        self.kind = kind
        self.ctrl = ctrl
        self.stdin_w = -1
        self.stdout_r = -1
        self.stderr_r = -1
        # The short way's offer (PRK, see `protocol`): the staged program's go pipe, the
        # run's token for the code sent down it, the limits the slot has.
        self.go_w = -1
        self.token = ""
        self.staged: dict[str, Any] = {}
        self.sup_pid = 0
        # A pidfd, not the pid: the zygote reaps supervisors at once, so a number could name
        # another process by the time we signal it.
        self.sup_pidfd = -1
        self.killed = False
        self.reusable = False  # set when a run's result came back whole
        self.staging_since = 0.0
        self.staged_at = 0.0  # when it was last staged (unused since, while in the ready queue)
        self._reader = protocol.FrameReader(protocol.MAX_JSON)
        self._fds: list[int] = []

    def read_staging(self) -> bool:
        """Read what the supervisor says while it stages (the socket is readable): True once
        the slot is staged (RDY, with the run's stdio). Raises HostError when staging failed."""
        try:
            data, fds = protocol.recv_fds(self.ctrl, 65536, 8, protocol.DONTWAIT)
        except BlockingIOError:
            return False
        except OSError as exc:
            raise HostError(f"staging a run slot failed: {exc}") from exc
        self._fds += fds
        if not data:
            raise HostError("the run supervisor exited while staging")
        for kind, payload in self._reader.feed(data):
            if kind == protocol.PID:
                self.watch(json.loads(payload)["pid"])
            elif kind == protocol.ERR:
                raise HostError("sandbox: " + json.loads(payload)["message"])
            elif kind == protocol.RDY:
                fds, self._fds = self._fds, []
                if len(fds) != 3:
                    for fd in fds:
                        os.close(fd)
                    raise HostError(f"protocol: a staged slot sent {len(fds)} descriptors, not 3")
                self.stdin_w, self.stdout_r, self.stderr_r = fds
                self.reusable = False
                # The last run's pump left it non-blocking: a request (input files of any size)
                # is sent with a blocking sendall.
                self.ctrl.setblocking(True)
                return True
            else:
                raise HostError(f"protocol: unexpected {kind!r} while staging")
        return False

    def watch(self, pid: int) -> None:
        """Hold the supervisor by a pidfd (it is alive: it has just reported)."""
        self.sup_pid = pid
        if self.sup_pidfd < 0:
            try:
                self.sup_pidfd = os.pidfd_open(pid)
            except OSError:
                pass

    def kill(self) -> None:
        """SIGKILL the supervisor (its init and the whole run die with it)."""
        if self.sup_pidfd >= 0:
            try:
                signal.pidfd_send_signal(self.sup_pidfd, signal.SIGKILL)
                self.killed = True
            except OSError:  # gone already, or its descriptor closed by the caller just now
                pass

    def wait_gone(self, timeout_s: float) -> bool:
        """Wait until the supervisor has exited; False if it is still there."""
        if self.sup_pidfd < 0:
            return True
        return _readable(self.sup_pidfd, timeout_s)

    def take_offer(self) -> bool:
        """Whether the short way is open for this run: PRK has come (read now if it is there,
        never waited for). Raises HostError when the supervisor failed or is gone."""
        if self.go_w >= 0:
            return True
        try:
            data, fds = protocol.recv_fds(self.ctrl, 65536, 1, protocol.DONTWAIT)
        except BlockingIOError:
            return False
        except OSError as exc:
            raise HostError(f"the run supervisor is gone: {exc}") from exc
        try:
            if not data:
                raise HostError("the run supervisor exited")
            for kind, payload in self._reader.feed(data):
                if kind == protocol.PRK and fds:
                    offer = json.loads(payload)
                    self.token = str(offer.pop("token"))
                    self.go_w, self.staged = fds.pop(), offer
                elif kind == protocol.ERR:
                    raise HostError("sandbox: " + str(json.loads(payload).get("message")))
                else:
                    raise HostError(f"protocol: unexpected {kind!r} from a staged slot")
        except (ValueError, KeyError, AttributeError, TypeError) as exc:  # unreadable
            raise HostError(f"protocol: a staged slot's offer: {exc!r}") from exc
        finally:
            for fd in fds:
                os.close(fd)
        return self.go_w >= 0

    def staged_for(self, spec: dict[str, Any]) -> bool:
        """Whether a run with `spec` (and no input files) may take the short way: its limits
        are those the slot is staged with."""
        staged = self.staged
        return (spec["memory_bytes"] == staged.get("memory_bytes")
                and spec["pids"] == staged.get("pids")
                and spec["disk_bytes"] == staged.get("disk_bytes")
                and not spec.get("input_bytes") and not spec.get("input_count"))

    def write_go(self, data: bytes) -> int:
        """Write what fits of `data` into the offered go pipe without waiting; how much, or -1
        when the program is gone."""
        os.set_blocking(self.go_w, False)
        return _write_some(self.go_w, data)

    def close_stdin(self) -> None:
        if self.stdin_w >= 0:
            os.close(self.stdin_w)
            self.stdin_w = -1

    def close_go(self) -> None:
        if self.go_w >= 0:
            os.close(self.go_w)
            self.go_w = -1
        self.token, self.staged = "", {}

    def close_run(self) -> None:
        """Close the last run's stdio and go pipe (the slot stays)."""
        self.close_stdin()
        self.close_go()
        for name in ("stdout_r", "stderr_r"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)

    def close(self) -> None:
        """Release the slot; its supervisor tears it down."""
        if self.ctrl.fileno() >= 0:
            self.ctrl.close()
        self.close_run()
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        if self.sup_pidfd >= 0:
            os.close(self.sup_pidfd)
            self.sup_pidfd = -1


class _Pump:
    """Moves bytes between the host and one run until the supervisor reports."""

    def __init__(self, slot: Slot, go: bytes, stdin: bytes, cap: int,
                 on_stdout: OutputCallback | None, on_stderr: OutputCallback | None,
                 max_frame: int, spool_dir: str | None = None) -> None:
        self.slot = slot
        ctrl, stdout_r, stderr_r = slot.ctrl, slot.stdout_r, slot.stderr_r
        self.ctrl = ctrl
        # What is still to be written: the code (on the short way) and stdin, each pipe
        # closed once written.
        self.writes = {fd: memoryview(data) for fd, data in ((slot.go_w, go),
                                                             (slot.stdin_w, stdin)) if fd >= 0}
        self.cap = cap
        self.out = {stdout_r: bytearray(), stderr_r: bytearray()}
        self.truncated = {stdout_r: False, stderr_r: False}
        self.callbacks = {stdout_r: on_stdout, stderr_r: on_stderr}
        self.stdout_r, self.stderr_r = stdout_r, stderr_r
        self.spool_dir = spool_dir
        # Spool files opened and not yet closed, in frame order (one feed may end several).
        self.spooling: collections.deque[BinaryIO] = collections.deque()
        self.spooled = 0  # artifacts spooled so far: the next one's file name
        self.reader = protocol.FrameReader(max_frame, self._spill if spool_dir else None)
        self.meta: dict[str, Any] | None = None
        self.error: str | None = None
        self.arts: list[bytes | None] = []
        self.kill_sent = False
        # The program was gone before it took its code: the go pipe had no reader (seen here,
        # on the short way), or the supervisor says so (LOST).
        self.go_lost = False
        self.lost = False

    def run(self, backstop: float) -> RawRun:
        try:
            return self._run(backstop)
        finally:
            for file in self.spooling:  # the run ended in the middle of an artifact
                with contextlib.suppress(OSError):
                    file.close()

    def _spill(self, kind: bytes) -> BinaryIO | None:
        """An artifact's frame goes to the spool file named by its index."""
        if kind != protocol.ART or self.spool_dir is None:
            return None
        fd = os.open(os.path.join(self.spool_dir, str(self.spooled)),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self.spooled += 1
        file = open(fd, "wb")  # noqa: SIM115 - closed when its frame ends
        self.spooling.append(file)
        return file

    def _run(self, backstop: float) -> RawRun:
        sel = _Poll()
        for fd in (self.stdout_r, self.stderr_r, *self.writes):
            os.set_blocking(fd, False)
        self.ctrl.setblocking(False)
        ctrl = self.ctrl.fileno()
        sel.register(self.stdout_r, select.POLLIN)
        sel.register(self.stderr_r, select.POLLIN)
        sel.register(ctrl, select.POLLIN)
        for fd in list(self.writes):
            sel.register(fd, select.POLLOUT)
            self._feed(sel, fd)  # the code and small input fit the pipe: no wait for them
        while sel.fds:
            if self._complete() and self.stdout_r not in sel.fds and self.stderr_r not in sel.fds:
                break  # the result is in and output has ended: teardown is not our wait
            left = backstop - time.monotonic()
            if left <= 0:
                self._kill_supervisor()
                raise HostError("the run supervisor did not finish in time")
            for fd, _events in sel.poll(min(left, 1.0)):
                if fd in self.writes:
                    self._feed(sel, fd)
                elif fd == ctrl:
                    self._read_ctrl(sel)
                else:
                    self._read_output(sel, fd)
        if self.error is not None:
            raise HostError(self.error)
        # The host saw the go pipe without a reader; the supervisor, which did not, reports
        # that program's end as a SIGKILL (a memory_limit when its own limit killed it).
        killed = self.meta is not None and (self.meta.get("status"), self.meta.get("signal")) \
            == ("error", "SIGKILL")
        if self.lost or (self.go_lost and killed):
            # The slot is closed: whatever killed its program may have broken more of it.
            raise RunNotStarted("the run slot's program was gone before it took the code")
        if self.meta is None:
            raise HostError("the run supervisor exited without a result")
        n = len(self.meta.get("artifacts", []))
        if len(self.arts) != n:
            raise HostError(f"the run supervisor sent {len(self.arts)} of {n} artifacts")
        self.slot.reusable = True
        return RawRun(self.meta, self.arts, bytes(self.out[self.stdout_r]),
                      bytes(self.out[self.stderr_r]), self.truncated[self.stdout_r],
                      self.truncated[self.stderr_r])

    def _complete(self) -> bool:
        if self.error is not None or self.lost:
            return True
        return self.meta is not None and len(self.arts) >= len(self.meta.get("artifacts", []))

    def _feed(self, sel: _Poll, fd: int) -> None:
        data = self.writes[fd]
        if data:
            written = _write_some(fd, data[:_CHUNK * 4])
            if not written:
                return
            # The program closed the pipe or exited: the rest is not wanted either. A program
            # closes its go pipe only once it has read its code whole: gone before that, it
            # ran none of it.
            if written < 0 and fd == self.slot.go_w:
                self.go_lost = True
            data = data[:0] if written < 0 else data[written:]
            self.writes[fd] = data
        if not data:
            self._end_write(sel, fd)

    def _end_write(self, sel: _Poll, fd: int) -> None:
        del self.writes[fd]
        sel.unregister(fd)
        if fd == self.slot.stdin_w:
            self.slot.close_stdin()
        else:
            self.slot.close_go()

    def _read_output(self, sel: _Poll, fd: int) -> None:
        try:
            data = os.read(fd, _CHUNK)
        except BlockingIOError:
            return
        if not data:
            sel.unregister(fd)
            return
        buf = self.out[fd]
        room = self.cap - len(buf)
        if room > 0:
            keep = data[:room]
            buf += keep
            callback = self.callbacks[fd]
            if callback is not None:
                callback(keep)
        if len(data) > room:
            self.truncated[fd] = True
            if not self.kill_sent:
                self.kill_sent = True
                try:
                    self.ctrl.send(protocol.frame(protocol.KILL, b"output_limit"))
                except OSError:
                    pass

    def _read_ctrl(self, sel: _Poll) -> None:
        try:
            # Not more at once: a buffer past malloc's mmap threshold (128 KiB) is mapped and
            # unmapped for every call, ~13 us of CPU, more with threads on other cores.
            data = self.ctrl.recv(_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            sel.unregister(self.ctrl.fileno())
            for fd in list(self.writes):
                self._end_write(sel, fd)
            return
        try:
            frames = self.reader.feed(data)
        except OSError as exc:  # the spool: disk full, or its directory gone
            self.error = f"could not spool an artifact: {exc}"
            sel.unregister(self.ctrl.fileno())
            return
        for kind, payload in frames:
            if kind == protocol.PID:
                self.slot.watch(json.loads(payload)["pid"])
            elif kind == protocol.RES:
                self.meta = json.loads(payload)
            elif kind == protocol.ART and self.spool_dir is not None:
                self._spooled()
            elif kind == protocol.ART:
                self.arts.append(payload)
            elif kind == protocol.ERR:
                self.error = "sandbox: " + json.loads(payload)["message"]
            elif kind == protocol.LOST:
                self.lost = True

    def _spooled(self) -> None:
        """An artifact is whole in its spool file: nothing of it is held here."""
        try:
            self.spooling.popleft().close()
        except OSError as exc:
            self.error = f"could not spool an artifact: {exc}"
        self.arts.append(None)

    def _kill_supervisor(self) -> None:
        self.slot.kill()


def _readable(fd: int, timeout_s: float) -> bool:
    """Whether `fd` is readable (a pidfd: its process has exited) within `timeout_s`. poll, not
    select: a caller holding a thousand descriptors (a busy server) has numbers past select's."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))


def _send_quiet(sock: socket.socket, data: bytes) -> None:
    try:
        sock.send(data)
    except OSError:  # the supervisor is gone: the run is over anyway
        pass


def _write_some(fd: int, data: bytes | memoryview) -> int:
    """Write what fits of `data` into the non-blocking pipe `fd`: bytes written, 0 when it is
    full, -1 when its reader is gone."""
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0
    except OSError:
        return -1


class _Poll:
    """select.poll and the descriptors registered with it (a run's pump watches at most four:
    poll is the cheapest way to wait on so few)."""

    def __init__(self) -> None:
        self._poll = select.poll()
        self.fds: set[int] = set()

    def register(self, fd: int, events: int) -> None:
        self._poll.register(fd, events)
        self.fds.add(fd)

    def unregister(self, fd: int) -> None:
        self._poll.unregister(fd)
        self.fds.discard(fd)

    def poll(self, timeout_s: float) -> list[tuple[int, int]]:
        return self._poll.poll(max(0, int(timeout_s * 1000) + 1))
