"""Grounding: the answer may state only what the outputs it relies on show.

Every number, date, quoted value and unit in the answer must come from the evidence (the
printed output line by line, the JSON result, the artifacts' names and sizes), allowing for the
rounding the answer states ("3.14" for 3.14159, "about 2.5 million" for 2,497,312) and for unit
formatting (thousands separators, percentages, scientific notation, "k"/"million"). Numbers are
read whole by `quantities` (magnitude, unit, sign, bound, approximation, words). A change the
answer states between two grounded numbers of the same sentence ("from 10 to 12, up 20%") is
derived from the output values they matched. A number the answer ties to a label an output
shows must be that label's (`labels`); a month, weekday, quarter, year, version or rank it
names must be one an output shows (`named`). When unsure, the check refuses. Claims of
verification must match checks that ran and passed. Values the question itself gives (its numbers, years, quoted names) need no evidence, nor do list markers,
ordinals that are no rank ("the 3rd row"), "line 3" and rounding statements ("to 2 decimal places"). The program is not evidence:
it grounds code the answer quotes, never a value. Deterministic: no model, no sandbox.
"""

from __future__ import annotations

import ast
import bisect
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

from .evidence import Evidence as Evidence  # re-exported: the loop builds it through ground
from .evidence import Fact, label_of
from .labels import tied_labels, wanted_words
from .models import Claim, Verdict
from .named import named_claims
from .quantities import (
    BOUND_RANGE,
    Num,
    claimed_numbers,
    claimed_words,
    matches,
    normalize,
    numbers_in,
    within,
    word_numbers,
)
from .values import (
    CURRENCY,
    UNIT_AFTER,
    UNIT_FAMILIES,
    DateKey,
    date_matches,
    dates_in,
    durations_in,
    family_of,
    mask_dates,
    mentions_unit,
    scale_of,
    unit_factors,
)

# -- claims about numbers ----------------------------------------------------------------------

_FRACTION = re.compile(r"(?<![\w./])(\d+)/(\d+)(?![\w/])")
# An operation on stated values ("6 + 1"): the answer claims its value unless it states it.
_OPERATOR = (
    r"(\s*(?:\*\*|\^|[+*\u00d7\u00b7\u22c5])\s*|\s+x\s+|\s[-\u2212/]\s|\s+(?:times|plus|minus|"
    r"multiplied\s+by|divided\s+by|to\s+the\s+power\s+of)\s+)"
)
_OPERATION = re.compile(
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
_POWER_WORD = re.compile(r"(?<=\d)\s+(squared|cubed)\b", re.I)
# "1." at a line's start is a list marker only as part of a count from 1: "999." is a value.
_LIST_MARKER = re.compile(r"^\s*(\d+)[.)]\s", re.M)
_SENTENCE_END = re.compile(r"[.!?;](?=\s|$)|\n")
_STOP = {
    "the",
    "and",
    "than",
    "were",
    "was",
    "are",
    "with",
    "that",
    "this",
    "from",
    "have",
    "had",
    "has",
    "for",
    "all",
    "out",
    "its",
    "their",
    "them",
    "those",
    "these",
    "which",
    "there",
    "more",
    "less",
    "fewer",
    "over",
    "under",
    "least",
    "most",
    "no",
    "not",
    "at",
    "of",
    "a",
    "an",
    "is",
    "be",
    "in",
    "to",
    "up",
    "by",
    "it",
    "about",
    "above",
    "below",
    "exceeds",
    "exceeding",
    "upwards",
    "nearly",
    "almost",
}
# A time of day: "9 pm", "1:30 p.m." (the number alone is not the claim).
_CLOCK = re.compile(
    r"(?<![\w.:])(?P<h>\d{1,2})(?::(?P<m>[0-5]\d))?\s?(?P<ap>[ap])\.?m\.?(?![A-Za-z])", re.I
)
_FROM_TO = re.compile(r"\s*(?:to|->|\u2192)\s*")  # "10 to 12": a change the answer states


# -- quotes and verification claims -------------------------------------------------------------

# A fenced block: its lines that are the program's or an output's are shown, not claimed.
_FENCE = re.compile(r"```(?:[\w+-]*\n)?(?P<body>.*?)```", re.S)
_QUOTES = re.compile(
    r"`(?P<code>[^`\n]{1,200})`|\"(?P<dq>[^\"\n]{1,200})\"|"
    r"\u201c(?P<cq>[^\u201d\n]{1,200})\u201d|"
    r"(?<![\w])['\u2018](?P<sq>[^'\u2019\n]{1,120})['\u2019](?![\w])",
    re.S,
)

_VERIFICATION = [
    (
        "tests",
        re.compile(
            r"\bunit[- ]?tests?\b|\btests? (?:pass|passed|passing)\b|\btested\b|"
            r"\bproperty[- ]based\b",
            re.I,
        ),
    ),
    (
        "cross_check",
        re.compile(
            r"\bcross[- ]?check\w*|\bindependent(?:ly)?\s+(?:re)?"
            r"(?:comput|calculat|check|verif)\w*|\bdouble[- ]check\w*|"
            r"\bbrute[- ]force\b",
            re.I,
        ),
    ),
    ("invariant", re.compile(r"\binvariants?\b|\bsanity[- ]check\w*", re.I)),
    ("schema", re.compile(r"\bschema\b", re.I)),
    (
        "any",
        re.compile(
            r"\bverified\b|\bvalidated\b|\bverification\b|\bconfirm(?:ed|s|ing)?\b|"
            r"\bchecked\b|\bassertions?\b|\bprove[nd]\b|\bcertifi\w*|"
            r"\bguaranteed\b|\baudited\b",
            re.I,
        ),
    ),
]
_REAL_CHECKS = ("invariant", "cross_check", "tests", "schema")
# Run and ask ids cited in the answer (hex with a letter: a long number is not an id).
_IDS = re.compile(r"\b(?:ask_)?(?=[0-9]*[a-f])[0-9a-f]{16,64}\b")


@dataclass(frozen=True)
class Context:
    """What the answer may restate without evidence: the question, the program, the inputs."""

    question: str
    code: str = ""
    file_names: tuple[str, ...] = ()
    file_heads: tuple[str, ...] = ()  # first lines (headers) of text inputs, for units


# -- the check ---------------------------------------------------------------------------------


# Complex on purpose: every kind of claim is checked in one place, in the order they win.
def check(  # noqa: C901
    answer: str,
    evidence: Evidence,
    context: Context,
    verdicts: Iterable[Verdict],
) -> list[Claim]:
    """Every checkable claim of `answer`, each grounded (with its source) or not (with why)."""
    answer = normalize(answer)
    context = replace(context, question=normalize(context.question), code=normalize(context.code))
    claims: list[Claim] = []
    masked = answer

    def mask(start: int, end: int) -> None:
        nonlocal masked
        masked = masked[:start] + " " * (end - start) + masked[end:]

    for match in _IDS.finditer(answer):
        mask(match.start(), match.end())
    program = {_norm(line) for line in context.code.splitlines()}
    outputs = {_norm(line) for fact in evidence.texts for line in str(fact.value).splitlines()}
    for match in list(_FENCE.finditer(masked)):
        mask(match.start(), match.start("body"))
        mask(match.end("body"), match.end())
        pos = match.start("body")
        for line in match["body"].splitlines(keepends=True):
            if (
                _norm(line) in outputs
                or _norm(line) in program
                and _is_code(line)
                or not _norm(line)
            ):
                mask(pos, pos + len(line))
            pos += len(line)
    for match in list(_QUOTES.finditer(masked)):
        quoted = match["code"] or match["dq"] or match["cq"] or match["sq"]
        claim = _quote_claim(quoted, evidence, context, code_span=match["code"] is not None)
        claims.append(claim)
        if claim.source == "the program" and re.search(r"\d", quoted):
            # Quoting the program is no evidence for its numbers: "`total = 999`" claims 999.
            mask(match.start(), match.start() + 1)
            mask(match.end() - 1, match.end())
        else:
            mask(match.start(), match.end())
    for keys, match in dates_in(masked):
        claims.append(_date_claim(match[0], keys, evidence, context))
        mask(match.start(), match.end())
    for match in list(_CLOCK.finditer(masked)):
        claims.append(_clock_claim(match, evidence))
        mask(match.start(), match.end())
    for named, claim in named_claims(masked, evidence, context.question):
        claims.append(claim)
        mask(named.start, named.end)
    durations = []
    for seconds, step, match in list(durations_in(masked)):
        durations.append(
            Num(match[0], match.start(), match.end(), seconds, step, unit="s", stated_step=step)
        )
        mask(match.start(), match.end())
    for start, end in _list_markers(masked):
        mask(start, end)
    for match in list(_FRACTION.finditer(masked)):
        claims.extend(_fraction_claims(match, masked, evidence, context))
        mask(match.start(), match.end())
    question_numbers = [f.value for f in numbers_in(mask_dates(context.question))]
    question_numbers += [v for v, _, _ in word_numbers(context.question)]
    # "6 squared" is the operation 6^2.
    masked = _POWER_WORD.sub(
        lambda m: ("^2" if m[1].lower() == "squared" else "^3").ljust(len(m[0])), masked
    )
    for match in list(_OPERATION.finditer(masked)):
        claims.append(_operation_claim(match, evidence, question_numbers))
        mask(match.start(), match.end())
    nums = list(claimed_numbers(masked))
    for num in nums:
        mask(num.start, num.end)
    nums = sorted([*nums, *durations, *claimed_words(masked)], key=lambda n: n.start)
    stated: list[tuple[Num, Claim]] = []
    for num in nums:
        # The words that say what a bound counts: its clause's last words before, first after.
        before = re.split(r"[.!?;,(\n]", masked[max(0, num.start - 80) : num.start])[-1]
        after = re.split(r"[.!?;,)\n]", masked[num.end : num.end + 80])[0]
        words = [
            w
            for w in re.findall(r"[A-Za-z]+", before)[-3:] + re.findall(r"[A-Za-z]+", after)[:4]
            if w.lower() not in _STOP
        ]
        if (
            num.literal
            and masked[num.start - 1 : num.start] + masked[num.end : num.end + 1] == "[]"
        ):
            stated.append((num, _literal_claim(num.text, evidence, listed=True)))  # "[1,5]"
            continue
        stated.append((num, _number_claim(num, evidence, question_numbers, words)))
    stated = _labelled(stated, masked, evidence)
    ends = [m.start() for m in _SENTENCE_END.finditer(masked)]
    sentences: dict[int, list[tuple[Num, Claim]]] = {}
    for num, claim in stated:
        sentences.setdefault(bisect.bisect(ends, num.start), []).append((num, claim))
    changes: dict[tuple[int, bool], list[tuple[Num, Num]]] = {}
    for num, claim in stated:
        if not claim.grounded and not num.literal:
            key = (bisect.bisect(ends, num.start), num.points)
            if key not in changes:
                changes[key] = _changes(sentences[key[0]], masked, num.points)
            claim = _derived_claim(num, changes[key], evidence) or claim
        claims.append(claim)
        if num.unit is not None and claim.grounded:
            claims.append(_unit_claim(num, evidence, context))
    claims.extend(_verification_claims(masked, list(verdicts)))
    result = _result_claim(answer, nums, evidence.result)
    if result is not None:
        claims.append(result)
    return claims


def _labelled(
    stated: list[tuple[Num, Claim]], text: str, evidence: Evidence
) -> list[tuple[Num, Claim]]:
    """A grounded number the answer ties to a label the outputs show ("South sold 143",
    "the median is 4.2") must be that label's: on its line, under its key, in its column."""
    out = []
    wanted = wanted_words(text)
    for i, (num, claim) in enumerate(stated):
        if (
            claim.grounded
            and claim.source != "the question"
            and not num.literal
            and not num.points
            and num.bound in ("exact", "approx", "nearly")
        ):
            index = evidence.label_index(wanted)
            previous = stated[i - 1][0].end if i else -1
            following = stated[i + 1][0].start if i + 1 < len(stated) else len(text)
            for label in tied_labels(text, num.start, num.end, previous, following, index):
                cells = index.get(label)
                if cells is not None and not any(_fits(num, _cell_fact(c)) for c in cells.values):
                    shown = ", ".join(f"{c[0]:g}" for c in cells.values[:5])
                    claim = Claim(
                        text=num.text,
                        kind="number",
                        grounded=False,
                        detail=f"the outputs show {label!r} as {shown}, not this value "
                        f"(it is shown at {claim.source})",
                    )
                    break
        out.append((num, claim))
    return out


def _cell_fact(cell: tuple[float, float, bool, str | None, str]) -> Fact:
    value, step, percent, spelled, where = cell
    unit, factors = scale_of(spelled) if spelled else (None, (1.0,))
    return Fact(value, None, where, step, unit, factors, percent)


def _is_code(line: str) -> bool:
    """A program line is shown as code only if it is a statement, not a value ("999 rows" in
    a docstring, a bare "999", is a claim)."""
    try:
        tree = ast.parse(line.strip())
    except SyntaxError:
        return False
    return bool(tree.body) and not all(
        isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) for s in tree.body
    )


def _list_markers(text: str) -> list[tuple[int, int]]:
    """The spans of line-start markers in lists counting 1, 2, ... (or all "1.", as Markdown
    allows) at least two items long: "999." or a lone "1." before a claim is a value."""
    runs: list[list[tuple[int, int, int]]] = []
    for match in _LIST_MARKER.finditer(text):
        n = int(match[1])
        if runs and (n == runs[-1][-1][0] + 1 or n == runs[-1][-1][0] == 1):
            runs[-1].append((n, match.start(), match.end()))
        elif n == 1:
            runs.append([(n, match.start(), match.end())])
    return [(start, end) for run in runs if len(run) >= 2 for _, start, end in run]


def problems(claims: Iterable[Claim]) -> list[str]:
    """The ungrounded claims, each as one line for the answer stage."""
    return [f"{c.kind} {c.text!r}: {c.detail}" for c in claims if not c.grounded]


def _operation_claim(
    match: re.Match[str], evidence: Evidence, question_numbers: list[float]
) -> Claim:
    """'6 + 1' unanswered by '= 7' claims 7: its value must be grounded like a number."""
    value = _evaluate(float(match[1]), _OPERAND.findall(match[0], len(match[1])))
    num = Num(match[0], match.start(), match.end(), value if value is not None else math.nan, 0.0)
    claim = _number_claim(num, evidence, question_numbers)
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


def _number_claim(
    num: Num, evidence: Evidence, question_numbers: list[float], words: list[str] | None = None
) -> Claim:
    if num.literal:
        return _literal_claim(num.text, evidence)
    if any(math.isclose(value, q) for value, _ in num.candidates() for q in question_numbers):
        return Claim(text=num.text, kind="number", grounded=True, source="the question")
    if num.points:  # a difference of percentages: only a change the answer states holds
        return Claim(
            text=num.text,
            kind="number",
            grounded=False,
            detail="points are a change between two stated percentages",
        )
    facts = [f for f in _window(num, evidence) if _fits(num, f)]
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
    hint = f" (the nearest is {nearest.where})" if nearest is not None else ""
    return Claim(
        text=num.text, kind="number", grounded=False, detail=f"no output shows this value{hint}"
    )


def _window(num: Num, evidence: Evidence) -> list[Fact]:
    """The facts near enough in value to be worth comparing (generously: units, signs,
    percentages, bounds); `_fits` decides. Each unit scaling is its own small window: one
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


def _fits(num: Num, fact: Fact) -> bool:
    """Whether `fact` bears out `num`: in the same dimension, scaled to the fact's unit."""
    if fact.percent and not num.percent:
        return False  # "50 rows" is not "missing: 50%"
    if num.unit is None:
        return matches(num, fact.value, fact.step, fact.where, fact.percent)
    if fact.unit is None:
        # A unit the fact's line does not give is checked against the question (`_unit_claim`).
        return matches(
            replace(num, factors=(1.0,)), fact.value, fact.step, fact.where, fact.percent
        )
    family, factors = scale_of(num.unit)
    if family != fact.unit:
        return False
    return any(
        matches(
            replace(num, value=num.value * ratio, step=num.step * ratio, factors=(1.0,)),
            fact.value,
            fact.step,
            fact.where,
            fact.percent,
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


def _clock_claim(match: re.Match[str], evidence: Evidence) -> Claim:
    """ "1:30 pm" is 13:30: an output must show that time, on the 24-hour clock or with its
    am/pm; a bare 1 or 13 is not a time."""
    hour, minute, ap = int(match["h"]) % 12, int(match["m"] or 0), match["ap"].lower()
    h24, h12 = hour + 12 * (ap == "p"), hour or 12
    shown = re.compile(
        rf"(?<![\d:.])0?{h24}:{minute:02d}(?::\d\d)?(?![\d:])"
        rf"|(?<![\d:.])0?{h12}(?::{minute:02d}(?::00)?)?\s?{ap}\.?m\b",
        re.I,
    )
    # Only outputs that may hold it are searched: a claim costs a lookup, not a scan.
    hints = [f"{h24}:{minute:02d}", f"{h12}:{minute:02d}"] if minute else [f"{h24}:00"]
    hints += [f"{h12}{ap}", f"{h12} {ap}"] if not minute else []
    if int(match["h"]) <= 12 and any(evidence.may_contain(h) for h in hints):
        for fact in evidence.texts:
            if shown.search(str(fact.value)):
                return Claim(
                    text=match[0],
                    kind="date",
                    grounded=True,
                    run_id=fact.run_id,
                    source=fact.where,
                )
    return Claim(
        text=match[0], kind="date", grounded=False, detail="no output shows this time of day"
    )


def _literal_claim(text: str, evidence: Evidence, *, listed: bool = False) -> Claim:
    """A number the check cannot read whole: an output must show it word for word; as a
    list's items only if the answer too shows it as a list (`listed`)."""
    for fact in evidence.texts if evidence.may_contain(_norm(text)) else []:
        if _contains(str(fact.value), _norm(text), in_list="," in text and not listed):
            return Claim(
                text=text, kind="number", grounded=True, run_id=fact.run_id, source=fact.where
            )
    return Claim(
        text=text,
        kind="number",
        grounded=False,
        detail="this cannot be read as one number and no output shows it as written",
    )


def _derived_claim(
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
        for a in [f for f in _window(first, evidence) if _fits(first, f)][:20]:
            for b in [f for f in _window(second, evidence) if _fits(second, f)][:20]:
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


def _changes(stated: list[tuple[Num, Claim]], text: str, points: bool) -> list[tuple[Num, Num]]:
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


def _fraction_claims(
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
    claim = _number_claim(num, evidence, [])
    if not claim.grounded and spelled:  # an output's own "3/4 hours"
        literal = _literal_claim(text[match.start() : spelled.end()].strip(), evidence)
        return [literal.model_copy(update={"text": match[0]}) if literal.grounded else claim]
    return [claim, _unit_claim(num, evidence, context)] if claim.grounded else [claim]


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
        claim = _literal_claim(text, evidence)
        if claim.grounded:
            return claim.model_copy(update={"text": match[0]})
    return Claim(
        text=match[0],
        kind="number",
        grounded=False,
        detail="no output shows this fraction or its value",
    )


def _unit_claim(num: Num, evidence: Evidence, context: Context) -> Claim:
    assert num.unit is not None
    family = num.unit if num.unit in UNIT_FAMILIES else family_of(num.unit)
    if family not in UNIT_FAMILIES:
        return Claim(text=num.text, kind="unit", grounded=True, source="not a known unit")
    # The unit must be the matched value's own (on its line, after it or in its label): a
    # unit elsewhere in the output ("timeout: 2 hours") says nothing of "3 hours".
    for fact in _window(num, evidence):
        if fact.unit is not None and _fits(num, fact):
            return Claim(
                text=num.text, kind="unit", grounded=True, run_id=fact.run_id, source=fact.where
            )
    for where, text in (
        ("the question", context.question),
        *(("an input file's header", h) for h in context.file_heads),
    ):
        if mentions_unit(family, text):
            return Claim(text=num.text, kind="unit", grounded=True, source=where)
    return Claim(
        text=num.text,
        kind="unit",
        grounded=False,
        detail=f"the unit {num.unit!r} appears in no output with this value (after it "
        "or in its label), nor in an input header or the question: do not add "
        "units the outputs do not state",
    )


def _norm(text: str) -> str:
    return " ".join(text.casefold().split()).strip(" .,;:!?")


def _contains(text: str, wanted: str, *, in_list: bool = False) -> bool:
    """`wanted` in `text` as whole words ("7" is not in "17"); with `in_list`, not as items of
    a list either ("1,23" is not in "[1,23]": a list's commas part its values)."""
    edges = (r"(?<![\w\[,])", r"(?![\w\],])") if in_list else (r"(?<!\w)", r"(?!\w)")
    return re.search(edges[0] + re.escape(wanted) + edges[1], _norm(text)) is not None


def _quote_claim(quoted: str, evidence: Evidence, context: Context, *, code_span: bool) -> Claim:
    wanted = _norm(quoted)
    if not wanted:
        return Claim(text=quoted, kind="quote", grounded=True, source="empty")
    for fact in evidence.texts if evidence.may_contain(wanted) else []:
        if _contains(fact.value, wanted):
            return Claim(
                text=quoted, kind="quote", grounded=True, run_id=fact.run_id, source=fact.where
            )
    # The program grounds code the answer quotes ("`df.units`"), never a value ("`100`").
    program = [("the program", context.code)] if re.search(r"[A-Za-z_]", quoted) else []
    others = [
        ("the question", context.question),
        *program,
        *(("an input file's name", n) for n in context.file_names),
        *(("an input file's header", h) for h in context.file_heads),
    ]
    for where, text in others:
        if _contains(text, wanted):
            return Claim(text=quoted, kind="quote", grounded=True, source=where)
    what = "code" if code_span else "quoted text"
    return Claim(
        text=quoted,
        kind="quote",
        grounded=False,
        detail=f"this {what} appears in no output, nor in the question or the program",
    )


def _date_claim(text: str, keys: list[DateKey], evidence: Evidence, context: Context) -> Claim:
    for q_keys, _ in dates_in(context.question):
        if _bears_out(keys, q_keys):
            return Claim(text=text, kind="date", grounded=True, source="the question")
    for fact in evidence.dates:
        if _bears_out(keys, fact.value):
            return Claim(
                text=text, kind="date", grounded=True, run_id=fact.run_id, source=fact.where
            )
    return Claim(text=text, kind="date", grounded=False, detail="no output shows this date")


def _bears_out(claimed: list[DateKey], shown: Sequence[DateKey]) -> bool:
    """Whether every reading of a shown date is one the claim states: "5 March 2023" is not
    certain of an output's "03/05/2023", which may be 3 May; "03/05/2023" itself is. A claim
    with two readings holds only for the same writing (not "04/03/2023" for "2023-03-04")."""
    if len(set(claimed)) > 1:
        return tuple(claimed) == tuple(shown)
    return all(any(date_matches(c, s) for c in claimed) for s in shown)


def _result_claim(answer: str, nums: list[Num], result: Any) -> Claim | None:
    """A single value as the result (a number, a short text, a date) must be stated: an
    answer that gives none of it ("see the output above") does not answer."""
    if isinstance(result, bool) or not isinstance(result, (int, float, str)):
        return None
    text = result if isinstance(result, str) else json.dumps(result)
    if isinstance(result, str) and not 0 < len(result.strip()) <= 60:
        return None
    values = (
        [float(result)]
        if not isinstance(result, str)
        else [f.value for f in numbers_in(mask_dates(normalize(result)))]
    )
    result_dates = [
        k for keys, _ in dates_in(result if isinstance(result, str) else "") for k in keys
    ]
    stated = (
        _contains(answer, _norm(text))
        or any(matches(n, v) for n in nums for v in values)
        or any(
            date_matches(a, r) for keys, _ in dates_in(answer) for a in keys for r in result_dates
        )
    )
    if stated:
        return Claim(text=text, kind="result", grounded=True, source="the answer states it")
    return Claim(
        text=text,
        kind="result",
        grounded=False,
        detail=f"the answer does not state the result ({text[:80]})",
    )


def _verification_claims(text: str, verdicts: list[Verdict]) -> list[Claim]:
    passed = {v.check: v for v in verdicts if v.passed}
    failed = {v.check for v in verdicts if not v.passed}
    claims = []
    for check, pattern in _VERIFICATION:
        match = pattern.search(text)
        if match is None:
            continue
        wanted = _REAL_CHECKS if check == "any" else (check,)
        found = next((passed[c] for c in wanted if c in passed and c not in failed), None)
        if found is not None:
            claims.append(
                Claim(
                    text=match[0],
                    kind="verification",
                    grounded=True,
                    run_id=found.run_id,
                    source=f"the {found.check} check passed: {found.detail[:120]}",
                )
            )
        else:
            ran = ", ".join(sorted(passed)) or "none"
            claims.append(
                Claim(
                    text=match[0],
                    kind="verification",
                    grounded=False,
                    detail=f"no {' or '.join(wanted)} check passed (checks passed: {ran}); claim "
                    "only the checks listed",
                )
            )
    return claims
