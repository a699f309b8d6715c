"""Grounding text: quoted values, dates, times of day, the result and claims of verification,
each borne out by an output (or the question, the program, the inputs) showing it."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from .comparison import matches
from .evidence import Context, Evidence
from .models import Claim, Verdict
from .quantities import Num, normalize, numbers_in
from .values import DateKey, date_matches, dates_in, mask_dates, month_days_in

# A time of day: "9 pm", "1:30 p.m." (the number alone is not the claim).
CLOCK = re.compile(
    r"(?<![\w.:])(?P<h>\d{1,2})(?::(?P<m>[0-5]\d))?\s?(?P<ap>[ap])\.?m\.?(?![A-Za-z])", re.I
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


def clock_claim(match: re.Match[str], evidence: Evidence, wanted: frozenset[str]) -> Claim:
    """ "1:30 pm" is 13:30: an output must show that time, on the 24-hour clock or with its
    am/pm, or "2 pm" the hour 14 under an "hour" key or column; a bare 1 or 13 is not a
    time. `wanted`: the words the outputs' labels are read for."""
    hour, minute, ap = int(match["h"]) % 12, int(match["m"] or 0), match["ap"].lower()
    h24, h12 = hour + 12 * (ap == "p"), hour or 12
    if not minute and int(match["h"]) <= 12:
        index = evidence.label_index(wanted)
        for label in ("hour", "hours", "hr"):
            cells = index.get(label)
            hours = [c for c in cells.values if c[0] == h24] if cells is not None else []
            if hours:
                return Claim(
                    text=match[0],
                    kind="date",
                    grounded=True,
                    source=f"{hours[0][4]} (its {label!r} is {h24})",
                )
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


def norm(text: str) -> str:
    return " ".join(text.casefold().split()).strip(" .,;:!?")


def contains(text: str, wanted: str, *, in_list: bool = False) -> bool:
    """`wanted` in `text` as whole words ("7" is not in "17"); with `in_list`, not as items of
    a list either ("1,23" is not in "[1,23]": a list's commas part its values)."""
    edges = (r"(?<![\w\[,])", r"(?![\w\],])") if in_list else (r"(?<!\w)", r"(?!\w)")
    return re.search(edges[0] + re.escape(wanted) + edges[1], norm(text)) is not None


def quote_claim(quoted: str, evidence: Evidence, context: Context, *, code_span: bool) -> Claim:
    wanted = norm(quoted)
    if not wanted:
        return Claim(text=quoted, kind="quote", grounded=True, source="empty")
    for fact in evidence.texts if evidence.may_contain(wanted) else []:
        if contains(fact.value, wanted):
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
        if contains(text, wanted):
            return Claim(text=quoted, kind="quote", grounded=True, source=where)
    what = "code" if code_span else "quoted text"
    return Claim(
        text=quoted,
        kind="quote",
        grounded=False,
        detail=f"this {what} appears in no output, nor in the question or the program",
    )


def date_claim(text: str, keys: list[DateKey], evidence: Evidence, context: Context) -> Claim:
    for q_keys, _ in dates_in(context.question):
        if _bears_out(keys, q_keys):
            return Claim(text=text, kind="date", grounded=True, source="the question")
    for fact in evidence.dates:
        if _bears_out(keys, fact.value):
            return Claim(
                text=text, kind="date", grounded=True, run_id=fact.run_id, source=fact.where
            )
    return Claim(text=text, kind="date", grounded=False, detail="no output shows this date")


def month_day_claim(
    match: re.Match[str], month: int, day: int, evidence: Evidence, context: Context
) -> Claim:
    """ "March 5th" without a year: a date the question or an output shows must have that
    month and day in every reading ("03/05/2023" may be 3 May)."""

    def same(m: int, d: int | None) -> bool:
        return d == day and month in (0, m)  # "on the 5th" names no month

    def holds(keys: Sequence[DateKey]) -> bool:
        return bool(keys) and all(same(key[1], key[2]) for key in keys)

    if any(holds(keys) for keys, _ in dates_in(context.question)) or any(
        same(m, d) for m, d, _ in month_days_in(context.question)
    ):
        return Claim(text=match[0], kind="date", grounded=True, source="the question")
    for fact in evidence.dates:
        if holds(fact.value):
            return Claim(
                text=match[0], kind="date", grounded=True, run_id=fact.run_id, source=fact.where
            )
    if any(same(m, d) for m, d, _ in month_days_in(evidence.folded())):
        for fact in evidence.texts:
            if any(same(m, d) for m, d, _ in month_days_in(str(fact.value))):
                return Claim(
                    text=match[0],
                    kind="date",
                    grounded=True,
                    run_id=fact.run_id,
                    source=fact.where,
                )
    return Claim(
        text=match[0],
        kind="date",
        grounded=False,
        detail="no output shows a date with this month and day",
    )


def _bears_out(claimed: list[DateKey], shown: Sequence[DateKey]) -> bool:
    """Whether every reading of a shown date is one the claim states: "5 March 2023" is not
    certain of an output's "03/05/2023", which may be 3 May; "03/05/2023" itself is. A claim
    with two readings holds only for the same writing (not "04/03/2023" for "2023-03-04")."""
    if len(set(claimed)) > 1:
        return tuple(claimed) == tuple(shown)
    return all(any(date_matches(c, s) for c in claimed) for s in shown)


def result_claim(answer: str, nums: list[Num], result: Any) -> Claim | None:
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
        contains(answer, norm(text))
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


def verification_claims(text: str, verdicts: list[Verdict]) -> list[Claim]:
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


# "West was the worst region", "the best region is East": a name the answer gives a key.
_NAMED_AS = re.compile(
    r"(?P<x>\b[A-Z][\w.&-]*)\s+(?:was|is)\s+the\s+(?P<k>[a-z]+(?:[ -][a-z]+){0,2})\b"
    r"|\b(?i:the)\s+(?P<k2>[a-z]+(?:[ -][a-z]+){0,2})\s+(?:was|is)\s+(?P<x2>[A-Z][\w.&-]*)"
)
_MAX_NAMES = 20  # names read under one key
_NOT_NAMES = {"it", "this", "that", "the", "a", "an", "there", "which", "what"}
# "best_region: East", "'worst region' = North": a key and the one name it shows.
_KEYED_NAME = re.compile(
    r"\s*['\"]?(?P<key>[A-Za-z][\w -]{0,40}?)['\"]?\s*[:=]\s*['\"]?"
    r"(?P<v>[A-Za-z][\w.&-]*(?: [A-Za-z][\w.&-]*){0,2})['\"]?\s*,?\s*"
)


def keyed_name_claims(text: str, evidence: Evidence) -> list[Claim]:
    """A name the answer gives a key an output shows with another name ("West was the worst
    region" for "worst_region: North") is refused; only lines that hold the key are read."""
    claims = []
    for m in _NAMED_AS.finditer(text):
        name, words = (m["x"], m["k"]) if m["x"] else (m["x2"], m["k2"])
        name = name.rstrip(".&-")  # a sentence's full stop
        if name.casefold() in _NOT_NAMES:
            continue
        words = words.split()
        for n in range(len(words), 0, -1):
            key = "_".join(words[-n:]).replace("-", "_")
            shown = _keyed_names(key, evidence)
            if shown:
                if name.casefold() not in {v.casefold() for v in shown}:
                    claims.append(
                        Claim(
                            text=name,
                            kind="quote",
                            grounded=False,
                            detail=f"the outputs show {key!r} as {', '.join(shown)}, "
                            f"not {name!r}: state only what the outputs show",
                        )
                    )
                break
    return claims


def _keyed_names(key: str, evidence: Evidence) -> list[str]:
    """The names output lines show under `key` ("best_region: East"), spelled with "_",
    "-" or a space."""
    spellings = {key, key.replace("_", " "), key.replace("_", "-")}
    if not any(evidence.may_contain(s) for s in spellings):
        return []
    shown = []
    for fact in evidence.texts:
        line = str(fact.value)
        if len(line) > 200 or not any(s in line.casefold() for s in spellings):
            continue
        m = _KEYED_NAME.fullmatch(line)
        if m is not None and re.sub(r"[ -]", "_", m["key"].strip().casefold()) == key:
            shown.append(m["v"])
            if len(shown) > _MAX_NAMES:
                return []  # a key of many records, not one answer's: a bounded cost
    return shown
