"""Grounding numbers: a number, unit, fraction, operation or stated change in the answer is
borne out by an output value near it, read whole by `quantities` and scaled by `values`."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from itertools import pairwise

from .comparison import BOUND_RANGE, matches, within
from .evidence import Context, Evidence, Fact, label_of
from .ground_text import contains, norm
from .models import Claim
from .quantities import Num
from .values import (
    CURRENCY,
    UNIT_AFTER,
    UNIT_FAMILIES,
    family_of,
    mentions_unit,
    scale_of,
    unit_factors,
)

FRACTION = re.compile(r"(?<![\w./])(\d+)/(\d+)(?![\w/])")
# An output label that makes its fraction a share: "conversion_rate", "share", "pct".
_SHARE_LABEL = re.compile(
    r"(?<![a-z])(?:share|rate|ratio|proportion|pct|percent(?:age)?|fraction|frac)s?(?![a-z])"
)
# An output line naming the unit its values are in: "currency: EUR", "unit = 'ms'".
_UNIT_LINE = re.compile(
    r"\s*['\"]?(?:currency|ccy|units?)['\"]?\s*[:=]\s*['\"]?([^\s'\",]+)['\"]?,?\s*$", re.I
)
# "3 out of 4": a count and its whole, both shown and shown together.
OUT_OF = re.compile(r"(?<![\w.,])(\d+)\s+out\s+of\s+(\d+)(?![\w]|[.,]\d)", re.I)
# The label of a whole "X out of Y" counts against: "total: 4", "n = 4", "tests: 4".
_WHOLE_LABEL = re.compile(
    r"\b(?:total\w*|count|n|all|size|len|length|rows|tests|samples|trials|attempts|runs)\b"
    r"[^\d]*$",
    re.I,
)
# An operation on stated values ("6 + 1"): the answer claims its value unless it states it.
_OPERATOR = (
    r"(\s*(?:\*\*|\^|[+*\u00d7\u00b7\u22c5])\s*|\s+x\s+|\s[-\u2212/]\s|\s+(?:times|plus|minus|"
    r"multiplied\s+by|divided\s+by|to\s+the\s+power\s+of)\s+)"
)
OPERATION = re.compile(
    r"(?<![\w.])(\d+(?:\.\d+)?)(?:" + _OPERATOR + r"\d+(?:\.\d+)?)+"
    r"(?![\w^]|\.\d)(?!\s*(?:=|[-+*/^\u00d7\u2212]\s*\d))",
    re.I,
)
_OPERAND = re.compile(_OPERATOR + r"(\d+(?:\.\d+)?)", re.I)
_SYMBOLS = {
    "**": "^",
    "\u00d7": "*",
    "\u00b7": "*",
    "\u22c5": "*",
    "x": "*",
    "\u2212": "-",
    "times": "*",
    "multiplied by": "*",
    "plus": "+",
    "minus": "-",
    "divided by": "/",
    "to the power of": "^",
}
POWER_WORD = re.compile(r"(?<=\d)\s+(squared|cubed)\b", re.I)

_FROM_TO = re.compile(r"\s*(?:to|->|\u2192)\s*")  # "10 to 12": a change the answer states


def operation_claim(
    match: re.Match[str], evidence: Evidence, question_numbers: list[float]
) -> Claim:
    """'6 + 1' unanswered by '= 7' claims 7: its value must be grounded like a number."""
    value = _evaluate(float(match[1]), _OPERAND.findall(match[0], len(match[1])))
    num = Num(match[0], match.start(), match.end(), value if value is not None else math.nan, 0.0)
    claim = number_claim(num, evidence, question_numbers)
    if not claim.grounded:
        claim = claim.model_copy(
            update={
                "detail": f"{match[0]} is {value:g}, which " + (claim.detail or "no output shows")
            }
        )
    return claim


def _evaluate(first: float, operations: list[tuple[str, str]]) -> float | None:
    """The value of `first op n op n ...`: powers, then * and /, then + and -."""
    values = [first, *(float(n) for _, n in operations)]
    ops = [_SYMBOLS.get(" ".join(op.split()).lower(), op.strip()) for op, _ in operations]
    try:
        for level in ("^", "*/", "+-"):
            i = 0
            while i < len(ops):
                if ops[i] not in level:
                    i += 1
                    continue
                a, b, op = values[i], values.pop(i + 1), ops.pop(i)
                values[i] = (
                    a**b
                    if op == "^"
                    else a * b
                    if op == "*"
                    else a / b
                    if op == "/"
                    else a + b
                    if op == "+"
                    else a - b
                )
    except (ZeroDivisionError, OverflowError):
        return None
    return values[0] if isinstance(values[0], float) else None


def number_claim(
    num: Num, evidence: Evidence, question_numbers: list[float], words: list[str] | None = None
) -> Claim:
    if num.literal:
        return literal_claim(num.text, evidence)
    if any(math.isclose(value, q) for value, _ in num.candidates() for q in question_numbers):
        return Claim(text=num.text, kind="number", grounded=True, source="the question")
    if num.points:  # a difference of percentages: only a change the answer states holds
        return Claim(
            text=num.text,
            kind="number",
            grounded=False,
            detail="points are a change between two stated percentages",
        )
    facts = [f for f in window(num, evidence) if fits(num, f)]
    if num.bound in ("above", "below"):
        # A bound holds for many values: only the lines its words name ("10 errors",
        # "100 tests failed") may bear it out; naming none, every value must.
        stems = [w[:4].lower() for w in words or [] if evidence.labelled(w[:4].lower())]
        if stems:
            facts = [
                f
                for f in facts
                if any(
                    re.search(r"(?<![a-z])" + re.escape(stem), label_of(f.where)) for stem in stems
                )
            ]
        elif num.unit is not None or not all(matches(num, v) for v in evidence.plain_extremes()):
            facts = []
    if facts:
        fact = facts[0]
        return Claim(
            text=num.text, kind="number", grounded=True, run_id=fact.run_id, source=fact.where
        )
    nearest = evidence.nearest(num.value) if math.isfinite(num.value) else None
    unsaid = nearest if nearest is not None and fits(num, nearest, loose=True) else None
    if unsaid is not None and num.bound not in ("above", "below"):
        return Claim(
            text=num.text,
            kind="number",
            grounded=False,
            detail=f"{unsaid.where} shows this value to fewer digits: do not add digits "
            "the output does not show"
            if math.isclose(unsaid.value, num.value, rel_tol=1e-9)
            else f"{unsaid.where} shows this value to more digits: write it as shown, or "
            "say it is rounded (about, ~, rounded)",
        )
    hint = f" (the nearest is {nearest.where})" if nearest is not None else ""
    return Claim(
        text=num.text, kind="number", grounded=False, detail=f"no output shows this value{hint}"
    )


def window(num: Num, evidence: Evidence) -> list[Fact]:
    """The facts near enough in value to be worth comparing (generously: units, signs,
    percentages, bounds); `fits` decides. Each unit scaling is its own small window: one
    window spanning them all ("5 GB" from bytes to gigabytes) would hold every fact."""
    ratios = (
        {1.0}
        if num.unit is None
        else {a / b for a in scale_of(num.unit)[1] for b in evidence.factor_set()}
    )
    bound = num.bound in ("above", "below")
    found: dict[int, Fact] = {}
    for value, step in [*num.candidates(), (num.value, num.step)]:
        for ratio in sorted(ratios):
            scaled, scaled_step = abs(value) * ratio, abs(step) * ratio
            if not (math.isfinite(scaled) and math.isfinite(scaled_step)):
                return []
            high = scaled * (BOUND_RANGE if bound else 1.0) * 1.1 + scaled_step + 1e-9
            low = 0.0 if bound else max(0.0, scaled * 0.9 - scaled_step - 1e-9)
            for fact in evidence.near(-high, -low) + evidence.near(low, high):
                found.setdefault(id(fact), fact)
    return list(found.values())


def fits(num: Num, fact: Fact, *, loose: bool = False) -> bool:
    """Whether `fact` bears out `num`: in the same dimension, scaled to the fact's unit
    (`loose`: within any rounding, said or not)."""
    if fact.percent and not num.percent:
        return False  # "50 rows" is not "missing: 50%"
    if not num.converts and num.direction is None:
        # "Accuracy is 0.9" of a printed 90%: a fraction is its percentage only where the
        # answer says it is a share ("90% of rows", "a 0.9 share", "0.9 (90%)"). A printed
        # fraction under 0.01 may be a percentage already: "0.9%" of "accuracy: 0.009" needs
        # the answer or the output's label to say it is a share ("conversion_rate: 0.0034").
        if fact.converted and not num.percent:
            return False
        if num.percent and not fact.percent and not fact.converted and abs(fact.value) < 0.01:
            label = re.split(r"\d", label_of(fact.where), maxsplit=1)[0]
            if not _SHARE_LABEL.search(label):
                return False
    if num.unit is None:
        return matches(num, fact.value, fact.step, fact.where, fact.percent, loose=loose)
    if fact.unit is None:
        # A unit the fact's line does not give is checked against the question (`unit_claim`).
        return matches(
            replace(num, factors=(1.0,)),
            fact.value,
            fact.step,
            fact.where,
            fact.percent,
            loose=loose,
        )
    family, factors = scale_of(num.unit)
    if family != fact.unit:
        return False
    return any(
        matches(
            replace(
                num,
                value=num.value * ratio,
                step=num.step * ratio,
                stated_step=num.stated_step * ratio,
                factors=(1.0,),
                rescaled=ratio != 1.0,
            ),
            fact.value,
            fact.step,
            fact.where,
            fact.percent,
            loose=loose,
        )
        for ratio in _ratios(factors, fact.factors)
    )


def _ratios(claimed: tuple[float, ...], shown: tuple[float, ...]) -> list[float]:
    """The scalings from a claimed unit to a shown one of its dimension. "KB" (1000 or 1024)
    against "MB" reads both alike; against "MiB" (1024 only) it is another unit."""
    if len(claimed) == len(shown):
        return [a / b for a, b in zip(claimed, shown, strict=True)]
    if (1.0,) in (claimed, shown):  # the base unit: bytes, seconds
        return [a / b for a in claimed for b in shown]
    return []


def literal_claim(text: str, evidence: Evidence, *, listed: bool = False) -> Claim:
    """A number the check cannot read whole: an output must show it word for word; as a
    list's items only if the answer too shows it as a list (`listed`)."""
    for fact in evidence.texts if evidence.may_contain(norm(text)) else []:
        if contains(str(fact.value), norm(text), in_list="," in text and not listed):
            return Claim(
                text=text, kind="number", grounded=True, run_id=fact.run_id, source=fact.where
            )
    return Claim(
        text=text,
        kind="number",
        grounded=False,
        detail="this cannot be read as one number and no output shows it as written",
    )


def derived_claim(
    num: Num,
    changes: list[tuple[Num, Num]],
    evidence: Evidence,
) -> Claim | None:
    """A change the same sentence (`changes`: its from-to pairs) states between two grounded numbers: "from 10 to
    12, up 20%" (relative to the first) or "fell by 3, from 9 to 6"; its direction must agree.
    Operands are the output values they matched (1.4 and 1.6 for "from 1 to 2"), never the
    question's; percentage points are the change between two percentages."""
    scale = (1e-4 if "b" in num.text.lower() else 1e-2) if num.points else 1.0
    size = replace(
        num,
        value=abs(num.value) * scale,
        step=num.step * scale,
        direction=None,
        percent=num.percent and not num.points,
    )
    for first, second in changes:
        for a in [f for f in window(first, evidence) if fits(first, f)][:20]:
            for b in [f for f in window(second, evidence) if fits(second, f)][:20]:
                if a.percent or b.percent:
                    continue  # a percentage's digits: its fraction is the fact to derive from
                change = b.value - a.value
                if (
                    (num.direction == "down" and change >= 0)
                    or (num.direction == "up" and change <= 0)
                    or (size.percent and a.value == 0)
                ):
                    continue
                target = abs(change / a.value if size.percent else change)
                if any(within(size, value, step, target) for value, step in size.candidates()):
                    return Claim(
                        text=num.text,
                        kind="number",
                        grounded=True,
                        run_id=a.run_id,
                        source=f"the change from {first.text} to {second.text}",
                    )
    return None


def from_to_pairs(
    stated: list[tuple[Num, Claim]], text: str, points: bool
) -> list[tuple[Num, Num]]:
    """The "from a to b" pairs of grounded output numbers of one sentence."""
    operands = [
        n
        for n, c in stated
        if c.grounded
        and c.source != "the question"
        and n.percent == points
        and not n.literal
        and n.bound == "exact"
    ]
    return [(a, b) for a, b in pairwise(operands) if _FROM_TO.fullmatch(text, a.end, b.start)]


def fraction_claims(
    match: re.Match[str], text: str, evidence: Evidence, context: Context
) -> list[Claim]:
    """A fraction with a unit ("3/4 hours", "$1/2") is its value in that unit, read as any
    number is: the unit must be its own; without one, `_fraction_claim`."""
    spelled = UNIT_AFTER.match(text, match.end())
    currency = CURRENCY.get(text[match.start() - 1 : match.start()]) if match.start() else None
    if not (spelled or currency) or not float(match[2]):
        return [_fraction_claim(match, evidence)]
    num = Num(
        match[0],
        match.start(),
        match.end(),
        float(match[1]) / float(match[2]),
        0.0,
        unit=currency or (spelled[1] if spelled else None),
        factors=unit_factors(spelled[1]) if spelled and not currency else (1.0,),
    )
    claim = number_claim(num, evidence, [])
    if not claim.grounded and spelled:  # an output's own "3/4 hours"
        literal = literal_claim(text[match.start() : spelled.end()].strip(), evidence)
        return [literal.model_copy(update={"text": match[0]}) if literal.grounded else claim]
    return [claim, unit_claim(num, evidence, context)] if claim.grounded else [claim]


def _fraction_claim(match: re.Match[str], evidence: Evidence) -> Claim:
    """'3/4' is the value 0.75, or an output's own "3/4" or "3 of 4"; never its two numbers
    shown apart."""
    numerator, denominator = float(match[1]), float(match[2])
    if denominator:
        wanted = numerator / denominator
        for fact in evidence.near(wanted - 1e-9, wanted + 1e-9):
            if not fact.percent:
                return Claim(
                    text=match[0],
                    kind="number",
                    grounded=True,
                    run_id=fact.run_id,
                    source=fact.where,
                )
    for text in (match[0], f"{match[1]} of {match[2]}"):
        claim = literal_claim(text, evidence)
        if claim.grounded:
            return claim.model_copy(update={"text": match[0]})
    return Claim(
        text=match[0],
        kind="number",
        grounded=False,
        detail="no output shows this fraction or its value",
    )


def unit_claim(num: Num, evidence: Evidence, context: Context) -> Claim:
    assert num.unit is not None
    family = num.unit if num.unit in UNIT_FAMILIES else family_of(num.unit)
    if family not in UNIT_FAMILIES:
        return Claim(text=num.text, kind="unit", grounded=True, source="not a known unit")
    # The unit must be the matched value's own (on its line, after it or in its label): a
    # unit elsewhere in the output ("timeout: 2 hours") says nothing of "3 hours".
    for fact in window(num, evidence):
        if fact.unit is not None and fits(num, fact):
            return Claim(
                text=num.text, kind="unit", grounded=True, run_id=fact.run_id, source=fact.where
            )
    for where, text in (
        ("the question", context.question),
        *(("an input file's header", h) for h in context.file_heads),
    ):
        if mentions_unit(family, text):
            return Claim(text=num.text, kind="unit", grounded=True, source=where)
    for fact in evidence.texts:  # "currency: EUR": the outputs' values are in it
        stated = _UNIT_LINE.match(str(fact.value))
        if stated is not None and mentions_unit(family, stated[1]):
            return Claim(
                text=num.text, kind="unit", grounded=True, run_id=fact.run_id, source=fact.where
            )
    return Claim(
        text=num.text,
        kind="unit",
        grounded=False,
        detail=f"the unit {num.unit!r} appears in no output with this value (after it "
        "or in its label), nor in an input header or the question: do not add "
        "units the outputs do not state",
    )


def out_of_claim(match: re.Match[str], evidence: Evidence) -> Claim:
    """ "3 out of 4" claims both counts and their ratio: an output's own "3/4" or "3 of 4",
    or the two shown on one line, or the part shown and the whole under a total's label
    ("passed: 3", "total: 4"). A stray 4 is no whole, nor is a shown ratio 0.75 the counts."""
    part, whole = float(match[1]), float(match[2])
    for text in (match[0], f"{match[1]}/{match[2]}", f"{match[1]} of {match[2]}"):
        claim = literal_claim(text, evidence)
        if claim.grounded:
            return claim.model_copy(update={"text": match[0]})
    parts = [f for f in evidence.near(part, part) if not f.percent]
    wholes = [f for f in evidence.near(whole, whole) if not f.percent]
    together = {f.where for f in parts} & {f.where for f in wholes}
    totals = [f for f in wholes if _WHOLE_LABEL.search(_before_value(f))]
    if parts and (together or totals):
        fact = totals[0] if totals and not together else parts[0]
        return Claim(
            text=match[0], kind="number", grounded=True, run_id=fact.run_id, source=fact.where
        )
    return Claim(
        text=match[0],
        kind="number",
        grounded=False,
        detail="no output shows this count together with this whole (on one line, or the "
        "whole as a total)",
    )


def _before_value(fact: Fact) -> str:
    """A fact's line up to its first digit: the label it is printed under."""
    label = label_of(fact.where)
    return re.split(r"\d", label, maxsplit=1)[0]


# What a value is, as the answer names it and an output labels it: a total is no mean.
_STATISTIC = re.compile(
    r"(?<![a-z0-9.])(total|sum|mean|average|avg|median|std|deviation|minimum|maximum|min|max|"
    r"count|50%)(?![a-z])"
)
_KIND = {
    "sum": "total",
    "average": "mean",
    "avg": "mean",
    "50%": "median",
    "deviation": "std",
    "minimum": "min",
    "maximum": "max",
    "count": "total",  # "the total number of rows" of describe()'s count
}


def statistics_named(text: str) -> set[str]:
    """The statistics `text` names ("the total", "average", describe()'s "50%")."""
    return {_KIND.get(w, w) for w in _STATISTIC.findall(text.lower())}


def statistic_claim(num: Num, claim: Claim, said: set[str], evidence: Evidence) -> Claim:
    """A grounded number the answer calls a statistic (`said`: "the total is 101.23") must
    not be shown only as another one (describe()'s mean): an output line naming one
    statistic labels its values; a line naming several, or none, says nothing."""
    if not said or not claim.grounded or num.literal or claim.source == "the question":
        return claim
    shown: set[str] = set()
    for fact in (f for f in window(num, evidence) if fits(num, f)):
        kinds = statistics_named(label_of(fact.where))
        if len(kinds) != 1 or kinds & said:
            return claim
        shown |= kinds
    if not shown:
        return claim
    return Claim(
        text=num.text,
        kind="number",
        grounded=False,
        detail=f"the outputs show this value as the {' or '.join(sorted(shown))}, not the "
        f"{' or '.join(sorted(said))} the answer calls it",
    )
