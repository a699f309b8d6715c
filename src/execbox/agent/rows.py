"""Rows by position: "the second order sold 30" names the second row of a printed frame, so its
numbers must be on that row. A frame is a run of output lines indexed 0, 1, 2, ... (pandas'
default index); its k-th row is the line indexed k - 1, its last the run's last line."""

from __future__ import annotations

import re
from collections.abc import Iterator

from .evidence import Evidence, Fact
from .ranks import ORDINAL, ordinal_number

_MAX_LINES = 20_000  # output lines read for frames; past them none is read
# The ordinal right before what a row is ("the second order", "the last row"): a word between
# ("the second East order", "the second biggest order") makes it a rank within something.
ROW_POSITION = re.compile(
    r"\b(?P<pos>" + ORDINAL + r"|last)\s+"
    r"(?:row|order|record|entry|sale|transaction|purchase|observation)\b",
    re.I,
)
_INDEXED = re.compile(r"\s*(\d{1,7})\s+\S")
_STDOUT = re.compile(r"stdout line (\d+):")


def frames(evidence: Evidence) -> list[list[str]]:
    """The printed frames, each as its rows' sources (`Fact.where`) in printed order."""
    found: list[list[str]] = []
    run: list[str] = []
    previous = -1
    for fact in evidence.texts[:_MAX_LINES]:
        line = _STDOUT.match(fact.where)
        indexed = _INDEXED.match(str(fact.value))
        number = int(line[1]) if line else -1
        if line and indexed and int(indexed[1]) == len(run) and number == previous + 1:
            run.append(fact.where)
        else:
            if len(run) >= 2:
                found.append(run)
            run = [fact.where] if line and indexed and indexed[1] == "0" else []
        previous = number
    if len(run) >= 2:
        found.append(run)
    return found


def positioned(text: str) -> Iterator[tuple[int, int, int]]:
    """The row positions the text names: (its end, the row's 1-based position or -1 for the
    last, the position of the sentence's end)."""
    for match in ROW_POSITION.finditer(text):
        pos = match["pos"].lower()
        end = re.compile(r"[.!?;\n]").search(text, match.end())
        yield (
            match.end(),
            -1 if pos == "last" else ordinal_number(pos),
            (end.start() if end else len(text)),
        )


def row_facts(evidence: Evidence, wheres: set[str]) -> dict[str, list[Fact]]:
    """The numbers each of the rows `wheres` shows, in one pass over the numbers."""
    out: dict[str, list[Fact]] = {where: [] for where in wheres}
    for fact in evidence.numbers:
        if fact.where in out:
            out[fact.where].append(fact)
    return out


# What pandas prints of a frame's size: its footer "[100 rows x 3 columns]", `df.shape`
# "(100, 3)" alone on a line or after "shape", a Series' "Length: 100".
_SHAPES = re.compile(
    r"^\s*\[(?P<rows>\d+) rows? x (?P<cols>\d+) columns?\]\s*$"
    r"|^\s*(?:\w*shape\w*['\"]?\s*[:=]?\s*)?\(\s*(?P<r>\d+),\s*(?P<c>\d+)\s*\)\s*$"
    r"|\bLength: (?P<length>\d+),",
    re.I,
)
# A count of a whole frame's rows or columns: "has 99 rows", "there are 3 data columns"; not
# of some of them ("3 rows have nulls", "there are 3 rows with nulls").
WHOLE_COUNT = re.compile(
    r"\b(?:has|have|had|contains?|containing|consists\s+of|comprises?|there\s+are|there\s+were"
    r"|total\s+of|in\s+all)\s+(?:(?:exactly|only|just|about|over|under|nearly|some)\s+)?$",
    re.I,
)
COUNTED_AXIS = re.compile(
    r"\s+(?:[\w-]+\s+)?(?:(?P<rows>rows|records|entries)|(?P<cols>columns|cols|fields))\b"
    r"(?!\s+(?:with|where|that|which|whose|have|had|has|are|were|contain\w*|missing|of|in\s+which)\b)",
    re.I,
)


def shapes(evidence: Evidence) -> tuple[set[int], set[int]]:
    """The row counts and the column counts the outputs print as a frame's size."""
    rows: set[int] = set()
    cols: set[int] = set()
    for fact in evidence.texts[:_MAX_LINES]:
        for match in _SHAPES.finditer(str(fact.value)):
            rows.add(int(match["rows"] or match["r"] or match["length"]))
            if match["cols"] or match["c"]:
                cols.add(int(match["cols"] or match["c"]))
    return rows, cols
