"""A session with a network policy: its listener made in the session's namespace when it
starts and served for its whole life, each cell's result holding the log of what was asked
for since the previous cell ended (the session's limits count across its cells)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .egress import RunEgress

if TYPE_CHECKING:
    from ..backend import SessionBackend
    from ..sandbox.host.pump import RawRun


class SessionNetwork:
    """A session's channel (`SessionBackend`) with its network: cells and file calls go to
    the channel; each cell's RawRun gets the connections asked for since the previous cell
    ended (the first: since the session started), so a process left running between cells
    or during file calls is in a log too; closing the session closes its listener and
    connections, and `after_cells` holds what came after the last cell."""

    def __init__(self, channel: SessionBackend, egress: RunEgress) -> None:
        self.channel = channel
        self.egress = egress
        self.mark = 0  # where the next cell's log begins
        self.after_cells: list[dict[str, Any]] = []

    def cell(self, *args: Any, **kwargs: Any) -> RawRun:
        raw = self.channel.cell(*args, **kwargs)
        # A connection a cell left open (a thread of its own) shows as it is now: its
        # duration null, its bytes so far.
        end = self.egress.mark()
        raw.network_log = self.egress.since(self.mark, end)
        self.mark = end
        raw.network_limit = self.egress.limit_now()
        return raw

    def file_op(
        self, op: str, path: str = "", data: bytes | None = None
    ) -> tuple[dict[str, Any], bytes]:
        return self.channel.file_op(op, path, data)

    def kill(self) -> None:
        self.channel.kill()

    def close(self) -> None:
        try:
            self.channel.close()
        finally:
            self.egress.close()
            self.after_cells = self.egress.log[self.mark :]
