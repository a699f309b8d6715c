"""Which label a value belongs to: an output's row labels, keys and column headers, each with
the numbers on its line, under its key or in its column (a MultiIndex's levels each label their
rows); and the labels an answer ties a number to ("South sold 143", "the median (3.9)", "12
users", "143 for East", "98 is East's total", "For East, B was 77").

Read conservatively: a line or table whose shape is not clear gives no labels (a prose line
"Processed 500 rows in 3 s" says nothing of what "rows" holds), and a claim is tied only to
labels the outputs show. The index is built once, line by line: a claim costs a dict lookup.
"""

from __future__ import annotations

import contextlib
import datetime
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from .printed import Reader, literal_labels
from .quantities import Found, numbers_in
from .values import UNIT_AFTER, blank, dates_in, durations_in

MAX_CELLS = 2_000  # numbers kept per label; a label with more is not checked (bounded cost)
MAX_LINES = 20_000  # lines read for the answer's labels; past it none is checked
_MAX_WORDS = 4  # a label of more words is prose, not a label
# An answer's word for a label pandas and numpy print in short ("median" is describe()'s 50%).
ALIASES = {
    "median": "50%",
    "average": "mean",
    "maximum": "max",
    "minimum": "min",
    "longest": "max",  # "the longest gap" of a printed "max gap"
    "shortest": "min",
    "standard deviation": "std",
    "accuracy": "acc",
    "lower quartile": "25%",
    "upper quartile": "75%",
}
_PERCENTILE_ROW = re.compile(r"\s*(\d{1,2}%)\s+(?=[-\d.])")

# Words that are never a label on the answer's side ("the", "is").
_NOT_LABELS = {
    "a",
    "an",
    "the",
    "is",
    "was",
    "are",
    "were",
    "of",
    "in",
    "for",
    "to",
    "at",
    "by",
    "and",
    "or",
    "with",
    "it",
    "its",
    "has",
    "had",
    "have",
    "be",
    "there",
    "this",
    "that",
    "value",
    "values",
    "total",
    "result",
}
# Between two labels, these make the sentence compare or list them: no tie is read.
_LISTING = re.compile(
    r"\b(?:and|or|than|vs\.?|versus|beat|beats|over|compared|while|whereas|but|respectively)\b",
    re.I,
)
# Words that part a label from a number after it: "sales in 2023", "revenue for East was 2.1".
_APART = {"in", "for", "at", "on", "during", "since", "after", "before", "per", "from", "over"}
# A label in parentheses right after a number, or after the word it counts.
_ASIDE = re.compile(r"\s*(?:[A-Za-z]+\s+){0,2}\(\s*(?P<label>[^()]{1,60}?)\s*\)")
_PREPOSITION = re.compile(r"\s+(?:for|in|at|from|by)\s+", re.I)
_WORD = re.compile(r"[a-z_][a-z0-9_%]*", re.I)
_KEY = re.compile(r"""(?P<key>[A-Za-z_][\w .%/-]{0,60}?)['"]?\s*(?:[:=](?![=/]))""")
_CLAUSE_END = re.compile(r"[.;!?,\n]|\s-\s|\u2014")
_SENTENCE_END = re.compile(r"[.;!?](?=\s|$)|\n")
# A clause that goes on about the subject before it: "East, with 98", "East, which sold 98".
_GOES_ON = re.compile(r"\s*(?:(?:which|who|with|having|at)\b.*)?$", re.I | re.S)
_PRONOUN = re.compile(r"\s*(?:it|its|they|their|this|that|he|she)\b", re.I)


def norm_label(text: str) -> str:
    """A label compared across output and answer: casefolded, "_" and "-" as spaces, quotes,
    asterisks and a possessive "'s" gone."""
    text = re.sub(r"['\u2019]s\b", "", text.casefold())
    text = re.sub(r"[_\-]+", " ", text)
    text = re.sub(r"[^\w% ]+", " ", text)
    return " ".join(text.split())


@dataclass
class Cells:
    """The numbers a label holds and how the outputs show it (row, key, column)."""

    values: list[tuple[float, float, bool, str | None, str]] = field(default_factory=list)
    kinds: set[str] = field(default_factory=set)
    overflow: bool = False


@dataclass
class LabelIndex:
    """Every label the outputs show, with its numbers (value, step, percent, unit, where)."""

    cells: dict[str, Cells] = field(default_factory=dict)

    def add(self, label: str, kind: str, found: Found, where: str) -> None:
        key = norm_label(label)
        if not key or not re.search(r"[a-z%]", key) or len(key.split()) > _MAX_WORDS:
            return
        cells = self.cells.setdefault(key, Cells())
        cells.kinds.add(kind)
        if len(cells.values) >= MAX_CELLS:
            cells.overflow = True
            return
        cells.values.append((found.value, found.step, found.percent, found.unit, where))

    def add_period(self, kind: str, value: int, found: Found, where: str) -> None:
        """A number on a row a date or period labels ("2023-02-01   35"): its month, quarter,
        year and weekday each label it, as `period_label` names them."""
        cells = self.cells.setdefault(period_label(kind, value), Cells())
        cells.kinds.add("row")
        if len(cells.values) >= MAX_CELLS:
            cells.overflow = True
            return
        cells.values.append((found.value, found.step, found.percent, found.unit, where))

    def get(self, label: str) -> Cells | None:
        cells = self.cells.get(label)
        return None if cells is None or cells.overflow or not cells.values else cells


def period_label(kind: str, value: int) -> str:
    """The label of the rows a date or period of `kind` (month, quarter, year, weekday) with
    `value` labels; no answer's words spell it."""
    return f"\0{kind} {value}"


# A Series indexed by dates or periods, as pandas prints it: "2023-02-01    35", "2023Q1  85".
_DATED_ROW = re.compile(
    r"(?P<y>\d{4})(?:-(?P<m>\d\d)(?:-(?P<d>\d\d))?(?:[ T]\d\d:\d\d(?::\d\d)?)?|-?Q(?P<q>[1-4]))"
    r"\s+(?P<n>-?\d+(?:\.(?P<decimals>\d+))?)\s*"
)
# The words that name a period: the dated rows are read only for an answer that has one.
_PERIOD_WORDS = re.compile(
    r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec|mon|tue|wed|thu|fri|sat|sun)[a-z]*"
    r"|q[1-4]|quarter|first|second|third|fourth"
)


def _read_dated(text: str, where: str, index: LabelIndex) -> bool:
    """Whether `text` is a dated row (read into `index`)."""
    row = _DATED_ROW.fullmatch(text) if text[:1].isdigit() else None
    if row is None:
        return False
    step = 10.0 ** -len(row["decimals"]) if row["decimals"] else 1.0
    found = Found(float(row["n"]), step, row.start("n"), row.end("n"))
    year = int(row["y"])
    if row["q"]:
        index.add_period("quarter", int(row["q"]), found, where)
        index.add_period("year", year, found, where)
        return True
    month = int(row["m"] or 0)
    if not 1 <= month <= 12:
        return False
    index.add_period("month", month, found, where)
    index.add_period("quarter", (month - 1) // 3 + 1, found, where)
    index.add_period("year", year, found, where)
    if row["d"]:
        with contextlib.suppress(ValueError):  # no such day
            weekday = datetime.date(year, month, int(row["d"])).weekday()
            index.add_period("weekday", weekday, found, where)
    return True


def _masked(text: str) -> str:
    """`text` with dates and compound durations blanked: their digits are not cells."""
    dates = [match.span() for _, match in dates_in(text)]
    return blank(text, [*dates, *(match.span() for _, _, match in durations_in(text))])


def _numbers(text: str) -> list[Found]:
    """The numbers of `text`, a percentage once (as its fraction and its digits)."""
    return list(numbers_in(text))


def _end_of(text: str, found: Found) -> int:
    unit = UNIT_AFTER.match(text, found.end)
    return unit.end() if unit else found.end


def build(lines: Iterable[tuple[str, str]], wanted: frozenset[str]) -> LabelIndex:
    """The label index of output lines, given in order as (text, where), for the labels made
    of `wanted` words (the answer's): other lines are skipped, so the cost follows the lines
    that name them."""
    index = LabelIndex()
    if not wanted:
        return index
    names = re.compile(
        r"(?<![a-z])(?:"
        + "|".join(re.escape(w) for w in sorted(wanted, key=len, reverse=True))
        + r")(?![a-z])"
    )
    table: _Columns | None = None
    delimited: tuple[str, list[str]] | None = None
    printed = Reader()
    # Dated rows are read for an answer that names a period, as many as lines are read.
    dated = MAX_LINES if any(_PERIOD_WORDS.fullmatch(w) for w in wanted) else 0
    read = 0
    for raw, where in lines:
        _read_printed(printed, raw, where, index)
        if dated and _read_dated(raw, where, index):
            dated -= 1
        relevant = names.search(raw.casefold()) is not None
        if table is not None and table.names_line(raw):
            continue
        if not relevant:
            if re.search(r"\d", raw) is None:  # a blank line or a header of no wanted label
                table, delimited = _unwanted_header(raw, table, index), None
            if (table is None or table.full) and not (delimited and delimited[1]):
                continue
        read += 1
        if read > MAX_LINES:
            return LabelIndex()  # too large to read whole: no label is checked
        text = _masked(raw.rstrip())
        delimited = _read_delimited(text, where, delimited, index)
        if delimited is not None or relevant and _read_timed(raw, where, index):
            continue
        found = _numbers(text)
        if not found:
            if table is not None:
                table.commit(index)
            header = _header(text)
            table = _Columns(header) if header else None
            continue
        if table is not None:
            table.read(text, found, where)
        if not relevant:
            continue
        _read_line(text, found, where, index)
    if table is not None:
        table.commit(index)
    return index


# "max gap: 34 days 00:00:00", "elapsed = 1:30:00": a key whose whole value is one duration.
_TIMED = re.compile(r"\s*(?P<label>[A-Za-z_][\w %]{0,60}?)\s*[:=]\s*(?P<value>\S.*?)\s*")


def _read_timed(raw: str, where: str, index: LabelIndex) -> bool:
    """A key's duration, in seconds (masked as a whole elsewhere, its digits are no cells)."""
    line = _TIMED.fullmatch(raw)
    if line is None:
        return False
    found = list(durations_in(line["value"]))
    if len(found) != 1 or found[0][2].span() != (0, len(line["value"])):
        return False
    seconds, step, _ = found[0]
    index.add(line["label"], "key", Found(seconds, step, 0, 0, "s", False), where)
    return True


def _unwanted_header(raw: str, table: _Columns | None, index: LabelIndex) -> _Columns | None:
    """A line of words or none ends the table; its words may still name the levels of an
    index whose rows hold wanted labels ("region  product" over "East    A    143")."""
    if table is not None:
        table.commit(index)
    header = _header(raw.rstrip())
    return _Columns(header) if header and len(header) > 1 else None


def _read_printed(printed: Reader, raw: str, where: str, index: LabelIndex) -> None:
    """Every line that may open, go on with or hold a printed value, relevant or not: a
    value's labels may be lines away from its numbers."""
    if printed.reading or "[" in raw or "{" in raw:
        for label, kind, f, at in printed.read(_masked(raw.rstrip()), where):
            index.add(label, kind, f, at)


def _read_line(text: str, found: list[Found], where: str, index: LabelIndex) -> None:
    """One line's own labels: its keys, else its row labels."""
    percentile = _PERCENTILE_ROW.match(text)
    if percentile:  # describe()'s "50%   100.5   3.5": the % row holds the values after it
        for f in found:
            if f.start >= percentile.end():
                index.add(percentile[1], "row", f, where)
    elif not _read_keys(text, found, where, index):
        _read_row(text, found, where, index)
    _read_pairs(text, found, where, index)
    for label, kind, f, at in literal_labels(text, found, where):
        index.add(label, kind, f, at)
    _read_counted(text, found, where, index)


# One label of a line of several: a word or three, then a "=" or ":" or only spaces.
_PAIR = re.compile(
    r"[\s,;|]*(?:(?P<prefix>[A-Za-z_][\w%]*)\s*:\s*(?=[A-Za-z_]))?"
    r"(?P<label>[A-Za-z_][\w%.]*(?:[ \t]+[A-Za-z_][\w%.]*){0,2}?)[ \t]*(?P<sep>[:=]|=>|->)?[ \t]*"
)
# Words that make a line prose ("Processed 500 rows in 3 s"), not labelled numbers.
_PROSE = _APART | {"of", "with", "to", "by", "and", "or", "the", "is", "are", "was", "were"}


def _read_pairs(text: str, found: list[Found], where: str, index: LabelIndex) -> None:
    """'p50=12ms p99=30ms', 'min 3 max 9 mean 5.5', 'East: 143, West: 98', 'latency: p50
    12ms, p99 30ms': each number is the label's right before it, since the previous number
    (its unit too). Read only when every number has its own label and nothing else is on the
    line; a leading "key:" labels them all."""
    numbers = [f for i, f in enumerate(found) if not i or f.start != found[i - 1].start]
    if len(numbers) < 2 or text[_end_of(text, numbers[-1]) :].strip(" \t,;.|"):
        return
    pos, pairs = 0, []
    for i, f in enumerate(numbers):
        pair = _PAIR.fullmatch(text, pos, f.start)
        if pair is None or (i and pair["prefix"]):
            return
        words = pair["label"].casefold().split()
        if _PROSE.intersection(words):
            return
        kind = "key" if pair["sep"] else "row"
        # "latency p50=12ms": the word before "=" names the value, the words before it too.
        names = [pair["label"], *([words[-1]] if pair["sep"] and len(words) > 1 else [])]
        pairs += [(name, kind, g) for name in names for g in found if g.start == f.start]
        if pair["prefix"]:
            pairs += [(pair["prefix"], "key", g) for g in found]
        pos = _end_of(text, f)
    for label, kind, f in pairs:
        index.add(label, kind, f, where)


_COUNTED_HEAD = re.compile(
    r"\s*(?P<label>[A-Za-z][\w'.]*(?: [A-Za-z][\w'.]*){0,3}?)"
    r"\s*(?:[:=]|\s[-\u2013\u2014]|\s(?:sold|had|has|made|got|with))?\s*",
    re.I,
)
_COUNTED_TAIL = re.compile(r"\s+[A-Za-z]+\.?\s*(?:\(\s*(?P<share>[^()]*?)\s*\))?\s*")


def _read_counted(text: str, found: list[Found], where: str, index: LabelIndex) -> None:
    """'East      143 units', 'East - 143 units', 'East sold 143 units' and 'East: 143 units
    (12%)': a label, one number and the word it counts, perhaps with a share in parentheses;
    the label holds the number and the share."""
    head = _COUNTED_HEAD.fullmatch(text, 0, found[0].start)
    tail = _COUNTED_TAIL.fullmatch(text, found[0].end)
    if head is None or tail is None:
        return
    shares = found[1:]  # a percentage comes as its digits and its fraction, on one span
    if shares and not (
        tail["share"] is not None
        # a number's span may take the parenthesis in, as an accounting negative would
        and all(tail.start("share") - 1 <= f.start < f.end <= tail.end("share") for f in shares)
        and any(f.percent for f in shares)
    ):
        return
    for f in found:
        index.add(head["label"], "row", f, where)


# Verbs whose preposition belongs to them: "West accounts for 29%", "North brought in $110",
# "units range from 5 to 30".
_PHRASAL = {
    "account",
    "accounts",
    "accounted",
    "bring",
    "brings",
    "brought",
    "take",
    "takes",
    "took",
    "pull",
    "pulls",
    "pulled",
    "came",
    "comes",
    "ended",
    "ends",
    "totals",
    "totalled",
    "totaled",
    "range",
    "ranges",
    "ranged",
    "vary",
    "varies",
    "varied",
}
# A capital "A" inside a sentence is a label (product A), not the article.
_LETTER_A = re.compile(r"(?<=[\w,'\u2019)])[ \t]+A\b(?![\w'\u2019])")


def _answer_words(text: str, start: int = 0, end: int | None = None) -> list[str]:
    """The answer's words in text[start:end], normalized as labels; a capital "A" that is no
    article reads as the label "a", the article as "an" (never a label)."""
    end = len(text) if end is None else end
    text = re.sub(r"['\u2019]s\b", lambda m: " " * len(m[0]), text)  # keeps the offsets
    letters = {m.end() - 1 for m in _LETTER_A.finditer(text, max(0, start - 2), end)}
    words: list[str] = []
    for match in _WORD.finditer(text, start, end):
        word = norm_label(match[0])
        if word == "a":
            word = "\0a" if match.start() in letters else "an"
        elif word in _APART and words and words[-1] in _PHRASAL:
            word = "an"  # "accounts for", "brought in": the verb's, parting nothing
        words += word.split()
    return words


def wanted_words(text: str) -> frozenset[str]:
    """The words of an answer that may name a label, in the singular and plural, and the
    short forms of its aliases."""
    words = {w for w in _WORD.findall(norm_label(text)) if w not in _NOT_LABELS}
    if _LETTER_A.search(text):
        words.add("a")
    words |= {_other_number(w) for w in words}
    return frozenset(words | {a for w, a in ALIASES.items() if w.split()[-1] in words})


def _other_number(word: str) -> str:
    """'users' for 'user', 'user' for 'users': a label shown in the other number."""
    return word[:-1] if word.endswith("s") and len(word) > 3 else word + "s"


# Words a printed label may put before a name ("Region East: 143"), as pandas' groupby does.
_CATEGORIES = (
    "region",
    "product",
    "category",
    "group",
    "team",
    "country",
    "city",
    "store",
    "segment",
    "department",
    "class",
    "type",
    "customer",
    "user",
    "model",
    "branch",
    "site",
    "channel",
)


def lookup(gram: str, index: LabelIndex) -> str | None:
    """The label an answer's words name: themselves, or their alias if only that is shown."""
    if gram in _NOT_LABELS:
        return None
    gram = gram.replace("\0", "")  # a capital "A" (see `_answer_words`)
    if index.get(gram) is not None:
        return gram
    head, _, last = gram.rpartition(" ")
    other = f"{head} {_other_number(last)}".strip()  # "user count": a shown "users"
    if index.get(other) is not None:
        return other
    if not head:  # "East" of a shown "Region East": the category word is no part of its name
        for category in _CATEGORIES:
            if index.get(f"{category} {gram}") is not None:
                return f"{category} {gram}"
    turned = " ".join(reversed(gram.split()))  # "Region East" of a shown "East Region"
    if head and " " not in head and index.get(turned) is not None:
        return turned
    alias = ALIASES.get(gram)
    if alias is None and " " in gram:  # "train accuracy" for a shown "train acc"
        alias = " ".join(ALIASES.get(word, word) for word in gram.split())
    return alias if alias is not None and index.get(alias) is not None else None


_TEXT_CELL = re.compile(r"[A-Za-z][\w.&'-]*")


@dataclass
class _Columns:
    """A whitespace table (pandas prints): a column is read only if every row has a number
    aligned with its header word, at its right edge or its left. Under the header, a line of
    words only names the index's levels (pandas' MultiIndex and pivot tables): a row's words
    are its labels, one per level, and a level a row leaves blank is the row's above."""

    header: list[tuple[int, int, str]]
    rows: int = 0
    cells: dict[int, list[tuple[Found, str]]] = field(default_factory=dict)
    levels: list[tuple[int, int, str]] = field(default_factory=list)
    current: list[str] = field(default_factory=list)  # the last row's label at each level
    labelled: list[tuple[str, Found, str]] = field(default_factory=list)

    @property
    def full(self) -> bool:
        return self.rows > MAX_CELLS  # its columns would not be checked: stop reading

    def names_line(self, text: str) -> bool:
        """Whether `text` names the levels of the index under this header (read here)."""
        if self.rows or self.levels or not text.strip() or re.search(r"\d", text):
            return False
        levels = _header(text.rstrip())
        if levels is None or levels[-1][1] > self.header[-1][1]:
            return False
        self.levels = levels
        return True

    def _row_labels(self, text: str, first: int) -> list[str]:
        """The row's label at each level: its words before the first number, each at the
        level whose name starts at or before it, the blank levels carried from above."""
        labels = list(self.current) + [""] * (len(self.levels) - len(self.current))
        words = [(m.start(), m[0]) for m in re.finditer(r"\S+", text[:first])]
        given = [i for i, _ in enumerate(self.levels)]
        at_level: dict[int, list[str]] = {}
        for start, word in words:
            level = max([i for i in given if self.levels[i][0] <= start] or [0])
            at_level.setdefault(level, []).append(word)
        if not at_level:
            return []
        top = min(at_level)
        labels[top:] = [" ".join(at_level.get(i, [])) for i in range(top, len(self.levels))]
        self.current = labels
        return [label for label in labels if label]

    def read(self, text: str, found: list[Found], where: str) -> None:
        self.rows += 1
        if self.full:
            return
        if self.rows == 1 and not self.levels and found[0].start > self.header[-1][1]:
            self.levels = self.header  # a Series: its header names the index's levels only
        if len(self.levels) > 1:
            for label in self._row_labels(text, found[0].start):
                self.labelled += [(label, f, where) for f in found]
        elif not text[: found[0].start].strip():
            # A record's text cells after its index ("0  East  A  12"), each under its header
            # word: they label the row's other numbers.
            edges = {s for s, _, _ in self.header} | {e for _, e, _ in self.header}
            for cell in _TEXT_CELL.finditer(text, found[0].end):
                if cell.start() in edges or cell.end() in edges:
                    self.labelled += [(cell[0], f, where) for f in found[1:]]
        for f in found:
            end = _end_of(text, f)
            at = [i for i, (s, e, _) in enumerate(self.header) if e == end or s == f.start]
            if len(at) == 1:
                self.cells.setdefault(at[0], []).append((f, where))

    def commit(self, index: LabelIndex) -> None:
        for label, f, where in self.labelled:
            index.add(label, "row", f, where)
        for i, cells in self.cells.items():
            if not self.full and len({where for _, where in cells}) == self.rows == len(cells):
                for f, where in cells:
                    index.add(self.header[i][2], "column", f, where)


def _header(text: str) -> list[tuple[int, int, str]] | None:
    """A whitespace table's header: words only, no sentence punctuation."""
    if re.search(r"[.:,;!?=()\[\]{}]", text) or not re.search(r"[A-Za-z]", text):
        return None
    words = [(m.start(), m.end(), m[0]) for m in re.finditer(r"\S+", text)]
    return words if len(words) <= 12 else None


def _cells(text: str) -> tuple[str, list[str]] | None:
    stripped = text.strip()
    for sep in ("|", "\t", ","):
        if sep in stripped:
            inner = stripped.strip("|") if sep == "|" else stripped
            return sep, [c.strip() for c in inner.split(sep)]
    return None


def _single_number(cell: str) -> Found | None:
    found = _numbers(cell)
    if not found:
        return None
    first = found[0]
    rest = cell[_end_of(cell, first) :].strip()
    return first if not rest and not cell[: first.start].strip() else None


def _read_delimited(
    text: str, where: str, table: tuple[str, list[str]] | None, index: LabelIndex
) -> tuple[str, list[str]] | None:
    """CSV, TSV and Markdown rows: a header of names, then rows of a label and numbers."""
    split = _cells(text)
    if split is None or len(split[1]) < 2 or (":" in text and split[0] != "|"):
        return None
    sep, cells = split
    if sep == "|" and all(re.fullmatch(r":?-{2,}:?", c) for c in cells):
        return table  # Markdown's rule under the header
    numbers = [_single_number(c) for c in cells]
    if all(n is None and re.search(r"[A-Za-z]", c) for n, c in zip(numbers, cells, strict=True)):
        return sep, cells  # a header
    label = cells[0] if numbers[0] is None and re.search(r"[A-Za-z]", cells[0]) else None
    if any(n is None and c for n, c in zip(numbers[1:], cells[1:], strict=True)):
        return None  # text cells besides the label: not read
    names = (
        table[1] if table is not None and table[0] == sep and len(table[1]) == len(cells) else []
    )
    for i, number in enumerate(numbers):
        if number is None:
            continue
        if label is not None:
            index.add(label, "row", number, where)
        if names:
            index.add(names[i], "column", number, where)
    return table if names else (sep, [])


def _read_keys(text: str, found: list[Found], where: str, index: LabelIndex) -> bool:
    """'key: 3', "{'mean': 3, 'max': 4}", 'ci: (0.2, 0.9)': a number right after a key (only
    punctuation between) is that key's. A key right after a number ("over 3 runs: 5") counts
    only on a line that starts with a key."""
    keys = []
    starts_with_key = False
    lead = len(text) - len(text.lstrip())
    for match in _KEY.finditer(text):
        # A window before the key, not the line so far: the cost stays linear.
        before = text[max(lead, match.start() - 80) : match.start()].rstrip().rstrip("'\"")
        before = before.rstrip() if match.start() - lead < 80 else before.rstrip() or "?"
        key = match["key"].strip().strip("'\"")
        if not before or before.endswith(("{", ",", ";", "|", "(", "[")):
            if not before:
                starts_with_key = True
            keys.append((match.end(), key))
        elif re.search(r"\d$", before):
            keys.append((match.end(), key) if starts_with_key else (match.end(), ""))
    if not keys:
        return False
    at, owned, previous = -1, False, 0
    for f in found:  # one pass: keys and numbers are both in order
        while at + 1 < len(keys) and keys[at + 1][0] <= f.start:
            at, owned, previous = at + 1, True, keys[at + 1][0]
        # Only punctuation since the key or its previous number: "rows: 5 in 3" owns 5 only.
        owned = owned and at >= 0 and not re.search(r"[A-Za-z]", text[previous : f.start])
        if owned and keys[at][1]:
            index.add(keys[at][1], "key", f, where)
        previous = _end_of(text, f)
    return True


def _read_row(text: str, found: list[Found], where: str, index: LabelIndex) -> None:
    """'North    31', '0  North  120  1.2e+06', 'min 9 max 3': labels, each followed by its
    numbers; the line must end with a number. A label after a number must be one word."""
    if text[_end_of(text, found[-1]) :].strip():
        return  # "500 rows": the words after a number are its unit, not a label
    pos, label, runs = 0, "", []
    for i, f in enumerate(found):
        between = text[pos : f.start].strip(" \t:=|")
        if re.search(r"[A-Za-z]", between):
            if i > 0 and len(between.split()) > 1:
                return
            if i > 1 and not label:
                return  # "3 4 North 5": not a row
            label = between
        elif between:
            return  # other punctuation: not a plain row
        elif i == 0:
            pos = _end_of(text, f)
            continue  # a leading index (pandas prints one)
        if label:
            runs.append((label, f))
        pos = _end_of(text, f)
    for label, f in runs:
        index.add(label, "row", f, where)


# -- the answer's side ----------------------------------------------------------------------


def _grams(words: list[str]) -> Iterator[tuple[int, str]]:
    """Each run of up to `_MAX_WORDS` words, with the index of its last word."""
    for end in range(len(words)):
        for n in range(1, _MAX_WORDS + 1):
            if end - n + 1 >= 0:
                yield end, " ".join(words[end - n + 1 : end + 1])


def tied_labels(
    text: str, start: int, end: int, previous_end: int, next_start: int, index: LabelIndex
) -> list[str]:
    """The labels the answer ties the number at [start, end) to: the labels just before it in
    its clause, since the previous number ("South sold 143", "the median (3.9)"), and the one
    right after it ("12 users", "143 for East"). A clause that lists or compares labels
    ("North and South had 31") ties none before the number; a label the previous number
    names ("5 files had 12") or one a preposition parts from it ("sales in 2023") is not
    this number's. A row named later in the clause ("98 is East's total") or in the
    sentence's opening ("For East, B was 77") is the number's too."""
    labels: list[str] = []
    head = max(previous_end, start - 200, 0)  # a window: the cost stays linear
    pair = _correlated(text, head, start, index)
    if pair:
        return pair
    clause = max([head, *(m.end() for m in _CLAUSE_END.finditer(text, head, start))])
    before = text[clause:start]
    listing = list(_LISTING.finditer(before))
    # "5 files had 12": the words right after the previous number are its own.
    first = 1 if clause == previous_end and re.match(r"\s+[A-Za-z]", before) else 0
    if listing and clause == previous_end:
        before = before[listing[-1].end() :]  # "12 users and 7 admins": users is 12's
        first = 0
    words = _answer_words(text, start - len(before), start)
    first, words = max(0, first - max(0, len(words) - 6)), words[-6:]
    named = [
        (last - len(g.split()) + 1, last, label)
        for last, g in _grams(words)
        if last - len(g.split()) + 1 >= first
        and not _APART.intersection(words[last + 1 :])
        and (label := lookup(g, index)) is not None
    ]
    # "conversion rate" is the shown "conversion_rate", not a shown "conversions" too.
    found = [
        label
        for a, b, label in named
        if not any(c <= a and b <= d and (c, d) != (a, b) for c, d, _ in named)
    ]
    if found and (clause == previous_end or not listing):
        labels += found
    elif not found and not listing and clause > head:
        labels += _carried(text, head, clause, text[clause:start], index)
    stop = _CLAUSE_END.search(text, end, min(next_start, end + 200))
    after_end = stop.start() if stop else min(next_start, end + 200)
    after = text[end:after_end]
    lead = _PREPOSITION.match(after)
    kinds = {"row", "key", "column"} if lead else {"key", "column"}
    if lead or re.match(r"\s+[A-Za-z]", after):
        spans = list(_WORD.finditer(after, lead.end() if lead else 0))
        letters = {m.end() - 1 for m in _LETTER_A.finditer(text, max(0, end - 2), after_end)}
        words = ["\0a" if end + m.start() in letters else norm_label(m[0]) for m in spans]
        for n in range(min(_MAX_WORDS, len(words)), 0, -1):
            label = lookup(" ".join(words[:n]), index)
            cells = index.get(label) if label is not None else None
            rest = after[spans[n - 1].end() :]
            if after_end == next_start and not re.search(r"[A-Za-z]", rest):
                continue  # "42 for n = 7": n is 7's label
            if label is not None and cells is not None and cells.kinds & kinds:
                labels.append(label)
                break
    aside = _ASIDE.match(after)  # "98 (East)", "98 units (East)"
    if aside is not None:
        words = [norm_label(w) for w in _WORD.findall(norm_label(aside["label"]))]
        labels += [label for _, g in _grams(words) if (label := lookup(g, index)) is not None]
    if clause > head and text[clause - 1] == ",":
        labels += _framed(text, head, clause, index)
    if not text[start:end].rstrip().endswith("%"):  # a share may be of another label's total
        labels += _named_after(text, end, min(next_start, end + 200), labels, index)
    return labels


_CORRELATION = re.compile(r"\bcorrelat|\bcovarian", re.I)


def _correlated(text: str, head: int, start: int, index: LabelIndex) -> list[str]:
    """The two labels a correlation is between ("units and price correlate at 0.3", "the
    correlation between price and revenue is 0.35"), when both head a row and a column of a
    matrix: the number is their cell."""
    ends = list(_SENTENCE_END.finditer(text, head, start))
    region = text[ends[-1].end() if ends else head : start]
    if not _CORRELATION.search(region):
        return []
    words = _answer_words(region)
    found = {
        label
        for _, g in _grams(words)
        if (label := lookup(g, index)) is not None
        and (cells := index.get(label)) is not None
        and {"row", "column"} <= cells.kinds
    }
    return sorted(found) if len(found) == 2 else []


# A sentence's opening that says which row the rest is about: "For East, B was 77".
_FRAME = re.compile(
    r"\s*(?:looking at|for|in|among|within|as for|regarding|considering|focusing on|"
    r"turning to)\s+(?P<label>[^,]{1,60})",
    re.I,
)
# After a number, words that make the labels after it another's: "98, less than East".
_OTHERS = re.compile(
    r"\b(?:against|not|unlike|except|excluding|besides|more|fewer|less|ahead|behind|above|"
    r"below|difference|gap|margin|favou?r\w*|lead\w*|led|trail\w*|beat\w*|separat\w*|"
    r"between|per|each|average|share|total of|whole|all)\b",
    re.I,
)
_KINDS = {"row", "key"}


def _framed(text: str, head: int, clause: int, index: LabelIndex) -> list[str]:
    """The row labels a sentence's opening names ("For East, B was 77", "Looking at East,
    it sold 98"), if that opening is the sentence's first clause and holds no number."""
    ends = list(_SENTENCE_END.finditer(text, head, clause - 1))
    if not ends and head > 0:
        return []
    frame = _FRAME.fullmatch(text, ends[-1].end() if ends else 0, clause - 1)
    if frame is None or _LISTING.search(frame["label"]):
        return []
    words = _answer_words(text, frame.start("label"), frame.end("label"))
    return _one_row(words, [], index)


def _named_after(text: str, end: int, limit: int, tied: list[str], index: LabelIndex) -> list[str]:
    """The row labels the number's clause names after it ("98 is East's total", "It had 98
    units in East", "98, for East"): all of one row (a MultiIndex's levels) or none, and
    none past a word that makes them another's ("98, less than East")."""
    lead = re.match(r"\s*,\s*(?=(?:for|in|at|from|by)\s)", text[end:limit], re.I)
    start = end + (lead.end() if lead else 0)
    stop = _CLAUSE_END.search(text, start, limit)
    segment = text[start : stop.start() if stop else limit]
    if _LISTING.search(segment) or _OTHERS.search(segment):
        return []
    return _one_row(_answer_words(segment), tied, index)


def _one_row(words: list[str], tied: list[str], index: LabelIndex) -> list[str]:
    """The row and key labels `words` name, if they and the `tied` ones of those kinds meet
    on one line of the outputs (one row, each of its levels); else none."""
    found = {
        label
        for _, g in _grams(words)
        if (label := lookup(g, index)) is not None
        and (cells := index.get(label)) is not None
        and cells.kinds & _KINDS
    }
    if not found:
        return []
    rows = [label for label in tied if (cells := index.get(label)) and cells.kinds & _KINDS]
    lines = [
        {c[4] for c in cells.values}
        for label in {*found, *rows}
        if (cells := index.get(label)) is not None
    ]
    return sorted(found) if set.intersection(*lines) else []


def _carried(text: str, head: int, clause: int, before: str, index: LabelIndex) -> list[str]:
    """The label a number's clause names only through the one before: the sentence's subject
    across a comma ("North sold the most, with 143"), or the previous sentence's one label
    through a pronoun ("East led. It had 98"). Only text since the previous number counts."""
    goes_on = text[clause - 1] in ",-\u2014" and _GOES_ON.match(before)
    if not goes_on and not (_SENTENCE_END.match(text, clause - 1) and _PRONOUN.match(before)):
        return []
    ends = list(_SENTENCE_END.finditer(text, head, clause - 1))
    if not ends and head > 0:
        return []  # the sentence holds an earlier number, or is too long to read back
    region = text[ends[-1].end() if ends else 0 : clause - 1]
    if _LISTING.search(region):
        return []
    words = _answer_words(region)
    found = {label for _, g in _grams(words) if (label := lookup(g, index)) is not None}
    return list(found) if len(found) == 1 else []


RESPECTIVELY = re.compile(r"\brespectively\b", re.I)


def respective_labels(text: str, start: int, end: int, index: LabelIndex) -> list[str]:
    """The row labels text[start:end] names in order ("East and West had 98 and 143
    respectively": East, West), each once, the longest reading of each run of words."""
    words = _answer_words(text, start, end)
    out: list[str] = []
    i = 0
    while i < len(words):
        for n in range(min(_MAX_WORDS, len(words) - i), 0, -1):
            label = lookup(" ".join(words[i : i + n]), index)
            cells = index.get(label) if label is not None else None
            if label is not None and cells is not None and cells.kinds & _KINDS:
                out.append(label)
                i += n
                break
        else:
            i += 1
    return out
