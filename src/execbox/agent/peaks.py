"""Dates at a series' extreme: "units peaked in 2023-03" names the date of the largest value of
a printed series of dated rows ("2023-02    35"), so it must be that row's date. A series is a
run of consecutive output lines each a date and one number; when no single series holds the
claimed date, nothing is said here (the date is grounded as shown)."""

from __future__ import annotations

import re

from .evidence import Evidence
from .models import Claim
from .quantities import numbers_in
from .values import DateKey, dates_in

_MAX_LINES = 20_000  # output lines read for series; past them none is read
_STDOUT = re.compile(r"stdout line (\d+):")
_CLAUSE = re.compile(r"[.;!?,\n]|\b(?:and|but|while|whereas)\b", re.I)
_PEAK = re.compile(
    r"\b(?:peak(?:ed|s|ing)?|highest|most|max(?:imum)?|busiest|largest|biggest|greatest|"
    r"strongest|best|top)\b",
    re.I,
)
_TROUGH = re.compile(
    r"\b(?:lowest|least|fewest|min(?:imum)?|smallest|weakest|worst|slowest|quietest|"
    r"bottom(?:ed)?|trough)\b",
    re.I,
)

Series = list[tuple[DateKey, float]]


def dated_series(evidence: Evidence) -> list[Series]:
    """The printed series of dated rows, each as (date, value) in printed order."""
    found: list[Series] = []
    run: Series = []
    previous = -1
    for fact in evidence.texts[:_MAX_LINES]:
        line = _STDOUT.match(fact.where)
        row = _dated_row(str(fact.value)) if line else None
        number = int(line[1]) if line else -1
        if row is None or number != previous + 1:
            if len(run) >= 2:
                found.append(run)
            run = []
        if row is not None:
            run.append(row)
        previous = number
    if len(run) >= 2:
        found.append(run)
    return found


def _dated_row(line: str) -> tuple[DateKey, float] | None:
    dates = list(dates_in(line))
    if len(dates) != 1 or len(dates[0][0]) != 1 or line[: dates[0][1].start()].strip():
        return None
    rest = line[dates[0][1].end() :]
    rest = re.sub(r"^\s+\d{2}:\d{2}(?::\d{2})?", "", rest)  # a timestamp's time of day
    values = list(numbers_in(rest))
    if len(values) != 1 or rest[values[0].end :].strip():
        return None
    return dates[0][0][0], values[0].value


def extreme_claim(
    text: str, start: int, end: int, keys: list[DateKey], evidence: Evidence, read: list[Series]
) -> Claim | None:
    """A refusal of the date at text[start:end] if its clause puts it at the top (or bottom)
    of the one printed series that holds it, and that series peaks (or bottoms out) elsewhere.
    `read`: the series, filled on first need."""
    starts = [m.end() for m in _CLAUSE.finditer(text, max(0, start - 200), start)]
    stop = _CLAUSE.search(text, end, end + 200)
    clause = text[starts[-1] if starts else max(0, start - 200) : stop.start() if stop else end]
    peak, trough = _PEAK.search(clause), _TROUGH.search(clause)
    if bool(peak) == bool(trough):
        return None
    if not read:  # read once per check, and only for a date put at an extreme
        read += dated_series(evidence) or [[]]
    held = [s for s in read if any(date in keys for date, _ in s)]
    if len(held) != 1:
        return None
    best = (min if trough else max)(value for _, value in held[0])
    at = [date for date, value in held[0] if value == best]
    if any(date in keys for date in at):
        return None
    shown = ", ".join("-".join(f"{part:02d}" for part in date if part is not None) for date in at)
    word = "bottoms out" if trough else "peaks"
    return Claim(
        text=text[start:end],
        kind="date",
        grounded=False,
        detail=f"the outputs' series {word} at {shown} ({best:g}), not this date",
    )
