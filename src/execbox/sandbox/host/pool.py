"""The slot pool: run slots kept staged so that a request never waits for one to be built."""

from __future__ import annotations

import collections
import os
import select
import threading
import time
from collections.abc import Collection
from typing import Protocol

from ..inside import protocol
from .errors import HostError, HostRetired
from .slot import Slot

SLOT_KINDS = tuple(protocol.SLOT_KINDS)  # of run slot (the pool keeps `size` of each)
STAGE_TIMEOUT_S = 30.0  # a slot not staged by then is killed and replaced
GROW_AFTER_S = 0.05  # how long a taker waits, every slot of its kind busy, for one more
SHRINK_AFTER_S = 2.0  # how long a slot beyond the pool's size stays staged unused


class SlotSource(Protocol):
    """What the pool needs of the zygotes (`ZygoteProcess`): new slots, and slots let go."""

    def start_slot(self, kind: str) -> Slot:
        """A new slot of `kind`, being staged; HostError when the zygote is gone."""

    def kind_error(self, slot_kind: str) -> str | None:
        """Why slots of `slot_kind` cannot run, or None."""

    def forget(self, slot: Slot) -> None:
        """Close a slot the pool lets go (its supervisor tears it down)."""

    def await_at_close(self, slot: Slot) -> None:
        """While the host closes: wait for `slot`'s supervisor to exit too."""


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

    def __init__(self, zygote: SlotSource, size: int, dormant: Collection[str] = ()) -> None:
        self._zygote = zygote
        self._size = size
        # Kinds staged only once a run asks for one (`stage_kind`): their program zygote
        # starts then.
        self._dormant = set(dormant)
        self._lock = threading.RLock()
        # Takers wait on their kind's condition, and a slot staged wakes one of them: waking
        # all of them for every slot costs every caller a futex call and a GIL hand-off.
        self._staged = {k: threading.Condition(self._lock) for k in SLOT_KINDS}
        self._ready: dict[str, collections.deque[Slot]] = {
            k: collections.deque() for k in SLOT_KINDS
        }
        self._alive: dict[str, set[str]] = {k: set() for k in SLOT_KINDS}  # slot names
        self._busy: dict[str, Slot] = {}  # the slots taken for a run, by name
        self._busy_n = {k: 0 for k in SLOT_KINDS}  # how many of each kind (all are alive)
        self._sessions: set[str] = set()  # the slots taken for a session, by name
        self.taken = 0  # slots handed out, for runs and sessions
        self.taken_by_kind = {k: 0 for k in SLOT_KINDS}
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

    def stage_kind(self, kind: str) -> None:
        """Start staging slots of a dormant `kind` (its program zygote has been started)."""
        with self._lock:
            self._dormant.discard(kind)
        self._wake()

    def stages(self, kind: str) -> bool:
        """Whether slots of `kind` are staged (it is not dormant, its zygote did not fail)."""
        with self._lock:
            return kind not in self._dormant and not self._zygote.kind_error(kind)

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
                    self.taken_by_kind[kind] += 1
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
                        wait_s = 0.1
                    elif now - started < GROW_AFTER_S:
                        wait_s = started + GROW_AFTER_S - now
                    else:  # a slot on its way back wakes us; the timeout looks again whether
                        # every slot has become busy (never 0: the caller would spin)
                        wait_s = GROW_AFTER_S
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
            self._zygote.forget(slot)

    def drop_kinds(self, kinds: list[str]) -> None:
        """Close the staged slots of `kinds`: their program zygote failed to start."""
        with self._lock:
            dropped = [slot for kind in kinds for slot in self._ready[kind]]
            for kind in kinds:
                self._ready[kind].clear()
            for slot in dropped:
                self._alive[slot.kind].discard(slot.name)
        for slot in dropped:
            self._zygote.forget(slot)

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
        self._zygote.forget(slot)
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
                    missing = (
                        []
                        if self.retired
                        else [
                            k
                            for k in SLOT_KINDS
                            if k not in self._dormant and not self._zygote.kind_error(k)
                            for _ in range(self._wanted(k) - len(self._alive[k]))
                        ]
                    )
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
                            unusable = (
                                self._closed
                                or self.retired
                                or bool(self._zygote.kind_error(slot.kind))
                            )
                            if not unusable:
                                self._error = None
                                slot.staged_at = time.monotonic()
                                self._ready[slot.kind].append(slot)
                                self._staged[slot.kind].notify()
                        if unusable:
                            self._alive[slot.kind].discard(slot.name)
                            self._zygote.forget(slot)
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
                self._zygote.forget(slot)

    def _shrink(self) -> None:
        """Close the slots beyond `size` that have stayed staged unused for SHRINK_AFTER_S."""
        idle_since = time.monotonic() - SHRINK_AFTER_S
        closing = []
        with self._lock:
            for kind, ready in self._ready.items():
                # Cheapest test first: the loop comes here at every slot staged.
                while (
                    ready
                    and ready[0].staged_at < idle_since
                    and len(self._alive[kind]) > self._wanted(kind)
                ):
                    slot = ready.popleft()  # the longest unused
                    self._alive[kind].discard(slot.name)
                    closing.append(slot)
        for slot in closing:
            self._zygote.forget(slot)

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
            self._zygote.forget(slot)
        for slot in running:
            self._zygote.await_at_close(slot)
            slot.kill()
        self._epoll.close()
        with self._lock:
            wake_r, wake_w, self._wake_r, self._wake_w = self._wake_r, self._wake_w, -1, -1
        os.close(wake_r)
        os.close(wake_w)
