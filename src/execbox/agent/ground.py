"""Grounding: the answer may state only what the outputs it relies on show.

Every number, date, quoted value and unit in the answer must come from the evidence (the
printed output line by line, the JSON result, the artifacts' names and sizes), allowing for the
rounding the answer states ("3.14" for 3.14159, "about 2.5 million" for 2,497,312) and for unit
formatting (thousands separators, percentages, scientific notation, "k"/"million"). Claims of
verification must match checks that ran and passed. Values the question itself gives (its
numbers, years, quoted names) need no evidence, nor do list markers, ordinals, "line 3" and
rounding statements ("2 decimal places"). Deterministic: no model, no sandbox.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..contract import Artifact
from .models import Claim, RunOutput, Verdict
from .values import (
    BYTE_FACTORS,
    CURRENCY,
    NUMBER,
    UNIT_AFTER,
    UNIT_FAMILIES,
    DateKey,
    date_matches,
    dates_in,
    family_of,
    mask_dates,
    mentions_unit,
    numbers_in,
    parse_number,
    word_numbers,
)

# -- claims about numbers ----------------------------------------------------------------------

_APPROX = re.compile(r"(?:about|approximately|approx\.?|roughly|around|nearly|almost|close to|"
                     r"some|~|\u2248|circa|ca\.)\s*$", re.I)
_ABOVE = re.compile(r"(?:over|more than|above|at least|exceeds?|exceeding|upwards of|>=?|"
                    r"\u2265)\s*$", re.I)
_BELOW = re.compile(r"(?:under|less than|below|fewer than|at most|up to|<=?|\u2264)\s*$", re.I)
# Bounds that include the number itself: "at least 6" holds for 6, "more than 6" does not.
_INCLUSIVE = re.compile(r"(?:at least|at most|up to|upwards of|>=|<=|\u2265|\u2264)\s*$", re.I)
# "about 10" may be off by the stated rounding but no more than this share of it.
_APPROX_SHARE = 0.05
_FRACTION = re.compile(r"(?<![\w./])(\d+)/(\d+)(?![\w/])")
_DOWN = re.compile(r"\b(?:decreas\w*|declin\w*|drop\w*|fell|fall\w*|down|lower|loss|lost|"
                   r"negative|minus|below|deficit|shr[aiu]nk\w*|reduc\w*)\b", re.I)
_NEGATED_DOWN = re.compile(r"\b(?:not|no|never|without|n't)\s+(?:\w+\s+){0,2}?(?:a\s+|an\s+)?"
                           + _DOWN.pattern[:-2].removeprefix(r"\b"), re.I)
# An operation on stated values ("6 + 1"): the answer claims its value unless it states it.
_OPERATION = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)((?:\s*[+*\u00d7]\s*|\s[-\u2212/]\s)"
                        r"\d+(?:\.\d+)?)+(?![\w^]|\.\d)"
                        r"(?!\s*(?:=|[-+*/\u00d7\u2212]\s*\d))")
_OPERAND = re.compile(r"\s*([+*\u00d7\-\u2212/])\s*(\d+(?:\.\d+)?)")
# A number after these words is a position, not a value: "line 3", "step 2", "#1".
_POSITION = re.compile(r"(?:\bline|\blines|\bstep|\bcell|\battempt|\bitem|\bpage|\brank|"
                       r"\bversion|\bpython|\bno\.|#)\s*$", re.I)
_ROUNDING = re.compile(r"\s*(?:decimal|significant|sig\.?\s*fig|digits?\b|dp\b)", re.I)
_LIST_MARKER = re.compile(r"^\s*\d+[.)]\s", re.M)


@dataclass(frozen=True)
class Num:
    """A number as written: its value, the step of its last stated digit, its bound."""

    text: str
    value: float
    step: float
    percent: bool
    signed: bool
    bound: str  # "exact", "approx", "above", "below"
    unit: str | None
    factors: tuple[float, ...] = (1.0,)  # "12 KB" is 12 times 1000 or 1024 bytes
    strict: bool = False  # "more than": the number itself is outside the bound
    truncatable: bool = False  # decimals without a magnitude: "3.1415" for 3.14159

    def candidates(self) -> Iterator[tuple[float, float]]:
        """The values it may mean, each with the step of its last stated digit."""
        for factor in self.factors:
            if self.percent:
                yield self.value * factor / 100, self.step * factor / 100
            else:
                yield self.value * factor, self.step * factor


# -- quotes and verification claims -------------------------------------------------------------

_QUOTES = re.compile(r"```.*?```|`(?P<code>[^`\n]{1,200})`|\"(?P<dq>[^\"\n]{1,200})\"|"
                     r"\u201c(?P<cq>[^\u201d\n]{1,200})\u201d|"
                     r"(?<![\w])['\u2018](?P<sq>[^'\u2019\n]{1,120})['\u2019](?![\w])", re.S)

_VERIFICATION = [
    ("tests", re.compile(r"\bunit[- ]?tests?\b|\btests? (?:pass|passed|passing)\b|\btested\b|"
                         r"\bproperty[- ]based\b", re.I)),
    ("cross_check", re.compile(r"\bcross[- ]?check\w*|\bindependent(?:ly)?\s+(?:re)?"
                               r"(?:comput|calculat|check|verif)\w*|\bdouble[- ]check\w*|"
                               r"\bbrute[- ]force\b", re.I)),
    ("invariant", re.compile(r"\binvariants?\b|\bsanity[- ]check\w*", re.I)),
    ("schema", re.compile(r"\bschema\b", re.I)),
    ("any", re.compile(r"\bverified\b|\bvalidated\b|\bverification\b|\bconfirm(?:ed|s)\b|"
                       r"\bchecked\b|\bassertions?\b|\bprove[nd]\b|\bcertifi\w*|"
                       r"\bguaranteed\b|\baudited\b", re.I)),
]
_REAL_CHECKS = ("invariant", "cross_check", "tests", "schema")
TABLE_SUMMARY_BYTES = 1 << 20  # larger text artifacts are summarized by name and size only
# Run and ask ids cited in the answer (hex with a letter: a long number is not an id).
_IDS = re.compile(r"\b(?:ask_)?(?=[0-9]*[a-f])[0-9a-f]{16,64}\b")


# -- the evidence ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Fact:
    value: Any  # float, DateKey or str
    run_id: str | None
    where: str


@dataclass
class Evidence:
    """What the answer may draw on: facts found in the outputs, and the texts they came from."""

    numbers: list[Fact]
    dates: list[Fact]
    texts: list[Fact]  # whole lines and strings, searched for quotes and units
    result: Any = None  # the result the answer relies on: a single value must be stated

    @classmethod
    def of(cls, outputs: Iterable[RunOutput], artifacts: Iterable[Artifact],
           artifacts_run: str | None = None) -> Evidence:
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
            ev.numbers.append(Fact(float(art.size), artifacts_run, where))
            ev.add_table_summary(art, artifacts_run)
        if arts:
            ev.numbers.append(Fact(float(len(arts)), artifacts_run, f"{len(arts)} artifacts"))
        return ev

    def add_table_summary(self, art: Artifact, run_id: str | None) -> None:
        """A text file's summary: its first line (a table's columns) and how many lines and
        data rows it has. Its values are not evidence: the answer cites what was printed."""
        if art.data is None or not art.mime_type.startswith("text/") \
                or art.size > TABLE_SUMMARY_BYTES:
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
        self.texts.append(Fact(text, run_id, where))
        masked = text
        for keys, match in dates_in(text):
            for key in keys:
                self.dates.append(Fact(key, run_id, where))
            self.numbers.append(Fact(float(keys[0][0]), run_id, where))
            masked = masked[:match.start()] + " " * (match.end() - match.start()) \
                + masked[match.end():]
        for value, match in numbers_in(masked):
            self.numbers.append(Fact(value, run_id, where))
            if "," in match["num"]:  # "1,234" is also 1 and 234: JSON printed without spaces
                self.numbers.extend(Fact(float(part), run_id, where)
                                    for part in match["num"].split(".")[0].split(","))

    def add_value(self, value: Any, run_id: str | None, path: str) -> None:
        if isinstance(value, bool) or value is None:
            return
        if isinstance(value, (int, float)):
            if math.isfinite(value):
                self.numbers.append(Fact(float(value), run_id, f"{path} = {value!r}"))
            return
        if isinstance(value, str):
            self.add_text(value, run_id, f"{path} = {value[:160]!r}")
            return
        if isinstance(value, dict):
            for key, item in value.items():
                self.add_text(str(key), run_id, f"{path} key {str(key)[:80]!r}")
                self.add_value(item, run_id, f"{path}[{json.dumps(key)}]")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                self.add_value(item, run_id, f"{path}[{i}]")
        else:
            return
        # How many items there are ("3 regions") is shown by the result too.
        self.numbers.append(Fact(float(len(value)), run_id, f"len({path}) = {len(value)}"))


@dataclass(frozen=True)
class Context:
    """What the answer may restate without evidence: the question, the program, the inputs."""

    question: str
    code: str = ""
    file_names: tuple[str, ...] = ()
    file_heads: tuple[str, ...] = ()  # first lines (headers) of text inputs, for units


# -- the check ---------------------------------------------------------------------------------

def check(answer: str, evidence: Evidence, context: Context, verdicts: Iterable[Verdict],
          ) -> list[Claim]:
    """Every checkable claim of `answer`, each grounded (with its source) or not (with why)."""
    claims: list[Claim] = []
    masked = answer

    def mask(start: int, end: int) -> None:
        nonlocal masked
        masked = masked[:start] + " " * (end - start) + masked[end:]

    for match in _IDS.finditer(answer):
        mask(match.start(), match.end())
    for match in _QUOTES.finditer(masked):
        quoted = match["code"] or match["dq"] or match["cq"] or match["sq"]
        mask(match.start(), match.end())
        if quoted is None:  # a fenced code block: code, not a claim about the data
            continue
        claims.append(_quote_claim(quoted, evidence, context, code_span=match["code"] is not None))
    for keys, match in dates_in(masked):
        claims.append(_date_claim(match[0], keys, evidence, context))
        mask(match.start(), match.end())
    for start, end in [(m.start(), m.end()) for m in _LIST_MARKER.finditer(masked)]:
        mask(start, end)
    for match in list(_FRACTION.finditer(masked)):
        claims.append(_fraction_claim(match, evidence))
        mask(match.start(), match.end())
    question_numbers = [v for v, _ in numbers_in(mask_dates(context.question))]
    question_numbers += [v for v, _ in word_numbers(context.question)]
    for match in list(_OPERATION.finditer(masked)):
        claims.append(_operation_claim(match, evidence, question_numbers))
        mask(match.start(), match.end())
    nums = list(_claimed_numbers(masked))
    for num in nums:
        claims.append(_number_claim(num, evidence, question_numbers))
        if num.unit is not None:
            claims.append(_unit_claim(num, evidence, context))
    claims.extend(_verification_claims(masked, list(verdicts)))
    stated = _result_claim(answer, nums, evidence.result)
    if stated is not None:
        claims.append(stated)
    return claims


def problems(claims: Iterable[Claim]) -> list[str]:
    """The ungrounded claims, each as one line for the answer stage."""
    return [f"{c.kind} {c.text!r}: {c.detail}" for c in claims if not c.grounded]


def _operation_claim(match: re.Match[str], evidence: Evidence,
                     question_numbers: list[float]) -> Claim:
    """'6 + 1' unanswered by '= 7' claims 7: its value must be grounded like a number."""
    value = _evaluate(float(match[1]), _OPERAND.findall(match[0][len(match[1]):]))
    num = Num(match[0], value if value is not None else math.nan, 0.0, False, False, "exact",
              None)
    claim = _number_claim(num, evidence, question_numbers)
    if not claim.grounded:
        claim = claim.model_copy(update={"detail": f"{match[0]} is {value:g}, which "
                                         + (claim.detail or "no output shows")})
    return claim


def _evaluate(first: float, operations: list[tuple[str, str]]) -> float | None:
    """The value of `first op n op n ...` with * and / before + and -."""
    terms = [first]
    for op, text in operations:
        n = float(text)
        if op in "*\u00d7":
            terms[-1] *= n
        elif op == "/":
            if n == 0:
                return None
            terms[-1] /= n
        else:
            terms.append(-n if op in "-\u2212" else n)
    return sum(terms)


def _claimed_numbers(text: str) -> Iterator[Num]:
    for match in NUMBER.finditer(text):
        after = text[match.end():]
        if re.match(r"[A-Za-z_]", after[:1]) and not UNIT_AFTER.match(after):
            continue  # glued to a word: an ordinal, an identifier, a version
        before = text[max(0, match.start() - 30):match.start()]
        if _POSITION.search(before) or _ROUNDING.match(after) or re.search(r"[A-Za-z]-$", before):
            continue  # "line 3", "2 decimal places", "COVID-19"
        bound = ("approx" if _APPROX.search(before) else "above" if _ABOVE.search(before)
                 else "below" if _BELOW.search(before) else "exact")
        strict = bound in ("above", "below") and not _INCLUSIVE.search(before)
        value, step, percent = parse_number(match, rounded=bound != "exact")
        unit_match = UNIT_AFTER.match(after) if not percent else None
        unit = CURRENCY[match["cur"]] if match["cur"] else (
            unit_match[1] if unit_match else None)
        end = match.end() + (unit_match.end() if unit_match else 0)
        near = text[max(0, match.start() - 40):match.start()]
        # "fell by 3" states -3; "not a loss: 3" states no direction at all.
        signed = bool(match["sign"]) or (bool(_DOWN.search(near))
                                         and not _NEGATED_DOWN.search(near))
        factors = BYTE_FACTORS.get(unit_match[1].lower(), (1.0,)) if unit_match else (1.0,)
        truncatable = "." in match["num"] and not (match["mag1"] or match["mag2"])
        yield Num(text[match.start():end].strip(), value, step, percent, signed, bound, unit,
                  factors, strict, truncatable)
    for value, match in word_numbers(text):
        before = text[max(0, match.start() - 30):match.start()]
        if _POSITION.search(before):
            continue
        yield Num(match[0], value, 1.0, False, False, "exact", None)


def _close(num: Num, fact: float, where: str = "") -> bool:
    # "fell by 3.5" states -3.5 as a size: the sign is in the words, not the number; a
    # negative fact is met only when the words say so (0 < -6 is no "profit of 6").
    targets = (fact, -fact) if num.signed and num.value >= 0 else (fact,)
    if any(_within(num, value, step, target)
           for value, step in num.candidates() for target in targets):
        return True
    # "50%" for a printed 50 only when the output itself speaks of a percentage.
    return num.percent and re.search(r"%|percent|pct", where, re.I) is not None and any(
        _within(num, num.value * f, num.step * f, target) for f in num.factors
        for target in targets)


def _within(num: Num, value: float, step: float, fact: float) -> bool:
    tiny = 1e-9 * max(1.0, abs(value))
    if num.bound == "above":
        low = value + tiny if num.strict else value - tiny
        return low <= fact <= value + max(step, 0.5 * abs(value)) + tiny
    if num.bound == "below":
        high = value - tiny if num.strict else value + tiny
        return value - max(step, 0.5 * abs(value)) - tiny <= fact <= high
    if abs(fact - value) <= step / 2 + tiny:
        # "about 10" rounds 6 to one digit, but is not a fair word for it.
        return num.bound != "approx" or abs(fact - value) <= _APPROX_SHARE * abs(value) + tiny \
            or abs(fact - value) <= _stated_step(num, step) / 2 + tiny
    # Truncated rather than rounded ("3.1415" for 3.14159): the stated digits are the fact's.
    return num.bound == "exact" and num.truncatable and step > 0 \
        and abs(math.trunc(fact / step) * step - value) <= tiny


def _stated_step(num: Num, step: float) -> float:
    """The step of the last written digit, trailing zeros included ("10" -> 1)."""
    digits = re.sub(r"[^\d.]", "", num.text.split("e")[0].split("E")[0])
    zeros = len(digits) - len(digits.rstrip("0")) if "." not in digits else 0
    return step / 10.0 ** zeros


def _number_claim(num: Num, evidence: Evidence, question_numbers: list[float]) -> Claim:
    if any(math.isclose(value, q) for value, _ in num.candidates() for q in question_numbers):
        return Claim(text=num.text, kind="number", grounded=True, source="the question")
    for fact in evidence.numbers:
        if _close(num, fact.value, fact.where):
            return Claim(text=num.text, kind="number", grounded=True, run_id=fact.run_id,
                         source=fact.where)
    nearest = min(evidence.numbers, key=lambda f: abs(f.value - num.value), default=None)
    hint = f" (the nearest is {nearest.where})" if nearest is not None else ""
    return Claim(text=num.text, kind="number", grounded=False,
                 detail=f"no output shows this value{hint}")


def _fraction_claim(match: re.Match[str], evidence: Evidence) -> Claim:
    """'3/4' is the value 0.75, or 3 of 4 when both numbers are shown."""
    numerator, denominator = float(match[1]), float(match[2])
    wanted = [numerator / denominator] if denominator else []
    for fact in evidence.numbers:
        if any(math.isclose(fact.value, w, rel_tol=1e-9) for w in wanted):
            return Claim(text=match[0], kind="number", grounded=True, run_id=fact.run_id,
                         source=fact.where)
    parts = [next((f for f in evidence.numbers if f.value == n), None)
             for n in (numerator, denominator)]
    if parts[0] is not None and parts[1] is not None:
        return Claim(text=match[0], kind="number", grounded=True, run_id=parts[0].run_id,
                     source=f"{parts[0].where}; {parts[1].where}")
    return Claim(text=match[0], kind="number", grounded=False,
                 detail="no output shows this fraction, its value or both its numbers")


def _unit_claim(num: Num, evidence: Evidence, context: Context) -> Claim:
    assert num.unit is not None
    family = num.unit if num.unit in UNIT_FAMILIES else family_of(num.unit)
    if family not in UNIT_FAMILIES:
        return Claim(text=num.text, kind="unit", grounded=True, source="not a known unit")
    for fact in evidence.texts:
        if mentions_unit(family, fact.value):
            return Claim(text=num.text, kind="unit", grounded=True, run_id=fact.run_id,
                         source=fact.where)
    for where, text in (("the question", context.question),
                        *(("an input file's header", h) for h in context.file_heads)):
        if mentions_unit(family, text):
            return Claim(text=num.text, kind="unit", grounded=True, source=where)
    return Claim(text=num.text, kind="unit", grounded=False,
                 detail=f"the unit {num.unit!r} appears in no output, input header or the "
                        "question: do not add units the outputs do not state")


def _norm(text: str) -> str:
    return " ".join(text.casefold().split()).strip(" .,;:!?")


def _contains(text: str, wanted: str) -> bool:
    """`wanted` in `text` as whole words ("7" is not in "17")."""
    return re.search(r"(?<!\w)" + re.escape(wanted) + r"(?!\w)", _norm(text)) is not None


def _quote_claim(quoted: str, evidence: Evidence, context: Context, *, code_span: bool) -> Claim:
    wanted = _norm(quoted)
    if not wanted:
        return Claim(text=quoted, kind="quote", grounded=True, source="empty")
    for fact in evidence.texts:
        if _contains(fact.value, wanted):
            return Claim(text=quoted, kind="quote", grounded=True, run_id=fact.run_id,
                         source=fact.where)
    others = [("the question", context.question), ("the program", context.code),
              *(("an input file's name", n) for n in context.file_names),
              *(("an input file's header", h) for h in context.file_heads)]
    for where, text in others:
        if _contains(text, wanted):
            return Claim(text=quoted, kind="quote", grounded=True, source=where)
    what = "code" if code_span else "quoted text"
    return Claim(text=quoted, kind="quote", grounded=False,
                 detail=f"this {what} appears in no output, nor in the question or the program")


def _date_claim(text: str, keys: list[DateKey], evidence: Evidence, context: Context) -> Claim:
    for q_keys, _ in dates_in(context.question):
        if any(date_matches(k, q) for k in keys for q in q_keys):
            return Claim(text=text, kind="date", grounded=True, source="the question")
    for fact in evidence.dates:
        if any(date_matches(k, fact.value) for k in keys):
            return Claim(text=text, kind="date", grounded=True, run_id=fact.run_id,
                         source=fact.where)
    return Claim(text=text, kind="date", grounded=False, detail="no output shows this date")


def _result_claim(answer: str, nums: list[Num], result: Any) -> Claim | None:
    """A single value as the result (a number, a short text, a date) must be stated: an
    answer that gives none of it ("see the output above") does not answer."""
    if isinstance(result, bool) or not isinstance(result, (int, float, str)):
        return None
    text = result if isinstance(result, str) else json.dumps(result)
    if isinstance(result, str) and not 0 < len(result.strip()) <= 60:
        return None
    values = ([float(result)] if not isinstance(result, str)
              else [v for v, _ in numbers_in(mask_dates(result))])
    result_dates = [k for keys, _ in dates_in(result if isinstance(result, str) else "")
                    for k in keys]
    stated = (_contains(answer, _norm(text))
              or any(_close(n, v) for n in nums for v in values)
              or any(date_matches(a, r) for keys, _ in dates_in(answer) for a in keys
                     for r in result_dates))
    if stated:
        return Claim(text=text, kind="result", grounded=True, source="the answer states it")
    return Claim(text=text, kind="result", grounded=False,
                 detail=f"the answer does not state the result ({text[:80]})")


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
            claims.append(Claim(text=match[0], kind="verification", grounded=True,
                                run_id=found.run_id,
                                source=f"the {found.check} check passed: {found.detail[:120]}"))
        else:
            ran = ", ".join(sorted(passed)) or "none"
            claims.append(Claim(
                text=match[0], kind="verification", grounded=False,
                detail=f"no {' or '.join(wanted)} check passed (checks passed: {ran}); claim "
                       "only the checks listed"))
    return claims
