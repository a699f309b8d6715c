"""Result bytes: the server-wide budget of what runs may hand back at once, and the spool where
a run's artifacts wait on disk for their download.

A run or cell reserves, before it starts, the most its result can cost the server's memory
(stdout and stderr at their caps, times the copies a result is held in on its way out, and its
artifact cap); past the budget the request is a 503 with Retry-After, so the server stops
admitting work instead of growing; past the tenant's share of it, a 429, so one tenant's unread
results never take the room of another's. Once the response is out the reservation shrinks to
the artifacts still spooled, and is gone when they are.

A run's artifacts are written by the executor straight into a directory of the spool (mode
0700 under one private directory per server, files 0600), never held whole in memory. Those the
record store keeps are in the database as well, so their spooled copies go at once; the others
are served from the spool to the run's tenant only, by one complete download each or until
`artifact_ttl_s` passes, whichever comes first; then the file is removed. The whole spool is
removed when the server stops.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ..contract import Limits, RunResult
from ..policy import Profile
from .errors import ApiError

log = logging.getLogger(__name__)


OUTPUT_COPIES = 6
"""What one byte of a run's output costs the server's memory at its peak: the sandbox's
buffer, the result's text, the record's JSON (bytes, then text), the response's JSON and the
socket's send buffer when the client reads slowly (16 MiB on stdout and on stderr, streamed to
a client that read nothing, peaked at 185 MiB over the server's resting size)."""


class Reservation:
    """Bytes a tenant holds in a `ResultBudget`: resized as the result takes shape, released
    once."""

    def __init__(self, budget: ResultBudget, tenant: str, nbytes: int) -> None:
        self._budget = budget
        self.tenant = tenant
        self.nbytes = nbytes

    def resize(self, nbytes: int) -> None:
        """Hold `nbytes` from now on (only ever fewer than reserved)."""
        with self._budget.lock:
            nbytes = min(nbytes, self.nbytes)
            self._budget.give_back(self.tenant, self.nbytes - nbytes)
            self.nbytes = nbytes

    def release(self) -> None:
        self.resize(0)


class ResultBudget:
    """The server-wide budget of result bytes in flight, and the most of it one tenant may
    hold (`tenant_max_bytes`): one tenant's unread results never take what another's next run
    needs. Thread-safe."""

    RETRY_AFTER_S = 2

    def __init__(self, max_bytes: int, tenant_max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.tenant_max_bytes = min(max_bytes, tenant_max_bytes or max_bytes)
        self.used = 0
        self.by_tenant: dict[str, int] = {}
        self.lock = threading.Lock()

    def reserve(self, nbytes: int, tenant: str) -> Reservation:
        """Hold `nbytes` for `tenant`, or raise: a 503 while the server's budget is full, a 429
        while the tenant's own results fill its share (both with Retry-After), a 400 when no
        amount of waiting makes room."""
        if nbytes > self.tenant_max_bytes:
            raise ApiError(
                400,
                "over_result_budget",
                f"this request's limits allow a result that may cost the server "
                f"{nbytes} bytes ({OUTPUT_COPIES} x limits.output_bytes for each of "
                "stdout and stderr, plus limits.artifact_bytes), more than one key "
                f"may hold of the server's result budget: {self.tenant_max_bytes} "
                "bytes (execbox serve --max-result-mib, --tenant-result-mib); ask "
                "for lower limits",
            )
        with self.lock:
            mine = self.by_tenant.get(tenant, 0)
            if self.used + nbytes > self.max_bytes:
                raise ApiError(
                    503,
                    "result_budget",
                    f"the server holds {self.used} bytes of results in flight (its "
                    f"budget is {self.max_bytes}, execbox serve --max-result-mib); "
                    f"this request may need {nbytes}",
                    retry_after=self.RETRY_AFTER_S,
                )
            if mine + nbytes > self.tenant_max_bytes:
                raise ApiError(
                    429,
                    "result_share",
                    f"key {tenant!r} holds {mine} bytes of results in flight (unread "
                    "streams and downloads count until they are read); one key may "
                    f"hold {self.tenant_max_bytes} (execbox serve "
                    f"--tenant-result-mib) and this request may need {nbytes}",
                    retry_after=self.RETRY_AFTER_S,
                )
            self.used += nbytes
            self.by_tenant[tenant] = mine + nbytes
        return Reservation(self, tenant, nbytes)

    def give_back(self, tenant: str, nbytes: int) -> None:
        """Called with `lock` held, by a reservation that shrinks."""
        self.used -= nbytes
        left = self.by_tenant.get(tenant, 0) - nbytes
        if left > 0:
            self.by_tenant[tenant] = left
        else:
            self.by_tenant.pop(tenant, None)


def result_bound(limits: Limits, profile: Profile | None = None) -> int:
    """What a result under `limits` may cost the server's memory at the most: stdout and
    stderr at their cap, each `OUTPUT_COPIES` times, and the artifact cap (artifacts are
    written to disk). With the request's `profile`, fields the request left out take the
    profile's defaults, and no field counts above the profile's maximum (asking for more is
    denied)."""

    def value(name: str) -> int:
        if profile is None:
            return int(getattr(limits, name))
        chosen = limits if name in limits.model_fields_set else profile.limits
        return min(int(getattr(chosen, name)), int(getattr(profile.max_limits, name)))

    return 2 * OUTPUT_COPIES * value("output_bytes") + value("artifact_bytes")


@dataclass
class _Spooled:
    tenant: str
    directory: Path
    expires: float
    reservation: Reservation
    files: dict[str, tuple[int, int, str]] = field(default_factory=dict)  # path: index, size, mime


class Spool:
    """Runs' artifacts on disk, by run id, each readable by its tenant only. Thread-safe."""

    def __init__(self, parent: str | None, ttl_s: float) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="execbox-spool-", dir=parent))  # mode 0700
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._runs: dict[str, _Spooled] = {}

    def new_dir(self) -> Path:
        """A private directory for one run's artifacts (the executor writes `<index>` files)."""
        directory = self.root / uuid.uuid4().hex
        directory.mkdir(mode=0o700)
        return directory

    def adopt(
        self, result: RunResult, directory: Path, tenant: str, reservation: Reservation
    ) -> None:
        """Keep what of `directory` the tenant still has to download (artifacts the record
        store did not keep) with `reservation` resized to their bytes; remove the rest."""
        files = {}
        for index, art in enumerate(result.artifacts):
            path = directory / str(index)
            if art.data is None and path.is_file():
                files[art.path] = (index, art.size, art.mime_type)
            else:
                path.unlink(missing_ok=True)
        if not files:
            shutil.rmtree(directory, ignore_errors=True)
            reservation.release()
            return
        reservation.resize(sum(size for _, size, _ in files.values()))
        with self._lock:
            self._runs[result.run_id] = _Spooled(
                tenant, directory, time.monotonic() + self.ttl_s, reservation, files
            )

    def discard(self, directory: Path) -> None:
        """Remove a run's directory that will not be adopted (the run failed)."""
        shutil.rmtree(directory, ignore_errors=True)

    def open(self, run_id: str, tenant: str, path: str) -> tuple[int, int, str] | None:
        """(an open descriptor, size, MIME type) of a spooled artifact of the tenant's run;
        None when there is none (never spooled, already downloaded, expired, or another
        tenant's). The descriptor stays readable if the file is removed meanwhile."""
        self.sweep()
        with self._lock:
            entry = self._runs.get(run_id)
            if entry is None or entry.tenant != tenant or path not in entry.files:
                return None
            index, size, mime = entry.files[path]
            try:
                fd = os.open(
                    entry.directory / str(index), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                )
            except FileNotFoundError:
                return None
        return fd, size, mime

    def downloaded(self, run_id: str, path: str) -> None:
        """One complete download of the artifact happened: remove it from the spool."""
        with self._lock:
            entry = self._runs.get(run_id)
            if entry is None or path not in entry.files:
                return
            index, size, _ = entry.files.pop(path)
            (entry.directory / str(index)).unlink(missing_ok=True)
            entry.reservation.resize(entry.reservation.nbytes - size)
            if not entry.files:
                del self._runs[run_id]
                shutil.rmtree(entry.directory, ignore_errors=True)

    def sweep(self) -> int:
        """Remove the runs whose artifacts have expired; returns how many."""
        now = time.monotonic()
        with self._lock:
            gone = [run_id for run_id, entry in self._runs.items() if entry.expires <= now]
            entries = [self._runs.pop(run_id) for run_id in gone]
        for entry in entries:
            shutil.rmtree(entry.directory, ignore_errors=True)
            entry.reservation.release()
        return len(entries)

    def close(self) -> None:
        """Remove the whole spool (at shutdown)."""
        with self._lock:
            entries = list(self._runs.values())
            self._runs.clear()
        for entry in entries:
            entry.reservation.release()
        shutil.rmtree(self.root, ignore_errors=True)
