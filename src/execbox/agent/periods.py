"""Period words whose dates the answer does not spell out: halves of a year ("H2", "the first
half"), fiscal years ("FY24", "fiscal 2024") and weekends or weekdays. Each is grounded by an
output or the question stating it, or, for a half or a weekend, by every date the outputs show
falling in it. A fiscal year depends on a calendar no output gives, so only its statement
grounds it. Otherwise the answer names a period it could not have read: refused.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterator

from .evidence import Evidence
from .models import Claim

_HALF = re.compile(
    r"(?<![\w-])(?:H(?P<h>[12])|(?P<nh>[12])H)(?:\s?'?\d{2}(?:\d{2})?)?(?![\w-])"
    r"|\b(?P<word>first|second|1st|2nd)\s+half\b"
    r"(?!\s+of\s+(?!(?:the\s+)?(?:year|(?:19|20)\d\d)\b))",
)
_FISCAL = re.compile(
    r"(?<![\w-])(?:FY\s?'?|[Ff]iscal\s+(?:[Yy]ear\s+)?'?)(?P<y>(?:19|20)?\d\d)(?![\w-])"
)
_WEEK_PART = re.compile(
    r"\b(?:(?P<end>week-?ends?)|(?P<day>week-?days|business\s+days|working\s+days))\b",
    re.I,
)
_DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
_SHOWN_WEEKDAY = re.compile(
    r"\b(" + "|".join(_DAYS) + r"|mon|tue|tues|wed|thu|thur|thurs|fri|sat|sun)s?\b"
)


def period_word_claims(
    text: str, evidence: Evidence, question: str
) -> Iterator[tuple[tuple[int, int], Claim]]:
    """Each period word of `text` with its claim, grounded or refused."""
    asked = question.casefold()
    shown = evidence.folded()
    for match in _HALF.finditer(text):
        half = int(match["h"] or match["nh"] or (1 if match["word"] in ("first", "1st") else 2))
        names = (f"h{half}", f"{half}h", ("first" if half == 1 else "second") + " half")
        said = any(
            re.search(rf"(?<![\w-]){n}(?![\w-])", blob) for n in names for blob in (shown, asked)
        )
        months = _shown_months(evidence)
        inside = bool(months) and all((m > 6) == (half == 2) for m in months)
        yield match.span(), _claim(match[0], said or inside, "half of the year")
    for match in _FISCAL.finditer(text):
        year = int(match["y"]) % 100
        said = any(
            re.search(
                rf"(?<![\w-])(?:fy\s?'?|fiscal\s+(?:year\s+)?'?)(?:19|20)?{year:02d}(?!\d)", blob
            )
            for blob in (shown, asked)
        )
        yield match.span(), _claim(match[0], said, "fiscal year", fiscal=True)
    for match in _WEEK_PART.finditer(text):
        weekend = match["end"] is not None
        word = "weekend" if weekend else "weekday"
        said = any(word in blob or word.replace("k", "k-", 1) in blob for blob in (shown, asked))
        days = _shown_weekdays(evidence)
        inside = bool(days) and all((d >= 5) == weekend for d in days)
        yield match.span(), _claim(match[0], said or inside, f"{word} (part of the week)")


def _claim(text: str, grounded: bool, what: str, *, fiscal: bool = False) -> Claim:
    if grounded:
        return Claim(text=text, kind="date", grounded=True, source=f"an output shows this {what}")
    why = (
        "no output states this fiscal year, and its dates depend on a calendar they do not give"
        if fiscal
        else f"no output states this {what}, nor do all the dates they show fall in it"
    )
    return Claim(
        text=text,
        kind="date",
        grounded=False,
        detail=f"{why}: state the dates or periods the outputs show",
    )


def _shown_months(evidence: Evidence) -> set[int]:
    return {key[1] for fact in evidence.dates for key in fact.value[:1]}


def _shown_weekdays(evidence: Evidence) -> set[int]:
    days = {
        datetime.date(key[0], key[1], key[2]).weekday()
        for fact in evidence.dates
        for key in fact.value[:1]
        if key[2] is not None and _valid(key)
    }
    for match in _SHOWN_WEEKDAY.finditer(evidence.folded()):
        days.add([d[:3] for d in _DAYS].index(match[1][:3]))
    return days


def _valid(key: tuple[int, int, int | None]) -> bool:
    try:
        datetime.date(key[0], key[1], key[2] or 1)
    except ValueError:
        return False
    return True
