"""What the pages show, computed from records: code lines, the overview's figures and the
geometry of its small charts (drawn as plain SVG by the templates, no script)."""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime

from ...records import RunRecord
from .queries import RunRow

# C0 controls but tab and newline, DEL, C1 and the bidirectional overrides (which can make
# text read other than it runs): written out, so they stay visible text.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
INLINE_IMAGES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
PERIODS = {"15m": 900, "1h": 3600, "24h": 86_400, "7d": 7 * 86_400}
OVERVIEW_WINDOW_S = 3600
OVERVIEW_MAX_RUNS = 5000
# A session page shows this many cells, each text this long at most: a session of many cells
# of large output would otherwise be one page of its whole output.
SESSION_PAGE_CELLS = 50
CELL_TEXT_CHARS = 20_000


def visible(text: object) -> str:
    """The text with control characters written out, for display (escaping comes after)."""
    return _CONTROL.sub(_written_out, str(text))


def _written_out(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clip(text: str, limit: int = CELL_TEXT_CHARS) -> str:
    """The text's first `limit` characters (the whole of it is on the run's page)."""
    return text[:limit]


_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")


def b64(data: str) -> str:
    """Base64 text for a data: URL, or nothing when it is not plain base64."""
    return "".join(data.split()) if _BASE64.fullmatch(data) else ""


def when(ts: float | None) -> str:
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def size(n: int | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


@dataclass(frozen=True)
class CodeLine:
    number: int
    text: str
    error: bool


def code_lines(record: RunRecord) -> list[CodeLine]:
    """The code's lines, numbered from 1, the error's line marked."""
    error = record.result.error
    bad = error.line if error else None
    if bad is None and record.policy.line is not None and record.policy.decision != "allow":
        bad = record.policy.line
    return [CodeLine(n, line, n == bad) for n, line in enumerate(record.code.split("\n"), start=1)]


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    share: float  # of the largest bar, 0..1


def bars(counts: dict[str, int] | list[tuple[str, int]]) -> list[Bar]:
    items = list(counts.items()) if isinstance(counts, dict) else counts
    top = max((v for _, v in items), default=0) or 1
    return [Bar(label, value, value / top) for label, value in items]


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True)
class Overview:
    total: int
    per_minute: list[Bar]
    statuses: list[Bar]
    errors: list[Bar]
    p50_ms: float | None
    p90_ms: float | None
    capped: bool


def overview(records: list[RunRow], now: float | None = None) -> Overview:
    """The last hour: runs per minute, the status mix, wall-time p50/p90, top error types."""
    now = time.time() if now is None else now
    minutes = OVERVIEW_WINDOW_S // 60
    per_minute = [0] * minutes
    for r in records:
        age = int((now - r.created_at) // 60)
        if 0 <= age < minutes:
            per_minute[minutes - 1 - age] += 1
    ran = [r.wall_ms for r in records if r.wall_ms > 0]
    errors = Counter(r.error_type for r in records if r.error_type)
    return Overview(
        total=len(records),
        per_minute=bars([(f"-{minutes - i}m", n) for i, n in enumerate(per_minute)]),
        statuses=bars(Counter(r.status for r in records).most_common()),
        errors=bars(errors.most_common(8)),
        p50_ms=percentile(ran, 0.5),
        p90_ms=percentile(ran, 0.9),
        capped=len(records) >= OVERVIEW_MAX_RUNS,
    )
