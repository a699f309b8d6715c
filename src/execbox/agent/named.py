"""Values an answer names rather than counts: months, weekdays, quarters, years, hours
("9 o'clock"), versions ("v2.3", "Python 3.12") and ranks ("ranked 3rd", "the second largest").

Each is grounded by an output that shows a token of its kind with that value: the same token
("March", "Mar"), a date it derives from (2023-03-04 shows March, Saturday, Q1 and 2023), or a
labelled number ("month: 3", "quarter: 1", "rank: 3", "version: 2.3"). When no output shows
one, the answer invents it; a token the question states is a restatement, not a claim. A year
is claimed only when an output shows some year: otherwise it is a number like any other.
Paraphrases agree: "Q1" is "first quarter", "2nd" is "second", "1.26" is "1.26.4". A period
must also be where the answer's clause puts it: under the key its words name ("the low was on
Tuesday"), at the top or bottom of a printed series of periods ("the peak was Q1").
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from .evidence import Evidence
from .models import Claim
from .ranks import ORDINAL, Rankings, implied_ranks, ordinal_number, subject
from .values import MONTH_SPELLINGS, dates_in, month_number

_MONTH_NAMES = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
]
_WEEKDAY_NAMES = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]

# An answer's month or weekday is capitalized ("may" is a verb); an output's may be any case.
# In another case or language too ("march", "APRIL", "mars", "M\u00e4rz"); an abbreviation and
# a lowercase "may" only as written in English ("may" is a verb, "mar" a word), "mars" only
# in lower case (French writes months so; "Mars" is a planet).
_MONTH = (
    r"(?<![^\W\d_])(?P<month>(?:January|February|March|April|May|June|July|August|September|"
    r"October|November|December|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)(?![a-z])"
    r"|mars|(?i:" + "|".join(n for n in MONTH_SPELLINGS if len(n) >= 4 and n != "mars") + r"|mai)"
    r"(?![^\W\d_]))"
)
_WEEKDAY = (
    r"\b(?P<weekday>(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)s?"
    r"|(?:Mon|Tues|Tue|Wed|Thurs|Thur|Thu|Fri)(?![a-z])|(?:Sat|Sun)(?=\.|,))"
)
_QUARTER = (
    r"(?:(?<![A-Za-z])Q(?P<q>[1-4])(?!\d)|\b(?P<qo>first|second|third|fourth|[1-4](?:st|nd|rd|th))"
    r"[\s-]+quarter\b|\bquarter\s+(?P<qn>[1-4])\b)"
)
# "9 o'clock" is 9:00 as written; only its half of the day ("in the evening", "pm") makes it 21.
_CLOCK = (
    r"\b(?P<hour>\d{1,2})\s*o['\u2019]?clock\b(?:\s*(?P<half>[ap]\.?m\b\.?|in\s+the\s+"
    r"(?:morning|afternoon|evening)|at\s+night|tonight))?"
)
_LATE = re.compile(r"p|in\s+the\s+(?:afternoon|evening)|at\s+night|tonight", re.I)
_VERSION = (
    r"(?:(?<![A-Za-z\d.])[vV](?P<v>\d+(?:\.\d+)*)(?!\w|\.\d)"
    r"|\b[Vv]ersion\s*:?\s*(?P<vn>\d+(?:\.\d+)*)\b(?!\.\d)"
    r"|\b(?P<name>[A-Za-z][\w-]*)\s(?P<nv>\d+\.\d+(?:\.\d+)*)\b(?!\.\d)"
    r"|\b(?P<joined>(?i:c?python|pypy|py))(?P<jv>\d+\.\d+(?:\.\d+)*)\b(?!\.\d))"
)
# Python's own names: a version after one is always a version claim, shown by an output
# or refused ("Python 3.12" when the output printed 3.11.4, or nothing).
_RUNTIMES = {"python", "cpython", "pypy", "py"}
_RUNTIME_SHOWN = re.compile(
    r"(?<![a-z])(?:c?python|pypy|py)(?:\w*['\"]?[ \t]*[:=]?)?[ \t]*[<>=~^]*[ \t]*v?(\d+(?:\.\d+)*)"
    r"|^[ \t]*(\d+\.\d+\.\d+)\S*[ \t]+\("  # sys.version: "3.11.4 (main, Jun  7 2023)"
    r"|version_info\(major=(\d+), minor=(\d+), micro=(\d+)"
    r"|^[ \t]*\((\d+), (\d+), (\d+)\b",
    re.M,
)
# A rank: an ordinal after "ranked" or "placed" or before "place" or a superlative, or a bare
# number after "ranked" ("placed 3 orders", "ranks 3 regions" count things).
_RANK = (
    r"(?:\b(?:rank(?:s|ed)?|plac(?:es|ed))\s+(?:at\s+|in\s+)?(?:the\s+)?"
    r"(?:number\s+|no\.\s*|#\s*)?(?P<r>" + ORDINAL + r")\b"
    r"|\brank(?:s|ed)?\s+(?:at\s+)?(?:number\s+|no\.\s*|#\s*)?(?P<rn>\d{1,3})\b"
    r"(?!\s+[a-z]+s\b)"
    r"|\b(?P<ro>" + ORDINAL + r")[\s-]+(?:place|position|largest|smallest|highest|lowest|"
    r"biggest|best|worst|most|least|greatest|fastest|slowest|longest|shortest|busiest)\b)"
)
# The direction a ranked word counts in; "best" or "fastest" may count either way.
_RANKED_UP = r"\b(?:smallest|lowest|least|fewest|shortest)\b"
_RANKED_DOWN = r"\b(?:largest|highest|biggest|most|greatest|busiest|longest)\b"
_YEAR = (
    r"(?:\b(?i:in|during|since|until|till|through|year|fiscal)\s+|\bFY\s?|(?<=Q[1-4]\s)|"
    r"(?<=Q[1-4]-))(?P<year>1[89]\d\d|20\d\d)(?![\w,.]?\d)(?!\s+[a-z]+s\b)"
    r"|(?<![\w.,])(?P<qyear>1[89]\d\d|20\d\d)(?=\s?-?Q[1-4]\b)"
)
_ANSWER = re.compile("|".join((_MONTH, _WEEKDAY, _QUARTER, _CLOCK, _VERSION, _RANK, _YEAR)))

# What an output shows, read casefolded within a line (the outputs are searched as one text).
_SHOWN_MONTH = re.compile(r"(?<![^\W\d_])(" + "|".join(MONTH_SPELLINGS) + r")(?![^\W\d_])\.?")
_SHOWN_WEEKDAY = re.compile(r"\b(mon|tue|tues|wed|thu|thur|thurs|fri|sat|sun)(?:\w*day)?s?\b")
_SHOWN_QUARTER = re.compile(
    r"(?<![A-Za-z])q(?P<q>[1-4])(?!\d)|\b(?P<qo>first|second|third|fourth|[1-4](?:st|nd|rd|th))"
    r"[ \t_-]+quarter\b|\bquarter[ \t]+(?P<qn>[1-4])\b",
)
_SHOWN_CLOCK = re.compile(
    r"(?<![\d:.])(?P<h>\d{1,2}):[0-5]\d(?!\d)|\b(?P<o>\d{1,2})[ \t]*o['\u2019]?clock\b"
)
_SHOWN_VERSION = re.compile(
    r"(?:(?<![A-Za-z\d.])v|\bversion[ \t]*[:=]?[ \t]*|==)(?P<v>\d+(?:\.\d+)*)"
    r"|(?<![\w.])(?P<dotted>\d+\.\d+\.\d+(?:\.\d+)*)(?![\w.])",
)
# A year a quarter or "fy" names: "2023Q3", "Q3-2023", "fy2023".
_SHOWN_YEAR = re.compile(
    r"(?<![\w.])(?P<a>1[89]\d\d|20\d\d)[- \t]?q[1-4]\b|\bq[1-4][- \t]?(?P<b>1[89]\d\d|20\d\d)\b"
    r"|\bfy[ \t]?(?P<c>1[89]\d\d|20\d\d)\b",
)
_VERSION_WORDS = re.compile(
    r"\b(?:install\w*|versions?|releases?|upgrad\w*|packages?|librar\w*|runtime)\b"
)
_SHOWN_ORDINAL = re.compile(r"(?<![a-z0-9])(" + ORDINAL + r")(?![a-z0-9])")  # "2nd_best"
# "month: 3", "peak_month = 3", "rank 2": a number its label names the kind of.
_LABELLED = re.compile(
    r"\b(?:\w*_)?(?P<kind>month|quarter|qtr|year|yr|hour|hr|rank|position|place|pos|version)"
    r"(?:_\w*)?['\"]?[ \t]*[:=#]?[ \t]*(?P<n>\d+(?:\.\d+)*)\b",
)
_LABEL_KIND = {"qtr": "quarter", "yr": "year", "hr": "hour", "pos": "position"}


_SHOWN = [
    ("month", _SHOWN_MONTH),
    ("weekday", _SHOWN_WEEKDAY),
    ("quarter", _SHOWN_QUARTER),
    ("hour", _SHOWN_CLOCK),
    ("version", _SHOWN_VERSION),
    ("year", _SHOWN_YEAR),
    ("rank", _SHOWN_ORDINAL),
    ("label", _LABELLED),
]
_KINDS = {kind for kind, _ in _SHOWN}


@dataclass
class Shown:
    """The named values some text shows, by kind."""

    months: set[int] = field(default_factory=set)
    weekdays: set[int] = field(default_factory=set)
    quarters: set[int] = field(default_factory=set)
    years: set[int] = field(default_factory=set)
    hours: set[int] = field(default_factory=set)
    versions: list[tuple[int, ...]] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)

    def read(self, text: str, kinds: set[str] = _KINDS) -> None:
        """The values of `kinds` that `text` (casefolded) shows."""
        patterns = [(k, p) for k, p in _SHOWN if k in kinds]
        for kind, pattern in patterns:
            for m in pattern.finditer(text):
                self._shown(kind, m)

    def _shown(self, kind: str, m: re.Match[str]) -> None:
        if kind == "month":
            self.months.add(_month_number(m[1]))
        elif kind == "weekday":
            self.weekdays.add(_weekday_number(m[1]))
        elif kind == "quarter":
            self.quarters.add(_quarter(m))
        elif kind == "hour":
            hour = int(m["h"] or m["o"])
            self.hours.update({hour % 12, hour % 12 + 12} if m["o"] else {hour})
        elif kind == "version":
            self.versions.append(_parts(m["v"] or m["dotted"]))
        elif kind == "year":
            self.years.add(int(m["a"] or m["b"] or m["c"]))
        elif kind == "rank":
            self.ranks.add(ordinal_number(m[1]))
        else:
            label = _LABEL_KIND.get(m["kind"].lower(), m["kind"].lower())
            if label == "version":
                self.versions.append(_parts(m["n"]))
            elif "." not in m["n"]:
                self.labelled(label, int(m["n"]))

    def labelled(self, kind: str, n: int) -> None:
        """A number its label names the kind of: "month: 3", "rank 2"."""
        if kind == "month" and 1 <= n <= 12:
            self.months.add(n)
            self.quarters.add((n - 1) // 3 + 1)
        elif kind == "quarter" and 1 <= n <= 4:
            self.quarters.add(n)
        elif kind == "year":
            self.years.add(n)
        elif kind == "hour":
            self.hours.add(n)
        elif kind in ("rank", "position", "place"):
            self.ranks.add(n)

    def add_date(self, year: int, month: int, day: int | None) -> None:
        self.months.add(month)
        self.quarters.add((month - 1) // 3 + 1)
        if year:
            self.years.add(year)
        if year and day:
            self.weekdays.add(datetime.date(year, month, day).weekday())


# Keys and columns whose numbers name a value of a kind: "month  sales" over "3  500".
NAMED_LABELS = frozenset({"month", "quarter", "qtr", "year", "hour", "rank", "position", "place"})


def shown_by(evidence: Evidence, kinds: set[str], wanted: frozenset[str]) -> Shown:
    """The values of `kinds` the outputs show: their lines, the result's keys with their
    values, the keys and columns named for a kind, their dates. The lines are read as one
    text: one search per kind. `wanted`: the words the outputs' labels are read for."""
    shown = Shown()
    keyed = "\n".join(_keyed_lines(evidence.result)).casefold()
    shown.read(evidence.folded() + "\n" + keyed, {*kinds, "label"})
    index = evidence.label_index(wanted)
    for label in NAMED_LABELS & wanted:
        cells = index.get(label)
        for value, *_ in cells.values if cells is not None else []:
            if value.is_integer():
                shown.labelled(_LABEL_KIND.get(label, label), int(value))
    for fact in evidence.dates:
        for year, month, day in fact.value:
            shown.add_date(year, month, day)
    return shown


def _keyed_lines(value: Any, key: str = "") -> Iterator[str]:
    """A result's scalar items as "key: value" lines ({"month": 3} shows the month)."""
    if isinstance(value, dict):
        for k, item in value.items():
            yield from _keyed_lines(item, str(k))
    elif isinstance(value, list):
        for item in value[:10_000]:
            yield from _keyed_lines(item, key)
    elif isinstance(value, (int, float, str)) and not isinstance(value, bool) and key:
        yield f"{key}: {value}"


@dataclass(frozen=True)
class Named:
    """One named value the answer states: its kind, its value and where it is."""

    kind: str  # month, weekday, quarter, year, hour, version, rank
    value: Any
    text: str
    start: int
    end: int
    name: str = ""  # a version's software ("Python" of "Python 3.12")
    order: str = ""  # a rank's: counted from the largest ("down"), the smallest ("up"), unsaid
    superlative: bool = False  # "the most": a rank 1 claimed only if a ranking holds it


def named_claims(
    text: str, evidence: Evidence, question: str, wanted: frozenset[str]
) -> list[tuple[Named, Claim]]:
    """The named values of an answer (normalized, its dates masked), each with its claim;
    a year no output dates is left out (it is checked as a number). `wanted`: the words the
    outputs' labels are read for, `NAMED_LABELS` among them."""
    found = list(_named_in(text))
    found += [
        Named("rank", i.rank, i.text, i.start, i.end, order=i.order, superlative=i.superlative)
        for i in implied_ranks(text)
        if not any(n.start < i.end and i.start < n.end for n in found)
    ]
    if not found:
        return []  # the common case: nothing read from the outputs
    asked = Shown()
    asked.read(question.casefold())
    for keys, _ in dates_in(question):
        for year, month, day in keys:
            asked.add_date(year, month, day)
    names = [n for n in found if n.name]
    # "numpy 2.0 is installed": the sentence says it is a version, so one decimal is one too.
    weak = any(_VERSION_WORDS.search(text, max(0, n.start - 60), n.end + 60) for n in names)
    versioned = _versioned_names(evidence, {n.name for n in names}, weak=weak)
    found = [
        n for n in found if not n.name or n.name in versioned | _RUNTIMES
    ]  # "the mean 3.2" is a value
    kinds = {n.kind for n in found if not n.name}
    shown = shown_by(evidence, kinds, wanted) if kinds else Shown()
    claims = []
    rankings: Rankings | None = None
    for named in found:
        claim = None
        if named.kind == "rank":
            rankings = rankings or Rankings.of(evidence, evidence.label_index(wanted))
            claim = _ranked(named, text, rankings)
            if claim is None and named.superlative:
                continue  # "the most" with no ranking to hold it to: not a claim
        claim = claim or _claim(named, shown, asked, evidence)
        if claim is not None and claim.grounded and named.kind in _PERIODS:
            if claim.source != "the question":
                rankings = rankings or Rankings.of(evidence, evidence.label_index(wanted))
                claim = _bound(named, text, evidence, rankings) or claim
        if named.name and named.text.casefold() in question.casefold():
            claim = Claim(text=named.text, kind="number", grounded=True, source="the question")
        if claim is not None:
            claims.append((named, claim))
    return claims


_PERIODS = {"month", "weekday", "quarter", "year", "hour"}
# The clause a named value is in: "the peak was on Tuesday and the low on Saturday" is two.
_CLAUSE = re.compile(r"[.;!?,\n]|\b(?:and|but|while|whereas)\b", re.I)
_PEAK = re.compile(
    r"\b(?:peak(?:ed|s|ing)?|highest|most|max(?:imum)?|busiest|largest|biggest|greatest|"
    r"strongest|top)\b",
    re.I,
)
_TROUGH = re.compile(
    r"\b(?:lowest|least|fewest|min(?:imum)?|smallest|weakest|slowest|quietest|"
    r"bottom(?:ed)?|trough)\b",
    re.I,
)
# Words of a clause that name no output's key.
_NOT_KEYS = {"the", "was", "were", "are", "its", "this", "that", "and", "with", "from", "had"}


def _bound(named: Named, text: str, evidence: Evidence, rankings: Rankings) -> Claim | None:
    """A refusal of a period the outputs show, but not where the answer's clause puts it: a
    key its words name shows another ("the low was on Tuesday" for "low: 2023-03-04"), or a
    series of periods peaks or bottoms out at another ("the peak was Q1" over Q1 10, Q2 20)."""
    starts = [m.end() for m in _CLAUSE.finditer(text, max(0, named.start - 200), named.start)]
    stop = _CLAUSE.search(text, named.end, named.end + 200)
    start = starts[-1] if starts else max(0, named.start - 200)
    clause = text[start : stop.start() if stop else named.end + 200]
    keyed = _keyed_shown(named.kind, clause.replace(named.text, " "), evidence)
    if keyed and not any(_holds(named, shown) for shown in keyed.values()):
        key, shown = next(iter(keyed.items()))
        return _refusal(named, f"the outputs show {key!r} as {_listing(named, shown)}")
    peak, trough = _PEAK.search(clause), _TROUGH.search(clause)
    if bool(peak) == bool(trough):
        return None
    extremes = _extremes(named.kind, named.value, rankings, low=bool(trough))
    if extremes is None or named.value in extremes:
        return None
    ends = Shown()
    getattr(ends, named.kind + "s").update(extremes)
    word = "bottoms out" if trough else "peaks"
    return _refusal(named, f"the outputs' series {word} at {_listing(named, ends)}")


def _refusal(named: Named, why: str) -> Claim:
    return Claim(
        text=named.text,
        kind="date",
        grounded=False,
        detail=f"{why}, not this {named.kind}: state only what the outputs show",
    )


def _keyed_shown(kind: str, clause: str, evidence: Evidence) -> dict[str, Shown]:
    """The values of `kind` shown under the output keys the clause's words name ("low" of
    "the low was on ...": "low: 2023-03-04", "'low_day': '2023-03-04'")."""
    words = {w.casefold() for w in re.findall(r"[A-Za-z]{3,}", clause)} - _NOT_KEYS
    words |= {w[:-2] for w in words if w.endswith("ed") and len(w) > 5}  # "peaked": "peak"
    out: dict[str, Shown] = {}
    for word in sorted(words):
        if not evidence.may_contain(word):
            continue
        pattern = re.compile(
            rf"(?<![\w]){re.escape(word)}(?:_\w+)?['\"]?[ \t]*[:=][ \t]*(?P<v>[^,;{{}}\n]+)"
        )
        for m in pattern.finditer(evidence.folded()):
            shown = Shown()
            shown.read(m["v"], {kind})
            for keys, _ in dates_in(m["v"]):
                for year, month, day in keys:
                    shown.add_date(year, month, day)
            if getattr(shown, kind + "s"):
                out.setdefault(m[0].partition(":")[0].partition("=")[0].strip(" '\""), shown)
    return out


def _extremes(kind: str, value: int, rankings: Rankings, *, low: bool) -> set[int] | None:
    """The periods at the top (or bottom) of the one series of periods of `kind` that holds
    `value`, or None if no single series does."""
    held = []
    for series in rankings.series:
        periods = {}
        for label, number in series.items():
            shown = Shown()
            shown.read(label, {kind})
            values = getattr(shown, kind + "s")
            if len(values) != 1:
                break
            periods[next(iter(values))] = number
        else:
            if value in periods and len(periods) == len(series):
                held.append(periods)
    if len(held) != 1:
        return None
    end = (min if low else max)(held[0].values())
    return {period for period, number in held[0].items() if number == end}


def _ranked(named: Named, text: str, rankings: Rankings) -> Claim | None:
    """A rank checked against the ranking that holds the label its sentence names."""
    label = subject(text, named.start, named.end, rankings.labels())
    if label is None:
        return None
    rank = rankings.rank_of(label, named.order, superlative=named.superlative)
    if rank is None:
        return None
    if rank == named.value:
        return Claim(
            text=named.text, kind="number", grounded=True, source=f"the outputs rank {label} {rank}"
        )
    return Claim(
        text=named.text,
        kind="number",
        grounded=False,
        detail=f"the outputs rank {label!r} {rank}, not {named.value}",
    )


def _named_in(text: str) -> Iterator[Named]:
    for m in _ANSWER.finditer(text):
        kind = next(k for k, v in m.groupdict().items() if v is not None)
        span = m.span(kind)
        if kind == "month":
            value: Any = _month_number(m[kind])
        elif kind == "weekday":
            value = _weekday_number(m[kind])
        elif kind in ("q", "qo", "qn"):
            kind, value, span = "quarter", _quarter(m), m.span()
        elif kind == "hour":
            value, span = _hour(int(m[kind]), m["half"]), m.span()
        elif kind in ("v", "vn"):
            kind, value, span = "version", _parts(m[kind]), m.span()
        elif kind in ("joined", "jv"):
            yield Named("version", _parts(m["jv"]), m[0], *m.span(), name=m["joined"].casefold())
            continue
        elif kind in ("name", "nv"):
            yield Named("version", _parts(m["nv"]), m[0], *m.span(), name=m["name"].casefold())
            continue
        elif kind in ("r", "rn", "ro"):
            value, span = ordinal_number(m[kind]), m.span()
            order = (
                "up"
                if re.search(_RANKED_UP, m[0], re.I)
                else "down"
                if re.search(_RANKED_DOWN, m[0], re.I)
                else ""
            )
            yield Named("rank", value, text[span[0] : span[1]], *span, order=order)
            continue
        else:
            kind, value = "year", int(m[kind])
        yield Named(kind, value, text[span[0] : span[1]], *span)


def _versioned_names(evidence: Evidence, names: set[str], *, weak: bool) -> set[str]:
    """Those of `names` outputs show a version after: "Python 3.11.4", "numpy==1.26", "node
    v2.1"; with `weak`, "pandas 2.14" too (else a name and one decimal, "mean 3.16", is a
    value). Only outputs that hold a name are searched."""
    strong = r"(?:[ \t]+v?|==|[ \t]+version[ \t]+)\d+\.\d+\.\d|==\d|[ \t]+v\d|[ \t]+version[ \t]+\d"
    names = {name for name in names if evidence.may_contain(name)}
    if not names:
        return set()
    pattern = re.compile(
        rf"\b({'|'.join(map(re.escape, names))})(?:{strong}"
        + (r"|[ \t]\d+\.\d" if weak else "")
        + ")"
    )
    return {m[1] for m in pattern.finditer(evidence.folded())}


def _claim(named: Named, shown: Shown, asked: Shown, evidence: Evidence) -> Claim | None:
    kind: Literal["number", "date"] = "number" if named.kind in ("version", "rank") else "date"
    if _holds(named, asked):
        return Claim(text=named.text, kind=kind, grounded=True, source="the question")
    if named.name:
        # A prerelease ("2.0.0rc1") is not its release: "2.0.0 is installed" is not shown.
        after = re.compile(
            rf"\b{re.escape(named.name)}(?: v?| version |==)(\d+(?:\.\d+)*)(?![a-z\d]|\.\d)"
        )
        shown = Shown(versions=[_parts(m[1]) for m in after.finditer(evidence.folded())])
        if named.name in _RUNTIMES:
            for m in _RUNTIME_SHOWN.finditer(evidence.folded()):
                parts = [g for g in m.groups() if g is not None]
                shown.versions.append(_parts(".".join(parts)))
    elif named.kind == "year" and not shown.years:
        return None
    if _holds(named, shown):
        return Claim(
            text=named.text, kind=kind, grounded=True, source=f"an output shows this {named.kind}"
        )
    listing = _listing(named, shown)
    return Claim(
        text=named.text,
        kind=kind,
        grounded=False,
        detail=f"no output shows this {named.kind}"
        + (f" (they show {listing})" if listing else " (they show none)")
        + ": state only what the outputs show",
    )


def _holds(named: Named, shown: Shown) -> bool:
    if named.kind == "version":
        return any(v[: len(named.value)] == named.value for v in shown.versions)
    values: set[int] = getattr(shown, named.kind + "s")
    return named.value in values


def _listing(named: Named, shown: Shown) -> str:
    if named.kind == "version":
        return ", ".join(".".join(map(str, v)) for v in shown.versions[:5])
    values = sorted(getattr(shown, named.kind + "s"))[:5]
    if named.kind == "month":
        return ", ".join(_MONTH_NAMES[v - 1].title() for v in values)
    if named.kind == "weekday":
        return ", ".join(_WEEKDAY_NAMES[v].title() for v in values)
    return ", ".join(str(v) for v in values)


def _hour(hour: int, half: str | None) -> int:
    """The hour of the day an "o'clock" names: as written, or in the half it says."""
    if half is None or hour > 12:
        return hour
    return hour % 12 + (12 if _LATE.match(half) else 0)


def _month_number(name: str) -> int:
    return month_number(name)


def _weekday_number(name: str) -> int:
    return [d[:3] for d in _WEEKDAY_NAMES].index(name[:3].lower())


def _quarter(m: re.Match[str]) -> int:
    if m["q"] or m["qn"]:
        return int(m["q"] or m["qn"])
    return ordinal_number(m["qo"])


def _parts(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))
