"""Number expressions in text, read whole: what an answer claims and what an output shows.

One tokenizer serves both sides. A number expression is its digits (thousands separators,
decimals, scientific notation; in an answer digit groups split by spaces, "4 2" is 42, never in
an output, where print(4, 2) shows two numbers), a currency sign, a
sign (a minus, accounting parentheses "(300)", or the words before it: "fell by 3"), a
magnitude ("5bn", "2.5 million", "a dozen"), a percent, a unit glued or spaced ("1.5s",
"5 GHz"), a bound ("over", "at least"), an approximation ("about"), or words ("forty-two",
"a million", "two thirds"). Text is normalized first: compatibility forms, any script's digits
as ASCII, invisible format characters removed, so "9\u200b99" reads as 999.

An answer's number glued to more than the tokenizer reads ("1,00,000", "0xFF", "6T"), with an
unknown magnitude ("6 Mio") or denied ("not 6") is one literal claim, never its pieces; only
positions ("line 3", "3rd", "COVID-19") and rounding statements ("to 2 decimal places")
claim nothing. An output's number glued to an unknown suffix ("x86", "4f") is no fact.
Numbers in words are read by `spelled`; `comparison` decides whether a shown value bears out
a number read here.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass

from .spelled import word_fractions, word_numbers
from .values import CURRENCY, UNIT_AFTER, blank, unit_factors

_SUPERSCRIPT = "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079\u207b"
_SUPERSCRIPTS = str.maketrans(_SUPERSCRIPT, "0123456789-")


def normalize(text: str) -> str:
    """NFKC, every decimal digit as ASCII, format characters (zero-width and the like) gone;
    a superscript is a power ("10\u00b2" is 10^2, not 102)."""
    if "^{" in text or "<sup>" in text:  # LaTeX and HTML powers: "10^{3}" is 10^3
        text = re.sub(
            r"\^\{([-+]?\d+)\}|<sup>([-+]?\d+)</sup>", lambda m: "^" + (m[1] or m[2]), text
        )
    if "frac{" in text:  # LaTeX: "$\frac{1}{2}$" is 1/2, its $ math mode, not dollars
        text = re.sub(
            r"(\$?)\\[dt]?frac\{\s*(\d+)\s*\}\{\s*(\d+)\s*\}(\$?)",
            lambda m: f" {m[2]}/{m[3]}" if m[1] and m[4] else f"{m[2]}/{m[3]}",
            text,
        )
    if text.isascii():
        return text  # the common case, a long output's lines among them
    text = re.sub(f"[{_SUPERSCRIPT}]+", lambda m: "^" + m[0].translate(_SUPERSCRIPTS), text)
    out = []
    for ch in unicodedata.normalize("NFKC", text):
        category = unicodedata.category(ch)
        if category == "Cf":
            continue
        out.append(
            str(unicodedata.digit(ch)) if category == "Nd" else "/" if ch == "\u2044" else ch
        )
    return "".join(out)


_NUMBER = r"""
    (?<![\w.])(?P<paren>\((?=[-$\u20ac\u00a3\u00a5\d.]))?
    (?P<sign>[-\u2212+](?=[$\u20ac\u00a3\u00a5\d.]))?
    (?P<cur>[$\u20ac\u00a3\u00a5])?
    (?P<num>DIGITS)
    (?:[eE](?P<exp>[-+]?\d+)|\s?[\u00d7x*]\s?10\^(?P<exp2>[-+]?\d+))?
    (?P<pct>\s?%|\s(?:percent|per\ cent|pct)\b)?
    (?:(?P<mag1>(?i:bn|mn|mln)|[kKMB])(?![A-Za-z])
       |[\s-]?(?P<mag2>(?:hundred|thousand|million|billion|trillion|lakh|crore)s?|dozen|grand
                       |(?i:bn|mn|mln)|[kKMB])(?![A-Za-z]))?
    """
# An answer's digit groups split by spaces are one number ("4 2" is 42): it claims it whole.
NUMBER = re.compile(
    _NUMBER.replace("DIGITS", r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:[\ _']\d+)*(?:\.\d+)?|\.\d+"),
    re.X,
)
# An output's never are: print(4, 2) shows 4 and 2, not 42.
OUTPUT_NUMBER = re.compile(
    _NUMBER.replace(
        "DIGITS",
        r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d{1,3}(?:[_']\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
        r"|\.\d+",
    ),
    re.X,
)
# A run of digits glued to more than the tokenizer reads ("1,00,000", "0xFF", "1:30", "5-7",
# "6e", "6T") is one claim that must appear literally; "50-row" is a compound adjective.
_RUN_AFTER = re.compile(r"(?:\w|[.,:/^\u00b7\u2030'-](?=\w)(?!-[A-Za-z]{2}))+")
_RUN_BEFORE = re.compile(r"(?:\w|\d[.,:/^\u00b7'-])+$")
# A magnitude the tokenizer does not know ("6 Mio", "6 Mrd", "6 thou"), a vague plural
# ("thousands of"), a denial ("not 6"): claims that only an output's very words can bear out.
_VAGUE_MAGNITUDE = re.compile(
    r"\s?(?:(?i:mio|mill?|mrd|mds?|thou|tn|trn?|bil|lacs?|cr)\.?"
    r"|MM|T|G)(?![A-Za-z])"
)
VAGUE_PLURAL = re.compile(
    r"\b(?:tens|dozens|scores|hundreds|thousands|millions|billions|"
    r"trillions)\s+of\b",
    re.I,
)
# Counts in other words: "no tests failed" is at most 0 of what it names, "a single" is 1,
# "twice as" a ratio of 2; "NaN" and "infinity" only as an output prints them.
_COUNT_WORDS = re.compile(
    r"\b(?P<none>no\s+(?=[a-z]+\s+(?:failed|passed|errored|crashed|"
    r"matched|remain\w*|were|are|was|is|had|have|exist\w*)\b))|"
    r"\b(?P<one>a\s+single)\b|\b(?P<two>twice)(?=\s+as\b|\s*(?:[.,;!?)]|$))|"
    r"\b(?P<three>thrice)(?=\s+as\b|\s*(?:[.,;!?)]|$))|(?<![\w.])(?P<odd>nan|inf(?:inity)?)\b",
    re.I,
)
_CHECKED_TWICE = re.compile(
    r"\b(?:checked|verified|tested|confirmed|validated|ran|run|executed|computed)\s+$", re.I
)
_NEGATED = re.compile(r"\b(?:not|isn't|aren't|wasn't|weren't|never)\s+(?:even\s+)?$", re.I)
# Points are a difference of percentages ("5 percentage points"): only a derived change holds.
_POINTS = re.compile(r"\s*(?:percentage\s+points?|pp\b|p\.p\.|basis\s+points?|bps?\b)", re.I)
_MAGNITUDES = {
    "k": 1e3,
    "m": 1e6,
    "b": 1e9,
    "bn": 1e9,
    "mn": 1e6,
    "mln": 1e6,
    "hundred": 1e2,
    "lakh": 1e5,
    "crore": 1e7,
    "grand": 1e3,
    "thousand": 1e3,
    "million": 1e6,
    "billion": 1e9,
    "trillion": 1e12,
    "dozen": 12.0,
}

_APPROX = re.compile(
    r"(?:about|approximately|approx\.?|roughly|around|nearly|almost|close to|"
    r"some|~|\u2248|circa|ca\.)\s*$",
    re.I,
)
_NEARLY = re.compile(r"(?:nearly|almost|just\s+(?:under|below|short\s+of))\s*$", re.I)
# "no more than 6" is at most 6, "no fewer than 10" at least 10.
_NO_MORE = re.compile(r"\bno[t]?\s+(?:more|greater|higher|larger|bigger)\s+than\s*$", re.I)
_NO_LESS = re.compile(r"\bno[t]?\s+(?:fewer|less|lower|smaller)\s+than\s*$", re.I)
_ABOVE = re.compile(
    r"(?:over|more than|above|at least|exceeds?|exceeding|upwards of|(?<![-=])>=?|"
    r"\u2265)\s*$",
    re.I,
)
_BELOW = re.compile(r"(?:under|less than|below|fewer than|at most|up to|<=?|\u2264)\s*$", re.I)
# "a 3% drop": the direction named after the number.
_DOWN_AFTER = re.compile(
    r"\s*(?:-?\s*points?\s+)?(?:drop|declin|decreas|fall|loss|reduction|cut|"
    r"lower|down\b|cheaper|less\b|fewer|smaller|slower|shorter|"
    r"worse|below)",
    re.I,
)
_UP_AFTER = re.compile(
    r"\s*(?:-?\s*points?\s+)?(?:ris[ei]|increas|gain|growth|jump|climb|"
    r"higher|up\b|more\b|greater|larger|bigger|dearer|above)",
    re.I,
)
_INCLUSIVE = re.compile(r"(?:at least|at most|up to|upwards of|>=|<=|\u2265|\u2264)\s*$", re.I)
DOWN = re.compile(
    r"\b(?:decreas\w*|declin\w*|drop\w*|fell|fall\w*|down|lower|loss|lost|"
    r"negative|minus|deficit|shr[aiu]nk\w*|reduc\w*|remov\w*|delet\w*)\b",
    re.I,
)
# "dropped 3 rows" counts what was removed; "dropped by 3" is a change of -3.
_DOWN_ONLY_WITH_BY = re.compile(r"\b(?:drop\w*|lost|reduc\w*|remov\w*|delet\w*)$", re.I)
_UP = re.compile(
    r"\b(?:increas\w*|ris[ei]\w*|rose|gr[eo]w\w*|up|gain\w*|climb\w*|jump\w*|"
    r"higher)\b",
    re.I,
)
# The direction word must lead straight to the number: "fell by 3" is -3, "fell to 6" is 6.
_DIRECTION_LINK = re.compile(r"\s+(?P<by>by\s+|of\s+)?(?:an?\s+)?$", re.I)
# A number after these words is a position, not a value: "line 3", "step 2", "#1".
_POSITION = re.compile(
    r"(?:\bline|\blines|\bstep|\bcell|\battempt|\bitem|\bpage|\brank|"
    r"\bversion|\bpython|\bno\.|#)\s*$",
    re.I,
)
_ROUNDING_AFTER = re.compile(
    r"\s*(?:decimal\s+(?:places?|digits?)|decimals?\b|dp\b|d\.p\.|"
    r"significant\s+(?:figures?|digits?)|sig\.?\s*figs?\b)",
    re.I,
)
# "the first three rows": how many rows a passage is, shown or not, not a value it claims.
_FIRST_BEFORE = re.compile(r"\b(?:first|last)\s+$", re.I)
_ROWS_AFTER = re.compile(r"\s+(?:rows?|lines?|records?|entries)\b", re.I)
_ROUNDING_BEFORE = re.compile(r"(?:\bto|\bat|\bwith|\bin|\brounded|\()\s*$", re.I)
# COVID-19, UTF-8, x86-64 name things; "3-500" is a range, "top-500" a value.
_IDENTIFIER_HYPHEN = re.compile(r"\b(?:[A-Z]{2,}|(?=\w*[A-Za-z])(?=\w*\d)\w+)-$")
_PROSE_BEFORE = re.compile(r"[A-Za-z]{2,}\s+$")
# "was (300)", "net: (300)": the parentheses stand where a value does, so they are a sign.
_LINK_BEFORE = re.compile(
    r"\b(?:is|was|were|are|be|been|of|at|to|by|as|net|totall?ed|totals?|posted|reported)\s+$",
    re.I,
)
# "Net income (300)": money words make parentheses a sign wherever they stand.
_MONEY_BEFORE = re.compile(
    r"\b(?:income|profit|loss|revenue|sales|balance|cost|expenses?|cash|margin|earnings|"
    r"ebitda|net|deficit|debt|equity|amount|price|budget|spend\w*|p&l)\b",
    re.I,
)
# "the highest sales (210)": a superlative and the words it ranks by, then the count.
_SUPERLATIVE_BEFORE = re.compile(
    r"\b(?:most|highest|largest|biggest|greatest|top|lowest|smallest|least|fewest)"
    r"(?:\s+[A-Za-z]+){0,2}\s*$",
    re.I,
)
# "5 NaN values", "5 missing (NaN) values": NaN names what is counted, it is no value of its own.
_NAN_NAMES = re.compile(
    r"\)?\s+(?:values?|entries|entry|rows?|cells?|counts?|records?|fields?|items?)\b", re.I
)
_TRUNCATED = re.compile(r"\btruncat\w*|\bfloor\w*|\brounded\s+down\b", re.I)
# The answer says its numbers are rounded: they may drop more than an exact number may.
_ROUNDED = re.compile(
    r"\bround(?:ed|ing)\b|\bdecimal\s+places?\b|\bsignificant\s+(?:figures?|digits?)\b|"
    r"\bsig\.?\s*figs?\b",
    re.I,
)
_ORDINAL = re.compile(r"(?:st|nd|rd|th)(?![A-Za-z])", re.I)
_MULTIPLIER = re.compile(r"\s?[x\u00d7](?![\w])")


@dataclass(frozen=True)
class Num:
    """A number as written: its value, the step of its last stated digit, its bound."""

    text: str
    start: int
    end: int
    value: float
    step: float
    percent: bool = False
    direction: str | None = None  # "down" ("fell by 3": the change is -3) or "up"
    bound: str = "exact"  # "exact", "approx", "nearly" (approx, from below), "above", "below"
    unit: str | None = None
    factors: tuple[float, ...] = (1.0,)  # "12 KB" is 12 times 1000 or 1024 bytes
    strict: bool = False  # "more than": the number itself is outside the bound
    truncatable: bool = False  # "3.1415, truncated": its stated digits are the fact's
    stated_step: float = 0.0  # the step of the last written digit, trailing zeros included
    literal: bool = False  # read only as its text: an output must show it word for word
    points: bool = False  # percentage or basis points: a change between two percentages
    converts: bool = False  # the answer says it is a share: a fraction and its percentage agree
    rounded: bool = False  # the answer says it rounded ("98 (rounded)", "to 2 decimal places")
    whole: bool = False  # written as a whole number ("42"): no decimals, exponent or magnitude
    rescaled: bool = False  # compared in another unit: "15 days" of 15 days 04:00:00 in seconds

    def candidates(self) -> Iterator[tuple[float, float]]:
        """The values it may mean, each with the step of its last stated digit."""
        for factor in self.factors:
            scale = factor / 100 if self.percent else factor
            yield self.value * scale, self.step * scale


@dataclass(frozen=True)
class Found:
    """A number an output shows: its value and the step of its printed last decimal."""

    value: float
    step: float
    start: int
    end: int
    unit: str | None = None  # as spelled after it ("MB") or its currency
    percent: bool = False  # the digits of a percentage: "50%" is 50 only to a claimed "50%"
    converted: bool = False  # a percentage's fraction: 0.5 of "50%"


def _parse(match: re.Match[str], rounded: bool) -> tuple[float, float, float]:
    """(value, step, stated step) of a `NUMBER` match. A rounded number ("about 2,500,000")
    does not state its trailing zeros; an integer mantissa in scientific notation ("1e3") is
    exact."""
    digits = re.sub(r"[, _']", "", match["num"])
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    exp = match["exp"] or match["exp2"]
    magnitude = (match["mag1"] or match["mag2"] or "").lower()
    magnitude = magnitude.removesuffix("s") if len(magnitude) > 3 else magnitude
    scale = 10.0 ** int(exp or 0) * _MAGNITUDES.get(magnitude, 1.0)
    value = float(digits) * scale
    if match["sign"] in ("-", "\u2212"):
        value = -value
    step = stated = 0.0 if exp and not decimals else 10.0**-decimals * scale
    if rounded and not decimals and digits.strip("0"):
        step *= 10.0 ** (len(digits) - len(digits.rstrip("0")))
    return value, step, stated


def numbers_in(text: str) -> Iterator[Found]:
    """The numbers an output shows (normalized text), each token alone: "4 2" is 4 and 2,
    "[6,500]" (a JSON list) is 6 and 500, "6,500" elsewhere is 6500. "(300)" on a money line
    is also -300; a percentage is its fraction (`converted`), and its digits only for a claim
    of a percentage."""
    for match in OUTPUT_NUMBER.finditer(text):
        end = match.end()
        unit = UNIT_AFTER.match(text, end)
        if re.match(r"[A-Za-z_]", text[end : end + 1]) and not unit:
            continue
        value, step, _ = _parse(match, False)
        printed = step if "." in match["num"] else 0.0
        spelled = CURRENCY.get(match["cur"] or "") or (unit[1] if unit else None)
        if (
            "," in match["num"]
            and re.search(r"[\[,]$", text[: match.start()])
            or re.match(r"[\],]", text[end : end + 1])
            and "," in match["num"]
        ):
            for part in match["num"].split(","):
                yield Found(float(part), 0.0, match.start(), end)
            continue
        if match["pct"]:
            yield Found(value, printed, match.start(), end, percent=True)
            yield Found(value / 100, printed / 100, match.start(), end, converted=True)
            continue
        yield Found(value, printed, match.start(), end, spelled)
        if match["paren"] and text[end : end + 1] == ")" and _accounting(text):
            yield Found(-value, printed, match.start(), end)


def _lead(before: str) -> tuple[str, bool, str | None]:
    """The bound, strictness and direction the words before a number give it."""
    bound = (
        "below"
        if _NO_MORE.search(before)
        else "above"
        if _NO_LESS.search(before)
        else "nearly"
        if _NEARLY.search(before)
        else "approx"
        if _APPROX.search(before)
        else "above"
        if _ABOVE.search(before)
        else "below"
        if _BELOW.search(before)
        else "exact"
    )
    strict = (
        bound in ("above", "below")
        and not _INCLUSIVE.search(before)
        and not _NO_MORE.search(before)
        and not _NO_LESS.search(before)
    )
    for pattern in (_NO_MORE, _NO_LESS, _APPROX, _ABOVE, _BELOW):
        before = pattern.sub("", before)
    link = _DIRECTION_LINK.search(before)
    if link is None:
        return bound, strict, None
    head = before[: link.start()]
    down = re.search(DOWN.pattern + r"$", head, re.I) is not None and (
        link["by"] is not None or not _DOWN_ONLY_WITH_BY.search(head)
    )
    direction = "down" if down else "up" if re.search(_UP.pattern + r"$", head, re.I) else None
    return bound, strict, direction


def claimed_numbers(text: str) -> Iterator[Num]:
    """The numbers an answer (normalized, its quotes and dates masked) claims."""
    claimed_to = 0
    for match in NUMBER.finditer(text):
        end = match.end()
        if match.start() < claimed_to:
            continue  # a piece of a run claimed whole
        before = text[max(0, match.start() - 40) : match.start()]
        if (
            _POSITION.search(before)
            or (_FIRST_BEFORE.search(before) and _ROWS_AFTER.match(text, end))
            or _IDENTIFIER_HYPHEN.search(before)
            or (_ROUNDING_AFTER.match(text, end) and _ROUNDING_BEFORE.search(before))
        ):
            continue
        if _ORDINAL.match(text, end) and "." not in match["num"]:
            continue  # "3rd": a position
        literal = _literal_run(text, match)
        if literal is not None:
            claimed_to = literal.end
            yield literal
            continue
        bound, strict, direction = _lead(before)
        value, step, stated = _parse(match, rounded=bound != "exact")
        if match["paren"] and text[end : end + 1] == ")" and not _aside(match, before):
            value, end = -value, end + 1  # accounting: "(300)" is -300
        unit_match = UNIT_AFTER.match(text, end) if not match["pct"] else None
        unit = CURRENCY[match["cur"]] if match["cur"] else (unit_match[1] if unit_match else None)
        factors = unit_factors(unit_match[1]) if unit_match else (1.0,)
        if unit_match:
            end = unit_match.end()
        elif multiplier := _MULTIPLIER.match(text, end):
            end = multiplier.end()  # "50x faster": 50 is claimed, as a ratio
        if direction is None:
            direction = (
                "down"
                if _DOWN_AFTER.match(text, end)
                else "up"
                if _UP_AFTER.match(text, end)
                else None
            )
        # Rounding is to the nearest unless the answer says it cut the digits off.
        truncatable = (
            "." in match["num"]
            and not (match["mag1"] or match["mag2"])
            and _TRUNCATED.search(text, max(0, match.start() - 40), end + 40) is not None
        )
        points = _POINTS.match(text, end) if not match["pct"] else None
        if points is not None:
            end = points.end()
        # A magnitude word rounds ("2 million" for 1,999,999), but "0.1k" is no way to write 98.
        magnified = (
            bool(match["mag1"] or match["mag2"])
            and abs(float(re.sub(r"[, _']", "", match["num"]))) >= 1
        )
        rounded = (
            magnified or _ROUNDED.search(text, max(0, match.start() - 40), end + 40) is not None
        )
        whole = "." not in match["num"] and not (
            match["exp"] or match["exp2"] or match["mag1"] or match["mag2"]
        )
        yield Num(
            text[match.start() : end].strip(),
            match.start(),
            end,
            value,
            step,
            bool(match["pct"] or points),
            direction,
            bound,
            unit,
            factors,
            strict,
            truncatable,
            stated,
            points=points is not None,
            rounded=rounded,
            whole=whole,
        )


_CURRENCY_SHOWN = re.compile(r"[$\u20ac\u00a3\u00a5]|\b(?:USD|EUR|GBP|JPY|CHF)\b")


def _accounting(line: str) -> bool:
    """Whether an output line is money, where "(1,200)" is -1,200: a currency or a money word
    ("net", "profit"). Elsewhere parentheses are a tuple or an aside: "rows: (1,200)"."""
    return bool(_CURRENCY_SHOWN.search(line) or _MONEY_BEFORE.search(line))


def _aside(match: re.Match[str], before: str) -> bool:
    """A plain count in parentheses after prose ("the most rows (31)", "the highest sales
    (210)": a superlative's evidence even after a money word), not accounting."""
    return (
        not (match["cur"] or match["sign"])
        and _PROSE_BEFORE.search(before) is not None
        and _LINK_BEFORE.search(before) is None
        and (_MONEY_BEFORE.search(before) is None or _SUPERLATIVE_BEFORE.search(before) is not None)
    )


def _literal_run(text: str, match: re.Match[str]) -> Num | None:
    """The number as one literal claim, when it is denied ("not 6"), glued to more than it
    reads ("1,00,000", "0xFF") or given a magnitude the tokenizer does not know ("6 Mio")."""
    start, end = match.start(), match.end()
    head = max(0, start - 40)  # a window, not the text so far: the cost stays linear
    glued = _RUN_BEFORE.search(text, head, start)
    if glued is not None:
        start = glued.start()
    run = _RUN_AFTER.match(text, end)
    vague = _VAGUE_MAGNITUDE.match(text, end)
    if run is not None and (
        UNIT_AFTER.match(text, end) or _ORDINAL.fullmatch(run[0]) or _MULTIPLIER.match(text, end)
    ):
        run = None
    if vague is not None and UNIT_AFTER.match(text, end):
        vague = None
    denied = _NEGATED.search(text, head, match.start())
    if glued is None and run is None and vague is None and denied is None:
        return None
    if denied is not None:
        start = denied.start()
    end = max(end, run.end() if run else 0, vague.end() if vague else 0)
    return Num(text[start:end].strip(), start, end, math.nan, 0.0, literal=True)


def claimed_words(text: str) -> Iterator[Num]:
    """Fractions and numbers in words an answer claims ("two thirds", "a dozen", "one")."""
    spans: list[tuple[int, int]] = []  # each phase masks its matches once: linear work
    for match in _COUNT_WORDS.finditer(text):
        if match["odd"] and (
            _NAN_NAMES.match(text, match.end()) or re.search(r"\d\s*$", text[: match.start()])
        ):
            continue
        if (match["two"] or match["three"]) and _CHECKED_TWICE.search(
            text, max(0, match.start() - 30), match.start()
        ):
            continue  # "checked twice" says how it was checked, not a value
        value = 0.0 if match["none"] else 1.0 if match["one"] else 2.0 if match["two"] else 3.0
        yield Num(
            match[0].strip(),
            match.start(),
            match.end(),
            value,
            0.0,
            bound="below" if match["none"] else "exact",
            literal=bool(match["odd"]),
        )
        spans.append(match.span())
    masked, spans = blank(text, spans), []
    for match in VAGUE_PLURAL.finditer(masked):
        yield Num(match[0], match.start(), match.end(), math.nan, 0.0, literal=True)
        spans.append(match.span())
    masked, spans = blank(masked, spans), []
    for value, match in word_fractions(masked):
        before = text[max(0, match.start() - 40) : match.start()]
        bound, strict, direction = _lead(before)
        yield Num(
            match[0],
            match.start(),
            match.end(),
            value,
            0.0,
            bound=bound,
            strict=strict,
            direction=direction,
        )
        spans.append(match.span())
    masked = blank(masked, spans)
    for value, step, match in word_numbers(masked):
        before = masked[max(0, match.start() - 40) : match.start()]
        if _POSITION.search(before) or (
            _FIRST_BEFORE.search(before) and _ROWS_AFTER.match(masked, match.end())
        ):
            continue
        bound, strict, direction = _lead(before)
        if bound not in ("approx", "nearly") and step < 10**6:
            step = 1.0  # "one hundred" is 100, not 101; "about a hundred" is rounded
        yield Num(
            match[0],
            match.start(),
            match.end(),
            value,
            step,
            bound=bound,
            strict=strict,
            direction=direction,
            stated_step=step,
            rounded=step >= 10**6,  # "two million": a magnitude rounds
            whole=True,
        )
