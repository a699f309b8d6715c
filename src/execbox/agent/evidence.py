"""The evidence an answer may draw on: the numbers, dates and texts the outputs show, with
where each came from. Numbers are indexed by value (a claim costs a lookup, not a scan of a
large output) and only the first `MAX_NUMBERS` are read."""

from __future__ import annotations

import bisect
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..contract import Artifact
from .labels import LabelIndex, build
from .models import RunOutput
from .quantities import Found, normalize, numbers_in
from .values import LABEL_UNIT, blank, dates_in, durations_in, scale_of

TABLE_SUMMARY_BYTES = 1 << 20  # larger text artifacts are summarized by name and size only


@dataclass(frozen=True)
class Fact:
    value: Any  # float, DateKey or str
    run_id: str | None
    where: str
    step: float = 0.0  # a printed decimal's last digit: the value it stands for may be rounded
    unit: str | None = None  # the dimension its line gives it ("bytes" for "size_mb: 5")
    factors: tuple[float, ...] = (1.0,)  # to that dimension's base unit
    percent: bool = False  # a percentage's digits (50 of "50%")
    converted: bool = False  # a percentage's fraction (0.5 of "50%")


MAX_NUMBERS = 100_000  # numbers read from the evidence; later ones ground nothing
WINDOW_CAP = 5_000  # facts compared with one claim (a bound's range may hold many)


@dataclass(frozen=True)
class Context:
    """What the answer may restate without evidence: the question, the program, the inputs."""

    question: str
    code: str = ""
    file_names: tuple[str, ...] = ()
    file_heads: tuple[str, ...] = ()  # first lines (headers) of text inputs, for units


@dataclass
class Evidence:
    """What the answer may draw on: facts found in the outputs, and the texts they came from."""

    numbers: list[Fact]
    dates: list[Fact]
    texts: list[Fact]  # whole lines and strings, searched for quotes and units
    result: Any = None  # the result the answer relies on: a single value must be stated
    _index: list[tuple[float, int]] | None = None
    _plain: list[float] | None = None  # values a bound naming nothing must hold for, sorted
    _labels: set[str] | None = None  # the first 1-4 letters of every word of every label
    _factors: set[float] | None = None  # the unit factors the facts carry
    _blob: tuple[int, str] | None = None  # every text, casefolded, spaces collapsed
    _keyed: list[tuple[str, Fact]] = field(default_factory=list)  # a result dict's numbers
    _labels_index: tuple[frozenset[str], LabelIndex] | None = None

    def may_contain(self, wanted: str) -> bool:
        """Whether some text could contain `wanted` (casefolded): one substring search
        before the line-by-line check, so a literal claim does not scan a large output."""
        return wanted in self.folded()

    def folded(self) -> str:
        """Every text casefolded, its spaces collapsed, one line each: searched whole, a
        claim costs one pass over the outputs, not one per line."""
        if self._blob is None or self._blob[0] != len(self.texts):
            self._blob = (
                len(self.texts),
                "\n".join(" ".join(str(f.value).casefold().split()) for f in self.texts),
            )
        return self._blob[1]

    def _build(self) -> list[tuple[float, int]]:
        if self._index is None or len(self._index) != len(self.numbers):
            self._index = sorted((f.value, i) for i, f in enumerate(self.numbers))
            self._factors = {x for f in self.numbers for x in f.factors}
            self._plain = sorted(
                f.value for f in self.numbers if not f.percent and not f.where.startswith("len(")
            )
            self._labels = {
                w[:n]
                for where in {f.where for f in self.numbers}
                for w in re.findall(r"[a-z]+", label_of(where))
                for n in range(1, 5)
            }
        return self._index

    def near(self, low: float, high: float) -> list[Fact]:
        """The facts whose value is within [low, high]: a claim costs a lookup, not a scan."""
        index = self._build()
        lo = bisect.bisect_left(index, (low, -1))
        hi = bisect.bisect_right(index, (high, len(index)))
        return [self.numbers[i] for _, i in index[lo : min(hi, lo + WINDOW_CAP)]]

    def factor_set(self) -> set[float]:
        self._build()
        return self._factors or {1.0}

    def nearest(self, value: float) -> Fact | None:
        index = self._build()
        at = bisect.bisect_left(index, (value, -1))
        near = [index[i][0] for i in (at - 1, at) if 0 <= i < len(index)]
        if not near:
            return None
        best = min(near, key=lambda v: abs(v - value))  # of equals, the first shown
        return self.numbers[index[bisect.bisect_left(index, (best, -1))][1]]

    def plain_extremes(self) -> list[float]:
        """The smallest, smallest nonzero and largest plain values: a bound (an interval, and
        0 for "fewer than") holds for all of them only if it holds for these."""
        self._build()
        plain = self._plain or []
        nonzero = plain[bisect.bisect_right(plain, 0.0) :][:1]
        return [*plain[:1], *nonzero, *plain[-1:]]

    def label_index(self, wanted: frozenset[str]) -> LabelIndex:
        """The outputs' row labels, keys and column headers made of `wanted` words, with
        their numbers; built once for a set of words."""
        if self._labels_index is None or self._labels_index[0] != wanted:
            lines = (
                (line, fact.where)
                for fact in self.texts
                if fact.where.startswith(("stdout line", "result"))
                for line in str(fact.value).splitlines()
            )
            index = build(lines, wanted)
            for key, fact in self._keyed:
                found = Found(fact.value, fact.step, 0, 0, fact.unit, fact.percent)
                index.add(key, "key", found, fact.where)
            self._labels_index = (wanted, index)
        return self._labels_index[1]

    def labelled(self, stem: str) -> bool:
        self._build()
        return stem in (self._labels or set())

    @classmethod
    def of(
        cls,
        outputs: Iterable[RunOutput],
        artifacts: Iterable[Artifact],
        artifacts_run: str | None = None,
    ) -> Evidence:
        ev = cls([], [], [])
        for out in outputs:
            for n, line in enumerate(out.stdout.splitlines(), 1):
                if line.strip():
                    ev.add_text(line, out.run_id, f"stdout line {n}: {line.strip()[:160]}")
            if out.result is not None:
                ev.add_value(out.result, out.run_id, "result")
                ev.result = out.result
        arts = list(artifacts)
        for art in arts:
            where = f"artifact {art.path} ({art.size} bytes, {art.mime_type})"
            ev.texts.append(Fact(where, artifacts_run, where))
            ev.numbers.append(Fact(float(art.size), artifacts_run, where, unit="bytes"))
            ev.add_table_summary(art, artifacts_run)
        if arts:
            ev.numbers.append(Fact(float(len(arts)), artifacts_run, f"{len(arts)} artifacts"))
        return ev

    def add_table_summary(self, art: Artifact, run_id: str | None) -> None:
        """A text file's summary: its first line (a table's columns) and how many lines and
        data rows it has. Its values are not evidence: the answer cites what was printed."""
        if (
            art.data is None
            or not art.mime_type.startswith("text/")
            or art.size > TABLE_SUMMARY_BYTES
        ):
            return
        text = art.data.decode("utf-8", "replace")
        lines = text.splitlines()
        if not lines:
            return
        where = f"artifact {art.path}: {len(lines)} lines, first: {lines[0][:120]}"
        self.texts.append(Fact(lines[0], run_id, where))
        self.numbers.append(Fact(float(len(lines)), run_id, where))
        self.numbers.append(Fact(float(len(lines) - 1), run_id, where + " (rows after it)"))

    def add_text(self, text: str, run_id: str | None, where: str) -> None:
        text = normalize(text)
        self.texts.append(Fact(text, run_id, where))
        if len(self.numbers) >= MAX_NUMBERS:
            return  # the check's cost stays bounded: later numbers are not read
        spans = []
        for keys, match in dates_in(text):
            self.dates.append(Fact(tuple(keys), run_id, where))  # "03/05" has two readings
            self.numbers.append(Fact(float(keys[0][0]), run_id, where))
            spans.append(match.span())
        masked = blank(text, spans)
        spans = []
        for seconds, step, match in durations_in(masked):
            self.numbers.append(Fact(seconds, run_id, where, step, "s"))
            spans.append(match.span())
        masked = blank(masked, spans)
        label_from = 0
        for found in numbers_in(masked):
            if len(self.numbers) >= MAX_NUMBERS:
                return
            spelled = found.unit
            if spelled is None:  # its label names its unit: "size_mb: 5"
                label = [m[1] for m in LABEL_UNIT.finditer(masked, label_from, found.start)]
                spelled = label[-1] if label else None
                if spelled is not None and re.fullmatch(r"[kmgt]i?b", spelled, re.I):
                    spelled = spelled[:-1] + "B"  # "size_mb": labels are lower case, bytes
            label_from = found.end
            unit, factors = scale_of(spelled) if spelled else (None, (1.0,))
            self.numbers.append(
                Fact(
                    found.value,
                    run_id,
                    where,
                    found.step,
                    unit,
                    factors,
                    found.percent,
                    found.converted,
                )
            )

    def add_value(self, value: Any, run_id: str | None, path: str) -> None:
        if isinstance(value, bool) or value is None:
            return
        if isinstance(value, (int, float)):
            if math.isfinite(value):
                self.numbers.append(
                    Fact(float(value), run_id, f"{path} = {value!r}", _printed_step(value))
                )
            return
        if isinstance(value, str):
            self.add_text(value, run_id, f"{path} = {value[:160]!r}")
            return
        if isinstance(value, dict):
            for key, item in value.items():
                self.add_text(str(key), run_id, f"{path} key {str(key)[:80]!r}")
                first = len(self.numbers)
                self.add_value(item, run_id, f"{path}[{json.dumps(key)}]")
                self._keyed += [
                    (str(key), f) for f in self.numbers[first:] if not f.where.startswith("len(")
                ]
        elif isinstance(value, list):
            for i, item in enumerate(value):
                self.add_value(item, run_id, f"{path}[{i}]")
        else:
            return
        # How many items there are ("3 regions") is shown by the result too.
        self.numbers.append(Fact(float(len(value)), run_id, f"len({path}) = {len(value)}"))


def _printed_step(value: float) -> float:
    """The step of a float's last printed decimal (0.6667 -> 0.0001); an int is exact."""
    if isinstance(value, int):
        return 0.0
    mantissa, _, exp = repr(value).partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exp or 0) - decimals) if decimals else 0.0


def label_of(where: str) -> str:
    """The words a fact's source names it by (a stdout line without its number prefix)."""
    return where.partition(": ")[2].lower() if where.startswith("stdout") else where.lower()
