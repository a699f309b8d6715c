"""Grounding: the answer may state only what the outputs it relies on show.

Every number, date, quoted value and unit in the answer must come from the evidence (the
printed output line by line, the JSON result, the artifacts' names and sizes), allowing for the
rounding the answer states ("3.14" for 3.14159, "about 2.5 million" for 2,497,312; the rule is
in `comparison`: correct rounding, unsaid only to two significant digits) and for unit
formatting (thousands separators, percentages, scientific notation, "k"/"million"). Numbers are
read whole by `quantities` (magnitude, unit, sign, bound, approximation, words). A change the
answer states between two grounded numbers of the same sentence ("from 10 to 12, up 20%") is
derived from the output values they matched. A number the answer ties to a label an output
shows must be that label's (`labels`; "value", "total" and "result" only as a sentence's
whole subject: "The total is 100"), and one tied to a row and a column must be at their
crossing; numbers it lists together must be a printed sequence's (`listed`: all of "the
values", a pair printed together, an order printed); a month, weekday, quarter, year, version
or rank it names must be one an output shows (`named`). When unsure, the check refuses. Claims of
verification must match checks that ran and passed. Values the question itself gives (its
numbers, years, quoted names) need no evidence, nor do list markers, ordinals that are no rank
("the 3rd row"), "line 3" and rounding statements ("to 2 decimal places"). The program is not
evidence: it grounds code the answer quotes, never a value. Deterministic: no model, no sandbox.
This module orders the claims and masks what each kind took; the matchers for each kind are in
`ground_numbers` (numbers, units, fractions, operations, changes) and `ground_text` (quotes,
dates, times of day, the result, verification).
"""

from __future__ import annotations

import ast
import bisect
import re
from collections.abc import Iterable
from dataclasses import replace

from .comparison import matches
from .evidence import Context, Evidence, Fact
from .ground_numbers import (
    FRACTION,
    OPERATION,
    OUT_OF,
    POWER_WORD,
    derived_claim,
    fits,
    fraction_claims,
    from_to_pairs,
    literal_claim,
    number_claim,
    operation_claim,
    out_of_claim,
    statistic_claim,
    statistics_named,
    unit_claim,
)
from .ground_text import (
    CLOCK,
    clock_claim,
    date_claim,
    keyed_name_claims,
    month_day_claim,
    norm,
    quote_claim,
    result_claim,
    verification_claims,
)
from .labels import (
    RESPECTIVELY,
    LabelIndex,
    lookup,
    norm_label,
    period_label,
    respective_labels,
    tied_labels,
    wanted_words,
)
from .listed import listed_claims
from .models import Claim, Verdict
from .named import NAMED_LABELS, named_claims
from .peaks import Series, extreme_claim
from .periods import period_word_claims
from .quantities import Num, claimed_numbers, claimed_words, normalize, numbers_in
from .rows import COUNTED_AXIS, WHOLE_COUNT, frames, positioned, row_facts, shapes
from .spelled import WORD_FRACTION, word_numbers
from .values import (
    DateKey,
    blank,
    date_matches,
    dates_in,
    durations_in,
    mask_dates,
    month_days_in,
    scale_of,
)

# "1." at a line's start is a list marker only as part of a count from 1: "999." is a value.
_LIST_MARKER = re.compile(r"^\s*(\d+)[.)]\s", re.M)
_ASIDE_SHARE = re.compile(r"\s*(?:[A-Za-z]+\s*)?\(?\s*")
_SENTENCE_END = re.compile(r"[.!?;](?=\s|$)|\n")
# A sentence whose whole subject is a word too generic to tie a label anywhere else.
_GENERIC_SUBJECT = re.compile(
    r"\s*the\s+(?P<word>value|total|result)\s+(?:is|was|equals|=|:)\s*", re.I
)
# What a number counts when it says how many rows there are: "8 rows", "7 non-null values".
_COUNTED = re.compile(
    r"\s+(?:[\w-]+\s+)?(?:rows|values|records|entries|observations|samples|items|data\s+points)\b",
    re.I,
)
_COUNT_LABEL = "count"
# Between two changes of one direction: "fell 11.4% in March and 54.8% in April".
_SAME_WAY = re.compile(r"(?:\s+(?:in|on|during|for)(?:\s+[\w-]+)?)?\s*,?\s+and\s+(?:by\s+)?", re.I)
# Words that make a number a share, so a fraction and its percentage are one value.
_SHARE = re.compile(
    r"%\s+of\b|\bper\s?cent\s+of\b|\bshares?\b|\bproportions?\b|\bfractions?\b|\bratio\b"
    r"|\baccount(?:s|ed)?\s+for\b|\bma(?:kes?|de|king)\s+up\b|\bas\s+a\s+(?:decimal|percentage)\b",
    re.I,
)
# Between a named value and a number, what makes the number another's: "March, and 35".
_GAP_BREAK = re.compile(
    r"[.!?;,\n()]|\b(?:and|or|than|vs|versus|but|while|whereas|after|before|since|from|to)\b",
    re.I,
)
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

# -- quotes and verification claims -------------------------------------------------------------

# A fenced block: its lines that are the program's or an output's are shown, not claimed.
_FENCE = re.compile(r"```(?:[\w+-]*\n)?(?P<body>.*?)```", re.S)
_QUOTES = re.compile(
    r"`(?P<code>[^`\n]{1,200})`|\"(?P<dq>[^\"\n]{1,200})\"|"
    r"\u201c(?P<cq>[^\u201d\n]{1,200})\u201d|"
    r"(?<![\w])['\u2018](?P<sq>[^'\u2019\n]{1,120})['\u2019](?![\w])",
    re.S,
)

# Run and ask ids cited in the answer (hex with a letter: a long number is not an id).
_IDS = re.compile(r"\b(?:ask_)?(?=[0-9]*[a-f])[0-9a-f]{16,64}\b")


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
    # Each phase masks what its claims took once, all its spans in one pass: the work stays
    # linear in the answer, however many claims it makes.
    masked = blank(answer, [m.span() for m in _IDS.finditer(answer)])
    program = {norm(line) for line in context.code.splitlines()}
    outputs = {norm(line) for fact in evidence.texts for line in str(fact.value).splitlines()}
    spans: list[tuple[int, int]] = []
    for match in _FENCE.finditer(masked):
        spans += [(match.start(), match.start("body")), (match.end("body"), match.end())]
        pos = match.start("body")
        for line in match["body"].splitlines(keepends=True):
            if norm(line) in outputs or norm(line) in program and _is_code(line) or not norm(line):
                spans.append((pos, pos + len(line)))
            pos += len(line)
    masked, spans = blank(masked, spans), []
    for match in _QUOTES.finditer(masked):
        quoted = match["code"] or match["dq"] or match["cq"] or match["sq"]
        claim = quote_claim(quoted, evidence, context, code_span=match["code"] is not None)
        claims.append(claim)
        if claim.source == "the program" and re.search(r"\d", quoted):
            # Quoting the program is no evidence for its numbers: "`total = 999`" claims 999.
            spans += [(match.start(), match.start() + 1), (match.end() - 1, match.end())]
        else:
            spans.append(match.span())
    masked, spans = blank(masked, spans), []
    # The labels the answer's own words may name (not its quotes or the outputs it shows in
    # fences), and those a named value reads ("month", "rank").
    wanted = wanted_words(masked) | NAMED_LABELS
    if _COUNTED.search(masked):
        wanted |= {_COUNT_LABEL}
    if _RANGE.search(masked):
        wanted |= {"min", "max"}
    wanted |= {m["word"].lower() for m in _GENERIC_SUBJECT.finditer(masked)}
    series: list[Series] = []
    dated: list[tuple[int, int, list[DateKey]]] = []  # a full date's span: the row it picks
    for keys, match in dates_in(masked):
        if all(key[2] is not None for key in keys):
            dated.append((match.start(), match.end(), keys))
        claim = date_claim(match[0], keys, evidence, context)
        if claim.grounded and claim.source != "the question":
            start, end = match.span()
            claim = extreme_claim(masked, start, end, keys, evidence, series) or claim
        claims.append(claim)
        spans.append(match.span())
    masked, spans = blank(masked, spans), []
    for month, day, match in month_days_in(masked):
        claims.append(month_day_claim(match, month, day, evidence, context))
        spans.append(match.span())
    masked, spans = blank(masked, spans), []
    for match in _ZONE.finditer(masked):
        claims.append(_zone_claim(match["zone"], evidence))
        spans.append(match.span("zone"))
    masked, spans = blank(masked, spans), []
    for match in CLOCK.finditer(masked):
        claims.append(clock_claim(match, evidence, wanted))
        spans.append(match.span())
    for span, claim in period_word_claims(masked, evidence, context.question):
        claims.append(claim)
        spans.append(span)
    shown = list(spans)  # the named values' spans: their kind's label is theirs
    masked, spans = blank(masked, spans), []
    periods: dict[tuple[int, int], str] = {}  # a named period's span: the rows it labels
    for named, claim in named_claims(masked, evidence, context.question, wanted):
        claims.append(claim)
        if named.kind in ("month", "quarter", "year", "weekday"):
            periods[(named.start, named.end)] = period_label(named.kind, named.value)
        if not named.superlative:  # "the highest sales (210)": the words read on
            spans.append((named.start, named.end))
            shown.append((named.start, named.end))
    masked, spans = blank(masked, spans), []
    durations = []
    for seconds, step, match in durations_in(masked):
        durations.append(
            Num(match[0], match.start(), match.end(), seconds, step, unit="s", stated_step=step)
        )
        spans.append(match.span())
    masked, spans = blank(masked, spans), []
    masked = blank(masked, _list_markers(masked))
    for match in FRACTION.finditer(masked):
        claims.extend(fraction_claims(match, masked, evidence, context))
        spans.append(match.span())
    for match in OUT_OF.finditer(masked):
        claims.append(out_of_claim(match, evidence))
        spans.append(match.span())
    masked, spans = blank(masked, spans), []
    question_numbers = [f.value for f in numbers_in(mask_dates(context.question))]
    question_numbers += [v for v, _, _ in word_numbers(context.question)]
    # "6 squared" is the operation 6^2.
    masked = POWER_WORD.sub(
        lambda m: ("^2" if m[1].lower() == "squared" else "^3").ljust(len(m[0])), masked
    )
    for match in OPERATION.finditer(masked):
        claims.append(operation_claim(match, evidence, question_numbers))
        spans.append(match.span())
    masked = blank(masked, spans)
    nums = [_unscaled(num, evidence) for num in claimed_numbers(masked)]
    masked = blank(masked, [(num.start, num.end) for num in nums])
    nums = sorted([*nums, *durations, *claimed_words(masked)], key=lambda n: n.start)
    stated: list[tuple[Num, Claim]] = []
    percents = {round(abs(n.value), 9) for n in nums if n.percent}
    previous: Num | None = None
    said_from = 0
    for num in nums:
        if (
            previous is not None
            and num.direction is None
            and previous.direction is not None
            and num.percent == previous.percent
            and _SAME_WAY.fullmatch(masked, previous.end, num.start)
            and not re.match(r"\s+of\b", masked[num.end : num.end + 4])  # "and 40% of users"
        ):
            num = replace(num, direction=previous.direction)  # "fell 11% in March and 55%"
        previous = num
        if (
            _SHARE.search(answer, max(0, num.start - 40), num.end + 40)
            or (not num.percent and round(abs(num.value) * 100, 9) in percents)
            or WORD_FRACTION.fullmatch(num.text)
        ):
            num = replace(num, converts=True)  # "42.9% of rows", "0.9 (90%)", "a third"
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
            stated.append((num, literal_claim(num.text, evidence, listed=True)))  # "[1,5]"
            continue
        claim = number_claim(num, evidence, question_numbers, words)
        # The statistic it is called: named since the previous number ("mean 4.2 ± 0.3").
        said = statistics_named(before[max(0, len(before) - (num.start - said_from)) :])
        stated.append((num, statistic_claim(num, claim, said, evidence)))
        said_from = num.end
    stated = _labelled(stated, masked, evidence, wanted, sorted(shown), answer, periods)
    stated = _respectively(stated, masked, evidence, wanted)
    stated = _positioned(stated, masked, evidence)
    stated = _shaped(stated, masked, evidence)
    stated = _dated(stated, masked, evidence, dated, answer)
    stated = _year_keyed(stated, masked, evidence)
    stated = _ranged(stated, masked, evidence, wanted)
    stated = listed_claims(stated, masked, evidence)
    stated = [(num, _multiplied(num, claim, masked, evidence)) for num, claim in stated]
    stated = _grown_to(stated, masked, evidence)
    ends = [m.start() for m in _SENTENCE_END.finditer(masked)]
    sentences: dict[int, list[tuple[Num, Claim]]] = {}
    for num, claim in stated:
        sentences.setdefault(bisect.bisect(ends, num.start), []).append((num, claim))
    changes: dict[tuple[int, bool], list[tuple[Num, Num]]] = {}
    for num, claim in stated:
        if not claim.grounded and not num.literal:
            key = (bisect.bisect(ends, num.start), num.points)
            if key not in changes:
                changes[key] = from_to_pairs(sentences[key[0]], masked, num.points)
            claim = derived_claim(num, changes[key], evidence) or claim
        claims.append(claim)
        if num.unit is not None and claim.grounded:
            claims.append(unit_claim(num, evidence, context))
    claims.extend(verification_claims(masked, list(verdicts)))
    claims.extend(keyed_name_claims(masked, evidence))
    result = result_claim(answer, nums, evidence.result)
    if result is not None:
        claims.append(result)
    return claims


# A time's zone: "13:00 EST", "1 pm UTC+2". A time of another zone is another time.
_ZONE = re.compile(
    r"\d(?::[0-5]\d){0,2}\s?(?:[ap]\.?m\.?)?\s*\(?(?P<zone>(?:UTC|GMT)(?:\s?[+-]\s?\d{1,2}(?::?\d\d)?)?|"
    r"[ECMP][SD]T|AK[SD]T|HST|[CEW]ES?T|BST|IST|JST|KST|AE[SD]T|NZ[SD]T)\b\)?"
)
_UTC = re.compile(r"(?:utc|gmt)(?:\s?[+-]\s?0{1,2}(?::?00)?)?", re.I)


def _refused(num: Num, detail: str) -> Claim:
    """The number `num` of the answer, refused for `detail`."""
    return Claim(text=num.text, kind="number", grounded=False, detail=detail)


def _zone_claim(zone: str, evidence: Evidence) -> Claim:
    """A zone the answer gives a time must be one an output states: a time printed in UTC
    ("+00:00") is not "13:00 EST"."""
    folded = zone.casefold()
    offset = re.search(r"([+-])\s?(\d{1,2})(?::?(\d\d))?$", folded)
    if _UTC.fullmatch(folded) is not None:
        shown = re.compile(r"[+-]00:?00\b|\butc\b|\bgmt\b|\dz\b")
    elif offset is not None:  # "UTC-5" of a printed "-05:00"
        sign, hours, minutes = offset[1], int(offset[2]), offset[3] or "00"
        shown = re.compile(rf"{re.escape(folded)}|\d{re.escape(sign)}{hours:02d}:?{minutes}\b")
    else:
        shown = re.compile(rf"\b{re.escape(folded)}\b")
    blob = evidence.folded()
    if shown.search(blob):
        return Claim(text=zone, kind="date", grounded=True, source="an output states this zone")
    return Claim(
        text=zone,
        kind="date",
        grounded=False,
        detail="no output states this time zone: give the time in the zone the outputs show",
    )


_SCALED = re.compile(r"(\d[\d,]*(?:\.\d+)?)\s+([A-Z])")


def _unscaled(num: Num, evidence: Evidence) -> Num:
    """ "East has 1 B sale" over a table with a column "B": the letter is that column, not a
    billion (read as one only where no output header shows it)."""
    scaled = _SCALED.fullmatch(num.text)
    if scaled is None or not any(
        scaled[2] in line.split() and not re.search(r"\d", line)
        for fact in evidence.texts
        for line in [str(fact.value)]
    ):
        return num
    bare = next(iter(claimed_numbers(scaled[1])), None)
    if bare is None:
        return num
    return replace(bare, start=num.start, end=num.start + len(scaled[1]))


def _labelled(
    stated: list[tuple[Num, Claim]],
    text: str,
    evidence: Evidence,
    wanted: frozenset[str],
    named: list[tuple[int, int]],
    answer: str,
    periods: dict[tuple[int, int], str],
) -> list[tuple[Num, Claim]]:
    """A grounded number the answer ties to a label the outputs show ("South sold 143",
    "the median is 4.2") must be that label's: on its line, under its key, in its column."""
    out = []
    labels: list[str] = []  # the previous number's
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
            # "East sold 143 units (31%)": a share in parentheses is the same label's.
            between = text[stated[i - 1][0].end : num.start] if i else ""
            aside = _ASIDE_SHARE.fullmatch(between) and "(" in between + num.text[:1]
            shares = [
                label
                for label in labels
                if (cells := index.get(label)) is not None and any(c[2] for c in cells.values)
            ]  # only a label whose line shows a share: "(39% of all)" may be computed apart
            labels = [
                *(shares if aside and num.percent else []),
                *tied_labels(text, num.start, num.end, previous, following, index),
            ]
            # "The peak hour is 2 pm with 50", "the peak month was March with 500": a kind's
            # label before a named value of it is that value's, not the number after it.
            at = bisect.bisect(named, (num.start, num.start)) - 1
            if at >= 0 and named[at][0] >= previous:
                labels = [label for label in labels if label not in NAMED_LABELS]
                # "March with 35", "Monday sold 12": a row named by the value is the number's.
                gap = text[named[at][1] : num.start]
                if not _GAP_BREAK.search(gap) and len(gap.split()) <= 3:
                    row = lookup(norm_label(answer[named[at][0] : named[at][1]]), index)
                    row = row or _period(named[at], periods, index)
                    labels += [row] if row is not None else []
            after = bisect.bisect(named, (num.end, num.end))
            if after < len(named) and _IN_PERIOD.fullmatch(text, num.end, named[after][0]):
                row = _period(named[after], periods, index)  # "rose 84% in March"
                labels += [row] if row is not None else []
            # "There are 8 rows" over a summary: a count the answer ties to nothing else
            # must be the summary's count, not its quartile that happens to be 8.
            if not labels and _COUNTED.match(text, num.end) and index.get(_COUNT_LABEL):
                labels = [_COUNT_LABEL]
            # "The value is 100" over a printed "value: 1": a generic word that is the whole
            # subject of its sentence names the key an output shows with that word.
            begin = max([0, *(e.end() for e in _SENTENCE_END.finditer(text, 0, num.start))])
            subject = _GENERIC_SUBJECT.fullmatch(text, begin, num.start)
            if not labels and subject and index.get(subject["word"].lower()) is not None:
                labels = [subject["word"].lower()]
            for label in labels:
                cells = index.get(label)
                if cells is not None and not any(fits(num, _cell_fact(c)) for c in cells.values):
                    shown = ", ".join(f"{c[0]:g}" for c in cells.values[:5])
                    claim = _refused(
                        num,
                        f"the outputs show {label.lstrip(chr(0))!r} as {shown}, not this value "
                        f"(it is shown at {claim.source})",
                    )
                    break
            else:
                claim = _crossing(num, claim, labels, index)
        else:
            labels = []
        out.append((num, claim))
    return out


def _positioned(
    stated: list[tuple[Num, Claim]], text: str, evidence: Evidence
) -> list[tuple[Num, Claim]]:
    """ "The second order sold 30": a grounded number after a row's position, in its sentence,
    must be on that row of a printed frame (of any, when several are printed)."""
    named = list(positioned(text))
    if not named:
        return stated
    shown = frames(evidence)
    if not shown:
        return stated
    rows = {
        (end, pos): [frame[pos - 1 if pos > 0 else -1] for frame in shown if pos <= len(frame)]
        for end, pos, _ in named
    }
    facts = row_facts(evidence, {where for wheres in rows.values() for where in wheres})
    out = []
    for num, claim in stated:
        for end, pos, stop in named:
            if not (claim.grounded and not num.literal and end <= num.start < stop):
                continue
            wheres = rows[(end, pos)]
            if not any(fits(num, fact) for where in wheres for fact in facts[where]):
                which = "last" if pos < 0 else f"number {pos}"
                claim = _refused(
                    num,
                    f"the printed row {which} does not show this value "
                    f"(it is shown at {claim.source})",
                )
        out.append((num, claim))
    return out


# A number before the date of its row: "sales were 40 on 2023-03-05".
_ON_DATE = re.compile(r"\s+(?:[A-Za-z%]+\s+){0,2}(?:on|at|for|dated)\s+(?:the\s+)?", re.I)
_CLAUSE_BREAK = re.compile(r"[.!?;,()\n]|\b(?:and|but|while|whereas|than|from|vs|versus)\b", re.I)


def _dated(
    stated: list[tuple[Num, Claim]],
    text: str,
    evidence: Evidence,
    dated: list[tuple[int, int, list[DateKey]]],
    answer: str,
) -> list[tuple[Num, Claim]]:
    """ "On 2023-03-05 sales were 40", "the East order on 2023-01-02 sold 30": a number in a
    date's clause must be on an output line showing that date, when such lines show numbers."""
    if not dated:
        return stated
    out = []
    for num, claim in stated:
        if claim.grounded and not num.literal and claim.source != "the question":
            for start, end, keys in dated:
                after = end <= num.start and not _CLAUSE_BREAK.search(text, end, num.start)
                after = after and not any(end <= s < num.start for s, _, _ in dated)
                before = _ON_DATE.fullmatch(text, num.end, start) is not None
                if not (after or before):
                    continue
                rows = {
                    f.where
                    for f in evidence.dates
                    if any(date_matches(key, shown) for key in keys for shown in f.value)
                }
                shown = [f for f in evidence.numbers if f.where in rows]
                if len(shown) > len(rows) and not any(fits(num, f) for f in shown):
                    claim = _refused(
                        num,
                        f"the output lines showing {answer[start:end]} do not show this value "
                        f"(it is shown at {claim.source})",
                    )
                    break
        out.append((num, claim))
    return out


def _shaped(
    stated: list[tuple[Num, Claim]], text: str, evidence: Evidence
) -> list[tuple[Num, Claim]]:
    """ "The table has 99 rows" over a frame printed with "[100 rows x 3 columns]": a count of
    rows or columns must be the printed size, not the last index or the other axis."""
    if not any(COUNTED_AXIS.match(text, num.end) for num, _ in stated):
        return stated
    rows, cols = shapes(evidence)
    out = []
    for num, claim in stated:
        axis = COUNTED_AXIS.match(text, num.end)
        if not WHOLE_COUNT.search(text, max(0, num.start - 40), num.start):
            axis = None
        sizes = (rows if axis["rows"] else cols) if axis is not None else set()
        if claim.grounded and not num.literal and sizes:
            if not any(matches(num, float(size)) for size in sizes):
                which = "rows" if axis is not None and axis["rows"] else "columns"
                shown = ", ".join(str(size) for size in sorted(sizes))
                claim = _refused(
                    num, f"the outputs print the frame's {which} as {shown}, not this value"
                )
        out.append((num, claim))
    return out


def _year_keyed(
    stated: list[tuple[Num, Claim]], text: str, evidence: Evidence
) -> list[tuple[Num, Claim]]:
    """ "2022 had 1,530 units": a number right after a year an output line is keyed by
    ("2022: 1,204") must be on such a line (a label of digits alone is no word label)."""
    out = list(stated)
    for i in range(len(stated) - 1):
        (year, _), (num, claim) = stated[i], stated[i + 1]
        gap = text[year.end : num.start]
        if not (
            _YEAR.fullmatch(year.text)
            and claim.grounded
            and not num.literal
            and not _GAP_BREAK.search(gap)
            and len(gap.split()) <= 3
            and evidence.may_contain(year.text)
        ):
            continue
        key = re.compile(rf"\s*{year.text}\s*[:=]?\s+\S")
        rows = {f.where for f in evidence.texts if key.match(str(f.value))}
        if rows and not any(fits(num, f) for f in evidence.numbers if f.where in rows):
            out[i + 1] = (
                num,
                _refused(
                    num,
                    f"the outputs' lines keyed {year.text} do not show this value "
                    f"(it is shown at {claim.source})",
                ),
            )
    return out


# "range from 1 to 9", "between 18 and 65", "the range is 1-9": a low and a high.
_RANGE = re.compile(r"\b(?:range[sd]?|ranging|between|spans?|spanning)\b", re.I)
# "doubled to 10": the value it is a multiple of must be shown too.
_MULTIPLIED = re.compile(r"\b(doubled|tripled|quadrupled|halved)\s+to\s+$", re.I)
_FACTORS = {"doubled": 2.0, "tripled": 3.0, "quadrupled": 4.0, "halved": 0.5}


def _multiplied(num: Num, claim: Claim, text: str, evidence: Evidence) -> Claim:
    """ "The value doubled to 10" over "before: 4, after: 10": 10 is shown, but no value it
    doubled from (about 5) is."""
    said = _MULTIPLIED.search(text, max(0, num.start - 30), num.start)
    if not claim.grounded or num.literal or said is None or not num.value:
        return claim
    base = num.value / _FACTORS[said[1].lower()]
    low, high = sorted((base / 1.1, base / 0.9))
    if any(not f.percent for f in evidence.near(low, high)):
        return claim
    return _refused(
        num, f"'{said[1]} to' needs a value near {base:g} shown before it; no output shows one"
    )


_GROWN_TO = re.compile(r"\s+to\s+(?:(?:about|around|roughly|nearly|almost)\s+)?$", re.I)


def _grown_to(
    stated: list[tuple[Num, Claim]], text: str, evidence: Evidence
) -> list[tuple[Num, Claim]]:
    """ "Sales grew 27.1% to 1,530": the end value must be the start an output shows grown by
    the rate, so "grew 27.1% to 1,204" (the start) is refused; a rate no output prints is
    grounded when the two values it is the change between are shown."""
    out = list(stated)
    for i in range(len(stated) - 1):
        (rate, rated), (end, claim) = stated[i], stated[i + 1]
        if not (
            rate.percent
            and rate.direction is not None
            and not end.percent
            and not end.literal
            and claim.grounded
            and _GROWN_TO.fullmatch(text, rate.end, end.start)
        ):
            continue
        sign = -1.0 if rate.direction == "down" else 1.0
        slack = rate.step if rate.bound == "exact" else max(rate.step, 1.0) * 2
        bases = [
            end.value / factor
            for g in (abs(rate.value) - slack, abs(rate.value) + slack)
            if (factor := 1 + sign * g / 100) > 0
        ]
        if len(bases) < 2:
            continue
        low = min(bases) - end.step - 1e-9 * abs(end.value)
        high = max(bases) + end.step + 1e-9 * abs(end.value)
        starts = [f for f in evidence.near(low, high) if not (f.percent or f.converted)]
        if starts:
            if not rated.grounded:
                out[i] = (
                    rate,
                    Claim(
                        text=rate.text,
                        kind="number",
                        grounded=True,
                        run_id=starts[0].run_id,
                        source=f"the change from {starts[0].where} to {claim.source}",
                    ),
                )
            continue
        base = end.value / (1 + sign * abs(rate.value) / 100)
        out[i + 1] = (
            end,
            _refused(
                end,
                f"a change of {rate.text} to this value starts near {base:g}, and no output "
                f"shows such a start (it is shown at {claim.source})",
            ),
        )
    return out


# Ranges that are not the min to the max: "the interquartile range", "a 95% interval".
_OTHER_RANGE = re.compile(
    r"\b(?:interquartile|iqr|quartiles?|percentiles?|confidence|interval|ci)\b", re.I
)
_RANGE_GAP = re.compile(r"\s*(?:to|and|through|-|\u2013|\u2014)\s*", re.I)


def _ranged(
    stated: list[tuple[Num, Claim]], text: str, evidence: Evidence, wanted: frozenset[str]
) -> list[tuple[Num, Claim]]:
    """ "Values range from 1 to 10" over a printed min and max: the low must be the min and
    the high the max, not any other shown number (a count of 10)."""
    if not _RANGE.search(text):
        return stated
    index = evidence.label_index(wanted)
    low, high = index.get("min"), index.get("max")
    if low is None or high is None:
        return stated
    out = list(stated)
    for i in range(len(stated) - 1):
        (first, one), (second, two) = stated[i], stated[i + 1]
        clause = re.split(r"[.!?;\n]", text[max(0, first.start - 60) : first.start])[-1]
        if not (
            one.grounded
            and two.grounded
            and _RANGE_GAP.fullmatch(text, first.end, second.start)
            and _RANGE.search(clause)
            and not _OTHER_RANGE.search(clause)
        ):
            continue
        for j, num, cells, name in ((i, first, low, "min"), (i + 1, second, high, "max")):
            if not any(fits(num, _cell_fact(c)) for c in cells.values):
                shown = ", ".join(f"{c[0]:g}" for c in cells.values[:5])
                out[j] = (
                    num,
                    _refused(
                        num,
                        f"a range's {'low' if name == 'min' else 'high'} end: the "
                        f"outputs show {name!r} as {shown}, not this value",
                    ),
                )
    return out


_YEAR = re.compile(r"(?:19|20)\d\d")


def _respectively(
    stated: list[tuple[Num, Claim]], text: str, evidence: Evidence, wanted: frozenset[str]
) -> list[tuple[Num, Claim]]:
    """ "East and West had 98 and 143 respectively": the labels before a sentence's first
    number, in order, are its numbers' in order, when they are as many."""
    if not RESPECTIVELY.search(text):
        return stated
    index = evidence.label_index(wanted)
    out = list(stated)
    for m in RESPECTIVELY.finditer(text):
        begin = max([0, *(e.end() for e in _SENTENCE_END.finditer(text, 0, m.start()))])
        mine = [
            i
            for i, (num, claim) in enumerate(stated)
            if begin <= num.start < m.start() and claim.grounded and not num.literal
        ]
        if len(mine) < 2:
            continue
        labels = respective_labels(text, begin, stated[mine[0]][0].start, index)
        if len(labels) != len(mine):
            continue
        for i, label in zip(mine, labels, strict=True):
            num, claim = stated[i]
            cells = index.get(label)
            if cells is not None and not any(fits(num, _cell_fact(c)) for c in cells.values):
                shown = ", ".join(f"{c[0]:g}" for c in cells.values[:5])
                out[i] = (
                    num,
                    _refused(
                        num,
                        f"the outputs show {label!r} as {shown}, not this value "
                        f"(it is shown at {claim.source})",
                    ),
                )
    return out


# Between a number and the period it is of: "35 units in March", "84% during Q2".
_IN_PERIOD = re.compile(r"\s+(?:[A-Za-z%]+\s+)?(?:in|on|during|for)\s+", re.I)


def _period(
    span: tuple[int, int], periods: dict[tuple[int, int], str], index: LabelIndex
) -> str | None:
    """The rows a named period labels ("February" of a "2023-02-01   35" row), if shown."""
    label = periods.get(span)
    return label if label is not None and index.get(label) is not None else None


def _crossing(num: Num, claim: Claim, labels: list[str], index: LabelIndex) -> Claim:
    """A number tied to labels that meet on some line (a row and a column, a MultiIndex's
    levels) must be at their crossing: "For East, B was 77" is East's row in B's column."""
    cells = [c for label in dict.fromkeys(labels) if (c := index.get(label)) is not None]
    if len(cells) < 2 or not set.intersection(*({c[4] for c in cs.values} for cs in cells)):
        return claim
    common = set.intersection(*({(c[4], c[0]) for c in cs.values} for cs in cells))
    crossing = [c for c in cells[0].values if (c[4], c[0]) in common]
    if any(fits(num, _cell_fact(c)) for c in crossing):
        return claim
    names = " and ".join(repr(label) for label in dict.fromkeys(labels))
    shown = ", ".join(dict.fromkeys(f"{c[0]:g}" for c in crossing)) or "no value"
    return _refused(
        num,
        f"the outputs show {names} together as {shown}, not this value "
        f"(it is shown at {claim.source})",
    )


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
