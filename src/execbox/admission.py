"""Admission: how many runs go at once and how many callers may wait, and `map`'s workers."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Generator, Iterable
from typing import TypeVar

from .cancel import Cancel
from .errors import Overloaded

CANCEL_CHECK_S = 0.1  # how often a cancellable run waiting for its turn looks at its token
SIGNAL_CHECK_S = 0.2  # how often a `map` consumer waiting for results runs signal handlers
T = TypeVar("T")
A = TypeVar("A")


class Admission:
    """At most `limit` runs at once and at most `max_waiting` callers waiting for a turn."""

    def __init__(self, limit: int, max_waiting: int, timeout_s: float) -> None:
        self._sem = threading.Semaphore(limit)
        self._limit = limit
        self._owed = 0  # turns to keep as they come back: what `resize` took off the limit
        self._lock = threading.Lock()
        self._waiting = 0
        self._max_waiting = max_waiting
        self._timeout_s = timeout_s

    def enter(self, cancel: Cancel | None = None) -> bool:
        """Wait for a turn: True once it is the caller's (`leave` gives it back), False when
        `cancel` was cancelled while it waited (its place in the queue is given up at once);
        raises Overloaded past `max_queue` or `queue_timeout_s`."""
        if self._sem.acquire(blocking=False):
            return True
        with self._lock:
            if self._waiting >= self._max_waiting:
                raise Overloaded(
                    f"{self._waiting} runs are already waiting (max_queue="
                    f"{self._max_waiting}); retry later or raise max_queue"
                )
            self._waiting += 1
        try:
            deadline = time.monotonic() + self._timeout_s
            while True:
                if cancel is not None and cancel.cancelled:
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Overloaded(
                        f"no run slot within {self._timeout_s:g} s (queue_timeout_s); retry later"
                    )
                # A cancellable waiter looks at its token every CANCEL_CHECK_S.
                if self._sem.acquire(timeout=min(left, CANCEL_CHECK_S) if cancel else left):
                    return True
        finally:
            with self._lock:
                self._waiting -= 1

    def leave(self) -> None:
        with self._lock:
            if self._owed:
                self._owed -= 1
                return
        self._sem.release()

    def resize(self, limit: int) -> None:
        """At most `limit` runs at once from now on (a cluster's nodes come and go): a wider
        limit lets waiters in at once; a narrower one keeps turns as runs give them back."""
        with self._lock:
            grow = limit - self._limit
            self._limit = limit
            if grow < 0:
                self._owed -= grow
                return
            kept = min(grow, self._owed)
            self._owed -= kept
        if grow - kept:
            self._sem.release(grow - kept)

    @property
    def waiting(self) -> int:
        """Callers waiting for a turn now."""
        return self._waiting


def concurrently(
    fn: Callable[[A], T], items: Iterable[A], width: int
) -> Generator[tuple[int, T], None, None]:
    """`(index, fn(item))` for each item, yielded as calls finish, from `width` threads that
    each take the next item themselves: a call ended costs one wake-up (of the consumer, if it
    waits), not two, and no future. At most `width` calls run and `width` results wait for
    the consumer, so a slow one holds the input back; items are taken lazily. An exception
    (from `fn` or from the input) is raised to the consumer in its place; a consumer that
    stops early waits for the calls in flight, and no new one starts (interrupted by a
    KeyboardInterrupt, it does not wait: its caller may end them, see `evals.humaneval`)."""
    numbered = iter(enumerate(items))
    taking = threading.Lock()
    room = threading.Semaphore(2 * width)  # calls in flight plus results not yet consumed
    done: queue.SimpleQueue[tuple[int, T | BaseException] | None] = queue.SimpleQueue()
    stop = threading.Event()

    def work() -> None:
        try:
            while room.acquire() and not stop.is_set():
                with taking:
                    try:
                        index, item = next(numbered, (-1, None))
                    except BaseException as exc:  # the input's own error, raised in its place
                        done.put((-1, exc))
                        return
                if index < 0:
                    return
                try:
                    done.put((index, fn(item)))  # type: ignore[arg-type]
                except BaseException as exc:
                    done.put((index, exc))
        finally:
            done.put(None)

    threads = [
        threading.Thread(target=work, name=f"execbox-map-{i}", daemon=True) for i in range(width)
    ]
    for thread in threads:
        thread.start()
    interrupted = False
    try:
        working = width
        while working:
            try:
                # Timed: a blocking get would hold off the consumer's signal handlers (a
                # KeyboardInterrupt) until the next run finished.
                got = done.get(timeout=SIGNAL_CHECK_S)
            except queue.Empty:
                continue
            if got is None:
                working -= 1
                continue
            index, outcome = got
            if isinstance(outcome, BaseException):
                outcome.add_note(
                    f"(raised by item {index} of the map)"
                    if index >= 0
                    else "(raised by the map's input)"
                )
                raise outcome
            yield index, outcome
            room.release()
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        stop.set()
        room.release(width)  # a thread waiting for room sees the stop
        if not interrupted:  # a Ctrl-C does not wait: the calls in flight end on their own
            for thread in threads:
                thread.join()
