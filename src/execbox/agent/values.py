"""Values in text besides numbers (see `quantities`): units and dates. What `ground` compares.

Units: families of spellings ("kg", "kilograms"; a one-letter symbol only right after digits:
"1.5s"). Dates: ISO, day/month/year both ways, month names, month-year.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable, Iterator
from datetime import date

# -- units -------------------------------------------------------------------------------------

UNIT_FAMILIES: dict[str, tuple[str, ...]] = {
    "USD": ("$", "usd", "dollars?", "us\\$"),
    "EUR": ("\u20ac", "eur", "euros?"),
    "GBP": ("\u00a3", "gbp", "pounds sterling"),
    "JPY": ("\u00a5", "jpy", "yen"),
    "kg": ("kg", "kgs", "kilograms?", "kilos?"),
    "mg": ("mg", "milligrams?"),
    "lb": ("lbs?", "pounds?"),
    "km": ("km", "kilomet(?:er|re)s?"),
    "m": ("met(?:er|re)s?",),
    "cm": ("cm", "centimet(?:er|re)s?"),
    "mm": ("mm", "millimet(?:er|re)s?"),
    "mi": ("miles?",),
    "ft": ("ft", "feet", "foot"),
    "l": ("lit(?:er|re)s?",),
    "ml": ("ml", "millilit(?:er|re)s?"),
    "s": ("seconds?", "secs?", r"(?<=\d)s", r"(?<=\d )s"),  # "5s", "5 s"
    "ms": ("ms", "milliseconds?"),
    "us": ("\u03bcs", "(?-i:us)", "microseconds?"),  # "50 US states" is no time
    "ns": ("ns", "nanoseconds?"),
    "min": ("minutes?", "mins?"),
    "h": ("hours?", "hrs?", r"(?<=\d)h", r"(?<=\d )h"),
    "d": ("days?",),
    "wk": ("weeks?", "wks?"),
    "mo": ("months?",),
    "yr": ("years?", "yrs?"),
    "Hz": ("hz", "khz", "mhz", "ghz", "hertz"),
    "t": ("tonnes?", "tons?"),
    # A prefixed "b" is a bit, "B" a byte (`scale_of` reads the case): "5 Gb" is not "5 GB".
    "bits/s": ("bps", "bits? per second"),
    "bits": ("bits?",),
    "bytes": ("bytes?", "[kmgt]i?b(?:/s|ps)?", "kilobytes?", "megabytes?", "gigabytes?"),
    "\u00b0C": ("\u00b0c", "celsius", "degrees c"),
    "\u00b0F": ("\u00b0f", "fahrenheit"),
    "kWh": ("kwh",),
    "W": ("watts?",),
}
CURRENCY = {"$": "USD", "\u20ac": "EUR", "\u00a3": "GBP", "\u00a5": "JPY"}
UNIT_AFTER = re.compile(
    r"\s?("
    + "|".join(
        sorted(
            # A currency's symbol after the number counts too: "257,250.00 \u20ac".
            (
                re.escape(s) if s in CURRENCY else s
                for spellings in UNIT_FAMILIES.values()
                for s in spellings
            ),
            key=len,
            reverse=True,
        )
    )
    + r")(?![A-Za-z])",
    re.I,
)
# "KB" is 1000 bytes, or 1024 as many programs print it; "KiB" only 1024; "kb" 1000 bits.
_PREFIXED_BITS = re.compile(r"(?P<p>[kmgt])(?P<i>i?)(?P<b>b)(?P<rate>/s|ps)?", re.I)

# Units of one dimension compare by their scale: "5 GHz" is not "5 MHz", "90 min" is "1.5 h".
_SCALES: dict[str, tuple[str, float]] = {
    "ms": ("s", 1e-3),
    "us": ("s", 1e-6),
    "ns": ("s", 1e-9),
    "wk": ("s", 604800.0),
    "mo": ("s", 2629746.0),  # a twelfth of a Gregorian year
    "yr": ("s", 31556952.0),
    "min": ("s", 60.0),
    "h": ("s", 3600.0),
    "d": ("s", 86400.0),
    "mg": ("kg", 1e-6),
    "km": ("m", 1e3),
    "cm": ("m", 1e-2),
    "mm": ("m", 1e-3),
    "ml": ("l", 1e-3),
}
_PREFIXED = {
    "khz": ("Hz", 1e3),
    "mhz": ("Hz", 1e6),
    "ghz": ("Hz", 1e9),
}
# A unit in an output's label ("size_mb: 5", "elapsed (s): 3"); "min" names a minimum there.
LABEL_UNIT = re.compile(
    r"(?<![A-Za-z])("
    + "|".join(
        sorted(
            (
                s
                for family in UNIT_FAMILIES.values()
                for s in family
                if s not in CURRENCY and not s.startswith("(?") and s not in ("mins?", "m", "d")
            ),
            key=len,
            reverse=True,
        )
    )
    + r"|(?<=_)[sh])(?![A-Za-z])",  # "elapsed_s", "uptime_h"
    re.I,
)


def scale_of(spelling: str) -> tuple[str, tuple[float, ...]]:
    """The dimension a unit spelling measures and the factors to its base ("KB": bytes, 1000
    or 1024)."""
    low = spelling.lower()
    prefixed = _PREFIXED_BITS.fullmatch(spelling)
    if prefixed is not None:
        power = "kmgt".index(prefixed["p"].lower()) + 1
        byte = prefixed["b"] == "B"
        family = ("bytes" if byte else "bits") + ("/s" if prefixed["rate"] else "")
        if prefixed["i"]:
            return family, (1024.0**power,)
        return family, (1000.0**power, 1024.0**power) if byte else (1000.0**power,)
    if low in _PREFIXED:
        return _PREFIXED[low][0], (_PREFIXED[low][1],)
    family = CURRENCY.get(spelling) or family_of(spelling)
    base, factor = _SCALES.get(family, (family, 1.0))
    return base, (factor,)


def family_of(spelling: str) -> str:
    """The unit family a spelling after a number belongs to ('kilograms' -> 'kg')."""
    low = spelling.lower()
    for family, patterns in UNIT_FAMILIES.items():
        if any(re.fullmatch(p, low) for p in patterns if p not in CURRENCY):
            return family
    return low


def mentions_unit(family: str, text: str) -> bool:
    for spelling in UNIT_FAMILIES[family]:
        pattern = re.escape(spelling) if spelling in CURRENCY else spelling
        if re.search(r"(?<![A-Za-z])" + pattern + r"(?![A-Za-z])", text, re.I):
            return True
    return False


def unit_factors(spelling: str) -> tuple[float, ...]:
    """The factors of a prefixed byte or bit spelling ("KB": 1000 or 1024), else (1.0,)."""
    return scale_of(spelling)[1] if _PREFIXED_BITS.fullmatch(spelling) else (1.0,)


# A duration in parts is one value: "1h30m", "1 hour 30 minutes", "1:30:00" (h:mm:ss), and
# pandas' "15 days 04:00:00".
_H = r"(?:h|hrs?|hours?)"
_M = r"(?:m|mins?|minutes?)"
_S = r"(?:s|secs?|seconds?)"
_AND = r"\s*(?:,|and)?\s*"
DURATION = re.compile(
    rf"""(?<![\w.:])(?:
        (?P<d>\d+)\s+days?,?\s+(?P<dh>\d{{1,2}}):(?P<dm>[0-5]\d):(?P<ds>[0-5]\d(?:\.\d+)?)
      | (?P<h>\d+)\s?{_H}{_AND}(?P<hm>\d+)\s?{_M}(?:{_AND}(?P<hs>\d+(?:\.\d+)?)\s?{_S})?
      | (?P<gh>\d+)h(?P<gm>[0-5]\d)  # "1h30": glued, the minutes need no unit
      | (?P<m>\d+)\s?{_M}{_AND}(?P<ms>\d+(?:\.\d+)?)\s?{_S}
      | (?P<ch>\d{{1,3}}):(?P<cm>[0-5]\d):(?P<cs>[0-5]\d(?:\.\d+)?)
    )(?![\w:])""",
    re.X | re.I,
)


def durations_in(text: str) -> Iterator[tuple[float, float, re.Match[str]]]:
    """Each compound duration: its seconds, the step of its last part, its match."""
    for match in DURATION.finditer(text):
        g = match.groupdict()
        hours = g["h"] or g["gh"] or g["ch"] or g["dh"] or "0"
        minutes = g["hm"] or g["gm"] or g["m"] or g["cm"] or g["dm"] or "0"
        seconds = g["hs"] or g["ms"] or g["cs"] or g["ds"]
        step = 60.0
        if seconds is not None:
            decimals = len(seconds.partition(".")[2])
            step = 10.0**-decimals
        days = int(g["d"] or 0)
        total = days * 86400 + int(hours) * 3600 + int(minutes) * 60 + float(seconds or 0)
        yield float(total), step, match


# -- dates -------------------------------------------------------------------------------------

# Month names, English and the other languages an answer may use ("mars", "März", "marzo").
_MONTH_SPELLINGS = [
    "january|jan|janvier|januar|enero|gennaio|janeiro",
    "february|feb|f\u00e9vrier|fevrier|februar|febrero|febbraio|fevereiro",
    "march|mar|mars|m\u00e4rz|maerz|marz|marzo|mar\u00e7o",
    "april|apr|avril|abril|aprile",
    "may|mai|mayo|maggio|maio",
    "june|jun|juin|juni|junio|giugno|junho",
    "july|jul|juillet|juli|julio|luglio|julho",
    "august|aug|ao\u00fbt|aout|agosto",
    "september|sept|sep|septembre|septiembre|settembre|setembro",
    "october|oct|octobre|oktober|octubre|ottobre|outubro",
    "november|nov|novembre|noviembre|novembro",
    "december|dec|d\u00e9cembre|decembre|dezember|diciembre|dicembre|dezembro",
]
_MONTHS = {name: i for i, names in enumerate(_MONTH_SPELLINGS, 1) for name in names.split("|")}
# Longest first, so "march" is not read as "mar"; a trailing "." of an abbreviation is its own.
MONTH_SPELLINGS = sorted(_MONTHS, key=len, reverse=True)
_MONTH = r"(?<![^\W\d_])(?P<mon>" + "|".join(MONTH_SPELLINGS) + r")(?![^\W\d_])\.?"


def month_number(name: str) -> int:
    """The month a name or abbreviation in any case spells ("Mar", "m\u00e4rz": 3)."""
    return _MONTHS[name.casefold().rstrip(".")]


_DATES = [
    re.compile(p, re.I)
    for p in (
        r"(?<![\w.])(?P<y>\d{4})[-/](?P<m>\d{1,2})[-/](?P<d>\d{1,2})(?![\d])",
        r"(?<![\w.])(?P<a>\d{1,2})[/.](?P<b>\d{1,2})[/.](?P<y>\d{4})(?!\d)",
        r"(?<![\w.])(?P<d>\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?" + _MONTH + r",?\s+(?P<y>\d{4})\b",
        _MONTH + r"\s+(?P<d>\d{1,2})(?:st|nd|rd|th)?,?\s+(?P<y>\d{4})\b",
        _MONTH + r",?\s+(?P<y>\d{4})\b",
        r"(?<![\w.])(?P<y>\d{4})-(?P<m>\d{2})(?![-\d])",
    )
]

DateKey = tuple[int, int, int | None]  # year, month, day (None: the month as a whole)


def dates_in(text: str) -> Iterator[tuple[list[DateKey], re.Match[str]]]:
    """Every date in `text`: its readings (dd/mm and mm/dd are both kept) and its match.
    Earlier patterns win over later ones on the same text."""
    taken: list[tuple[int, int]] = []  # the spans yielded so far, sorted and disjoint
    for pattern in _DATES:
        fresh: list[tuple[int, int]] = []
        i = 0
        for match in pattern.finditer(text):
            # One pattern's matches come in order, so one sweep over `taken` finds each overlap.
            while i < len(taken) and taken[i][1] <= match.start():
                i += 1
            if i < len(taken) and taken[i][0] < match.end():
                continue
            keys = _date_keys(match.groupdict())
            if keys:
                fresh.append((match.start(), match.end()))
                yield keys, match
        taken = list(heapq.merge(taken, fresh))


# A month's day without a year: "March 5th", "5 March", "the 5th of March", "Mar 5".
_MONTH_DAY = re.compile(
    r"(?<![\w.])(?P<d>\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?"
    + _MONTH
    + r"|"
    + _MONTH.replace("mon>", "mon2>")
    + r"\s+(?P<d2>\d{1,2})(?:st|nd|rd|th)?(?![\w:.]\d|\d)"
    # "on the 5th", "on Sat. the 5th": a day of a month the answer does not name (0).
    r"|\bon\s+(?:(?:mon|tue|wed|thu|fri|sat|sun)[a-z]*\.?,?\s+)?the\s+(?P<d3>\d{1,2})"
    r"(?:st|nd|rd|th)\b(?!\s*[A-Za-z])",
    re.I,
)


def month_days_in(text: str) -> Iterator[tuple[int, int, re.Match[str]]]:
    """Each month's day without a year (its dates with one masked first): month (0: not
    named), day, match."""
    for match in _MONTH_DAY.finditer(text):
        mon = match["mon"] or match["mon2"]
        month = month_number(mon) if mon else 0
        day = int(match["d"] or match["d2"] or match["d3"])
        try:
            date(2000, month or 1, day)  # a leap year: any day a month may have
        except ValueError:
            continue
        yield month, day, match


def blank(text: str, spans: Iterable[tuple[int, int]]) -> str:
    """`text` with each span overwritten by spaces, built once however many spans there are."""
    chars = list(text)
    for start, end in spans:
        chars[start:end] = " " * (end - start)
    return "".join(chars)


def _date_keys(g: dict[str, str | None]) -> list[DateKey]:
    def num(name: str) -> int | None:
        text = g.get(name)
        return int(text) if text else None

    year = num("y") or 0
    pairs: list[tuple[int, int | None]]
    if g.get("mon"):
        pairs = [(month_number(g["mon"] or ""), num("d"))]
    elif g.get("a"):
        a, b = num("a") or 0, num("b") or 0
        pairs = [(b, a), (a, b)]
    else:
        pairs = [(num("m") or 0, num("d"))]
    keys: list[DateKey] = []
    for month, day in pairs:
        try:
            date(year, month, day or 1)
        except ValueError:
            continue
        keys.append((year, month, day))
    return keys


def date_matches(claim: DateKey, fact: DateKey) -> bool:
    if claim[2] is None:
        return claim[:2] == fact[:2]
    return claim == fact


def mask_dates(text: str) -> str:
    """`text` with its dates blanked out (their digits are not numbers of their own)."""
    return blank(text, (match.span() for _, match in dates_in(text)))
