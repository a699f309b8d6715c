"""Numbers spelled in words: "seven", "twenty-three", "a million", "two thirds". The reader
(`quantities`) gives them their bound and direction from the words before them."""

from __future__ import annotations

import re
from collections.abc import Iterator

_UNITS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
]
_WORD_VALUES = {w: i for i, w in enumerate(_UNITS)} | {
    w: 10 * i
    for i, w in enumerate(["thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"], 3)
}
_WORD_SCALES = {
    "hundred": 100,
    "thousand": 10**3,
    "million": 10**6,
    "billion": 10**9,
    "trillion": 10**12,
    "dozen": 12,
}
_SCALE = "|".join(_WORD_SCALES)
_WORD = "|".join(sorted([*_WORD_VALUES, *_WORD_SCALES], key=len, reverse=True))
# No named groups: plan.py embeds this pattern twice in one expression.
WORD_NUMBER = re.compile(
    rf"\b(?:an?\s+(?=(?:{_SCALE})\b))?(?:{_WORD})"
    rf"(?:(?:[- ]|\s+and\s+)(?:{_WORD}))*\b",
    re.I,
)
_PARTS = {
    "half": 2,
    "halves": 2,
    "third": 3,
    "quarter": 4,
    "fourth": 4,
    "fifth": 5,
    "sixth": 6,
    "seventh": 7,
    "eighth": 8,
    "ninth": 9,
    "tenth": 10,
}
WORD_FRACTION = re.compile(
    r"\b(?:(?P<count>an?|one|two|three|four|five|six|seven|eight|nine)[\s-]+)?"
    r"(?P<part>halves|half|(?:third|quarter|fourth|fifth|sixth|seventh|eighth|ninth|tenth)s?)"
    r"\b",
    re.I,
)
# "the first half" is a part of something, not the value 0.5.
_HALF_OF_A_WHOLE = re.compile(
    r"\b(?:first|second|other|latter|former|top|bottom|upper|lower)"
    r"\s+$",
    re.I,
)
# "the one that", "no one", "one-off": pronouns and compounds, not the number 1.
_ONE_PRONOUN_BEFORE = re.compile(r"\b(?:the|this|that|which|each|any|every|no|some)\s+$", re.I)
_ONE_PRONOUN_AFTER = re.compile(r"(?:\s+another\b|'s\b|-)")


def word_numbers(text: str) -> Iterator[tuple[float, float, re.Match[str]]]:
    """Numbers spelled in words, with their step: "seven", "twenty-three", "a million" (the
    step of a magnitude word is the magnitude: "two billion" is rounded). A pronoun "one" is
    left out."""
    for match in WORD_NUMBER.finditer(text):
        words = re.split(r"[- ]+(?:and\s+)?", match[0].lower())
        if words == ["one"] and (
            # A window before it, not the text so far: the cost stays linear.
            _ONE_PRONOUN_BEFORE.search(text, max(0, match.start() - 40), match.start())
            or _ONE_PRONOUN_AFTER.match(text, match.end())
        ):
            continue
        total = current = 0
        for word in words:
            if word in ("a", "an"):
                current = 1
            elif word in _WORD_SCALES:
                scale = _WORD_SCALES[word]
                if scale < 1000:
                    current = max(current, 1) * scale
                else:
                    total += max(current, 1) * scale
                    current = 0
            else:
                current += _WORD_VALUES[word]
        last = _WORD_SCALES.get(words[-1], 1)
        yield float(total + current), float(last if last >= 100 else 1), match


def word_fractions(text: str) -> Iterator[tuple[float, re.Match[str]]]:
    """Fractions in words: "half", "two thirds", "a quarter"; an ordinal ("the third") is not."""
    for match in WORD_FRACTION.finditer(text):
        part = match["part"].lower().removesuffix("s")
        part = "half" if part == "halve" else part
        if match["count"] is None and (
            part != "half"
            or _HALF_OF_A_WHOLE.search(text, max(0, match.start() - 40), match.start())
        ):
            continue
        count = (
            1
            if match["count"] is None or match["count"].lower() in ("a", "an")
            else _WORD_VALUES[match["count"].lower()]
        )
        yield count / _PARTS[part], match
