"""`Cancel`, the token a caller holds to end its run from another thread (`execbox.Cancel`)."""

from __future__ import annotations

import threading
from collections.abc import Callable


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
