"""The network log of a run: one `Record` per destination asked for, and what the proxy's
decisions hand back (`Dialled`, `Refused`, `LimitReached`)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


@dataclass
class Record:
    """One destination asked for: a line of the run's network log."""

    started: float
    method: str
    host: str
    port: int
    clock: float = field(default_factory=time.monotonic)
    address: str | None = None
    verdict: str = "denied"
    rule: str = ""
    entry: str | None = None
    message: str | None = None
    bytes_up: int = 0
    bytes_down: int = 0
    duration_ms: float | None = None

    def end(self) -> None:
        if self.duration_ms is None:
            self.duration_ms = round((time.monotonic() - self.clock) * 1000, 3)

    def as_dict(self) -> dict[str, Any]:
        return {
            "time": datetime.fromtimestamp(self.started, UTC).isoformat(timespec="milliseconds"),
            "method": self.method,
            "host": self.host,
            "port": self.port,
            "address": self.address,
            "verdict": self.verdict,
            "rule": self.rule,
            "entry": self.entry,
            "message": self.message,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "duration_ms": self.duration_ms,
        }


class LimitReached(Exception):
    """The run passed a network limit: its connections end, and so does the run."""


@dataclass
class Refused:
    status: int  # the HTTP status the client gets
    message: str


@dataclass
class Dialled:
    record: Record
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
