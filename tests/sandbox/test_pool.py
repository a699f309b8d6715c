"""The slot pool's waiting (`sandbox/host/pool.py`), against a slot source whose slots never
finish staging: a caller waiting for a slot sleeps until one is staged, it does not spin."""

from __future__ import annotations

import socket
import time

import pytest

from execbox.sandbox.host.errors import HostError
from execbox.sandbox.host.pool import GROW_AFTER_S, SlotPool
from execbox.sandbox.host.slot import Slot


class StagingForever:
    """A `SlotSource` whose slots stay staging: their supervisor's end never says RDY."""

    def __init__(self) -> None:
        self.ends: list[socket.socket] = []  # the supervisors' ends, kept open

    def start_slot(self, kind: str) -> Slot:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.ends.append(theirs)
        return Slot(f"staging-{len(self.ends)}", kind, ours)

    def kind_error(self, slot_kind: str) -> str | None:
        return None

    def forget(self, slot: Slot) -> None:
        slot.close()

    def await_at_close(self, slot: Slot) -> None:
        pass

    def close(self) -> None:
        for end in self.ends:
            end.close()


def test_a_caller_waiting_for_a_slot_on_its_way_back_does_not_spin() -> None:
    source = StagingForever()
    pool = SlotPool(source, 1)
    try:
        deadline = time.monotonic() + 5.0
        while len(source.ends) < 3 and time.monotonic() < deadline:  # one per slot kind
            time.sleep(0.01)
        assert len(source.ends) >= 3, "the pool staged no slots"
        wait_s = 10 * GROW_AFTER_S  # most of it past GROW_AFTER_S, a slot still staging
        cpu = time.thread_time()
        with pytest.raises(HostError, match="no run slot was ready"):
            pool.take("light", wait_s)
        used = time.thread_time() - cpu
    finally:
        pool.close()
        source.close()
    # Waiting on the pool's condition costs microseconds a wake-up; spinning on it cost about
    # all of the wait's CPU.
    assert used < 0.1 * wait_s, f"a caller waiting {wait_s:g} s for a slot used {used:.3f} s of CPU"
