"""Numbers the answer lists together: a list is a claim about a printed sequence as a whole.

A printed sequence is a line that is one bracketed group, perhaps labelled or wrapped
("ci: (0.2, 0.9)", "array([1., 2., 3.])", "sorted: [3, 2, 1]"). Three rules, each on numbers
that already ground one by one:

- Whole: "the values are 1" (or "the array is 1, 2", "the values are all 1") names every value
  of the sequence it cites: when one printed sequence holds all the listed numbers, some such
  sequence must hold no other value. "The values are 1" holds for [1 1 1], not for [1 2 3].
- Together: numbers the answer writes as a pair or tuple ("[0.2, 0.8]", "0.2 to 0.8", "1-9",
  not a change "from 10 to 15") whose first is printed only inside sequences of two or more
  come from one of them, in the order printed. A CI's other end taken from another line
  ("alpha: 0.8") is not that interval's. A plain list ("0.91 and 0.88") may gather values
  printed in separate sequences (a train and a test pair).
- Ordered: a list the answer says is in order ("sorted", "in ascending order", "ranked") shows
  its numbers in an order an output prints: along one line or down successive lines, and
  rising or falling as the words say. "The sorted values are 1, 2, 3" over a printed
  "sorted: [3, 2, 1]" states an order no output shows.
- Counted: the N of "the top N are" or "the bottom N:" counts the list after it, when it lists
  N numbers; such a list is ranked, so it rises or falls ("the top 3 are 5, 9, 7" is refused).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import islice

from .evidence import Evidence, Fact
from .ground_numbers import fits, window
from .models import Claim
from .quantities import Num

# Between two listed numbers: "1, 2", "1, 2 and 3", "1 and 2"; a pair: "0.2 to 0.8", "1-9".
_CHANGE = re.compile(r"\bfrom\s+$", re.I)  # "from 10 to 15" is a change, not a pair
_LIST_GAP = re.compile(r"\s*,\s*(?:and\s+|or\s+)?|\s+(?:and|or)\s+")
_PAIR_GAP = re.compile(r"\s+to\s+|\s*[\u2013\u2014]\s*|\s*-\s+|\s+-\s*|-")
# A printed line that is one bracketed group: "[3, 2, 1]", "ci: (0.2, 0.9)", "array([1., 2.])".
_SEQUENCE_LINE = re.compile(
    r"\s*(?:[A-Za-z_][\w .'-]{0,40}?\s*[:=]\s*)?(?:[A-Za-z_.]+\()?"
    r"[\[(][^\[\]()]*\d[^\[\]()]*[\])]\)?(?:,\s*dtype=\w+\))?\s*"
)
# The words before a list that say it is all of them: "the values are", "the array is: ".
_WHOLE = re.compile(
    r"\b(?:the|its|all)\s+(?:(?:sorted|resulting|returned|printed|output|final)\s+)?"
    r"(?:values|elements|entries|items|numbers|results|array|list|vector|tuple)\s+"
    r"(?:are|is|were|was)\s*:?\s*(?:all\s+)?[\[(]?\s*$",
    re.I,
)
# Words that say a list is in order ("ordered" is also the verb: "customers ordered 3 and 5").
_ORDERED = re.compile(
    r"\b(?:sorted|in\s+(?:\w+\s+)?order(?!\s+to\b)|ascending|descending|increasing|"
    r"decreasing|ranked)\b",
    re.I,
)
_RISING = re.compile(r"\b(?:ascending|increasing)\b", re.I)
_FALLING = re.compile(r"\b(?:descending|decreasing)\b", re.I)
# "The top 3 are 9, 7, 5": the 3 counts the list after it.
_TOP = re.compile(r"\b(?:top|bottom)\s+$", re.I)
_COUNTED_GAP = re.compile(r"(?:\s+[A-Za-z-]+){0,3}\s+(?:are|were)\s*:?\s*|\s*:\s*")
_CLAUSE_BREAK = re.compile(r"[.!?;\n](?=\s|$)|:\s*\n")
_CANDIDATES = 50  # facts tried for a list's first number


@dataclass
class _Listed:
    members: list[int]  # indexes into the stated numbers
    bracketed: bool  # "[0.2, 0.8]" or "(1, 2)" as the answer writes it
    paired: bool  # "0.2 to 0.8", "1–9"


def listed_claims(
    stated: list[tuple[Num, Claim]], text: str, evidence: Evidence
) -> list[tuple[Num, Claim]]:
    """The stated numbers, with those of a list that misstates its printed sequence refused."""
    out = list(stated)
    positions: dict[int, int] | None = None
    for group in _lists(stated, text):
        nums = [stated[i][0] for i in group.members]
        first, last = nums[0], nums[-1]
        begin = max([0, *(m.end() for m in _CLAUSE_BREAK.finditer(text, 0, first.start))])
        before = text[begin : first.start]
        after = re.split(r"[.!?;\n]", text[last.end : last.end + 60])[0]
        whole = bool(_WHOLE.search(before))
        ordered = bool(_ORDERED.search(before) or _ORDERED.search(after))
        values = [n.value for n in nums]
        rising, falling = _RISING.search(before + after), _FALLING.search(before + after)
        counted = _counted(stated, group, text)
        if counted is not None:
            num = stated[counted][0]
            out[counted] = (
                num,
                Claim(text=num.text, kind="number", grounded=True, source="the list it counts"),
            )
        detail = None
        if len(nums) > 1 and (
            rising and values != sorted(values) or falling and values != sorted(values)[::-1]
        ):
            detail = "these numbers are not in the order the answer says they are in"
        elif counted is not None and sorted(values) not in (values, values[::-1]):
            detail = "a top or bottom list is ranked: these numbers are not in rank order"
        elif len(nums) > 1 or whole:
            if positions is None:
                positions = {id(f): i for i, f in enumerate(evidence.numbers)}
            detail = _misstated(nums, group, evidence, positions, whole=whole, ordered=ordered)
        if detail is not None:
            # The list's last number is the one that breaks it: earlier ones may stand alone.
            num = nums[-1]
            out[group.members[-1]] = (
                num,
                Claim(text=num.text, kind="number", grounded=False, detail=detail),
            )
    return out


def _counted(stated: list[tuple[Num, Claim]], group: _Listed, text: str) -> int | None:
    """The index of the N of "the top N are" before the list, when it counts the list."""
    j = group.members[0] - 1
    if j < 0:
        return None
    num = stated[j][0]
    first = stated[group.members[0]][0]
    if (
        _TOP.search(text, max(0, num.start - 20), num.start)
        and _COUNTED_GAP.fullmatch(text, num.end, first.start)
        and num.value == len(group.members)
        and num.bound == "exact"
    ):
        return j
    return None


def _lists(stated: list[tuple[Num, Claim]], text: str) -> list[_Listed]:
    """Runs of grounded numbers the answer writes as one list or pair; a number alone is
    a run of one (it may still be "the values")."""
    runs: list[_Listed] = []
    current: _Listed | None = None
    for i, (num, claim) in enumerate(stated):
        usable = (
            claim.grounded
            and claim.source != "the question"
            and not num.literal
            and not num.points
            and num.bound in ("exact", "approx")
        )
        if not usable:
            current = None
            continue
        if current is not None:
            prev = stated[current.members[-1]][0]
            gap = text[prev.end : num.start]
            if _LIST_GAP.fullmatch(gap):
                current.members.append(i)
                continue
            if (
                _PAIR_GAP.fullmatch(gap)
                and len(current.members) == 1
                and not _CHANGE.search(text, max(0, prev.start - 10), prev.start)
            ):
                current.members.append(i)
                current.paired = True
                continue
        opens = text[max(0, num.start - 1) : num.start] in ("[", "(") or num.text[:1] == "("
        current = _Listed([i], bracketed=opens, paired=False)
        runs.append(current)
    for run in runs:
        last = stated[run.members[-1]][0]
        run.bracketed = run.bracketed and text[last.end : last.end + 1] in ("]", ")")
    return runs


def _misstated(
    nums: list[Num],
    group: _Listed,
    evidence: Evidence,
    positions: dict[int, int],
    *,
    whole: bool,
    ordered: bool,
) -> str | None:
    """Why the list misstates the sequences the outputs print, or None when it does not."""
    first = list(islice((f for f in window(nums[0], evidence) if fits(nums[0], f)), _CANDIDATES))
    if not first:
        return None
    lines = {f.where: _line(f, evidence, positions) for f in first}
    sequences = {where: facts for where, facts in lines.items() if _is_sequence(where)}
    if whole:
        holding = [facts for facts in sequences.values() if _holds_all(nums, facts)]
        if holding and not any(_only(nums, facts) for facts in holding):
            shown = ", ".join(f"{f.value:g}" for f in holding[0] if not f.converted)
            return (
                f"the outputs show these values as {shown} ({holding[0][0].where}): a list "
                "of the values names them all, not some"
            )
    if ordered:
        if not any(_in_order(nums, f, evidence, positions) for f in first):
            return (
                "the answer states an order no output shows: list the numbers in the order "
                "an output prints them"
            )
    pairs = [facts for facts in sequences.values() if sum(not f.converted for f in facts) > 1]
    if (group.bracketed or group.paired) and pairs and len(pairs) == len(lines):
        if not any(_in_line(nums, facts, in_order=True) for facts in pairs):
            return (
                f"the outputs print {nums[0].text.lstrip('(')!r} only in a sequence "
                f"({pairs[0][0].where}) that does not hold the numbers written with it, in "
                "this order"
            )
    return None


def _line(fact: Fact, evidence: Evidence, positions: dict[int, int]) -> list[Fact]:
    """The facts printed on `fact`'s line, in order (a line's facts are contiguous)."""
    at = positions.get(id(fact))
    if at is None:
        return [fact]
    numbers = evidence.numbers
    start = at
    while start > 0 and numbers[start - 1].where == fact.where:
        start -= 1
    end = at
    while end + 1 < len(numbers) and numbers[end + 1].where == fact.where:
        end += 1
    return numbers[start : end + 1]


def _is_sequence(where: str) -> bool:
    text = where.split(": ", 1)[1] if ": " in where else where
    return _SEQUENCE_LINE.fullmatch(text) is not None


def _holds_all(nums: list[Num], facts: list[Fact]) -> bool:
    return all(any(fits(n, f) for f in facts) for n in nums)


def _only(nums: list[Num], facts: list[Fact]) -> bool:
    """Whether every value the sequence prints is one of the listed numbers."""
    return all(f.converted or any(fits(n, f) for n in nums) for f in facts)


def _in_line(nums: list[Num], facts: list[Fact], *, in_order: bool) -> bool:
    if not in_order:
        return _holds_all(nums, facts)
    at = 0
    for n in nums:
        while at < len(facts) and not fits(n, facts[at]):
            at += 1
        if at == len(facts):
            return False
        at += 1
    return True


def _in_order(nums: list[Num], start: Fact, evidence: Evidence, positions: dict[int, int]) -> bool:
    """Whether the listed numbers follow `start` in print order: along its line, or one a
    line down successive lines (a column printed down the page)."""
    line = _line(start, evidence, positions)
    if _in_line(nums, line[line.index(start) :], in_order=True):
        return True
    at = positions.get(id(start))
    if at is None:
        return False
    numbers = evidence.numbers
    for n in nums[1:]:
        # Each next number: its first fit printed on a later line, not inside a sequence.
        later = sorted(
            p
            for f in window(n, evidence)
            if (p := positions.get(id(f), -1)) > at
            and numbers[p].where != numbers[at].where
            and not _is_sequence(f.where)
            and fits(n, f)
        )
        if not later:
            return False
        at = later[0]
    return True
