"""Ranks an answer gives a label ("East came second", "West is the runner-up", "North is #1",
"the second-largest region is West", "West had the most units"), checked against the ranking
the outputs show: a numbered list ("1. East"), a rank column or key beside the label, or one
series of labelled numbers ("East 143" over "West 98"), ranked by its values.

A rank is checked only when the sentence names one label the ranking holds; the direction
of a series is the answer's word ("largest", "fewest"); a bare "second" or "runner-up" is
checked only against an explicit ranking. A superlative ("the most") is a claim only when a
ranking is found; an ordinal is one always (`named` grounds it by any rank an output shows
when no ranking holds its label).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from .evidence import Evidence
from .labels import LabelIndex, norm_label
from .quantities import numbers_in

_MAX_LINES = 20_000  # output lines read for a ranking; past them none is read

ORDINAL_WORDS = [
    "first",
    "second",
    "third",
    "fourth",
    "fifth",
    "sixth",
    "seventh",
    "eighth",
    "ninth",
    "tenth",
]
ORDINAL = r"(?:\d{1,3}(?:st|nd|rd|th)|" + "|".join(ORDINAL_WORDS) + r")"
_DOWN = "largest|highest|biggest|most|greatest|top|busiest|longest"
_UP = "smallest|lowest|least|fewest|shortest"
# Ranks in other words than `named` reads: "came (in) second", "finished 2nd", "is #2",
# "the runner-up", and superlatives: "the most", "the largest".
IMPLIED = re.compile(
    r"\b(?:came|comes|finished|finishes|ended|ends)\s+(?:in\s+|up\s+)?(?P<came>" + ORDINAL + r")\b"
    r"|\b(?:is|was|are|were)\s+(?:ranked\s+)?(?:#\s*|no\.\s*)(?P<no>\d{1,3})\b"
    r"|\b(?P<runner>runners?[- ]up)\b"
    r"|\bthe\s+(?P<super>" + _DOWN + "|" + _UP + r")\b(?!\s+\d)"
    r"(?!\s+(?:recent|likely|important|notable|significant|similar|relevant|of\s+all)\b)",
    re.I,
)
_SENTENCE = re.compile(r"[.!?;](?=\s|$)|\n")
_NUMBERED = re.compile(
    r"\s*#?(?P<n>\d{1,3})[.)]\s+(?P<label>[A-Za-z][\w'&-]*(?: [A-Za-z][\w'&-]*){0,2})"
)
_SERIES = re.compile(
    r"\s*(?:\d+\s+)?(?P<label>[A-Za-z][\w'&.-]*(?: [A-Za-z][\w'&.-]*){0,2}|\d{4}-?Q[1-4])"
    r"\s*(?:[:=]|\s-)?\s+"
    r"(?P<num>[-$\u20ac\u00a3]?\d[\d,]*(?:\.\d+)?)(?:\s*[A-Za-z%]+\.?)?\s*"
)


@dataclass(frozen=True)
class Implied:
    rank: int
    order: str  # "down": counted from the largest, "up": from the smallest, "": unsaid
    superlative: bool  # "the most": a claim only when a ranking holds the label
    text: str
    start: int
    end: int


def implied_ranks(text: str) -> Iterator[Implied]:
    for m in IMPLIED.finditer(text):
        word = (m["super"] or "").lower()
        order = "up" if re.fullmatch(_UP, word) else "down" if word else ""
        if m["came"]:
            rank = ordinal_number(m["came"])
        else:
            rank = int(m["no"]) if m["no"] else 2 if m["runner"] else 1
        yield Implied(rank, order, bool(m["super"]), m[0], *m.span())


def ordinal_number(text: str) -> int:
    text = text.lower()
    return ORDINAL_WORDS.index(text) + 1 if text in ORDINAL_WORDS else int(re.sub(r"\D", "", text))


@dataclass
class Rankings:
    """The rankings the outputs show, read once: explicit ranks by label, and series."""

    explicit: dict[str, int] = field(default_factory=dict)
    series: list[dict[str, float]] = field(default_factory=list)

    @classmethod
    def of(cls, evidence: Evidence, index: LabelIndex) -> Rankings:
        out = cls()
        numbered: dict[str, int] = {}
        block: dict[str, float] = {}
        lines = [str(f.value) for f in evidence.texts if f.where.startswith("stdout line")][
            :_MAX_LINES
        ]
        for line in [*lines, ""]:
            item = _NUMBERED.match(line)
            if item is not None and int(item["n"]) == len(numbered) + 1:
                numbered[norm_label(item["label"])] = int(item["n"])
            elif len(numbered) >= 2:
                out.explicit.update({k: v for k, v in numbered.items() if k not in out.explicit})
                numbered = {}
            else:
                numbered = {}
            row = _SERIES.fullmatch(line)
            found = list(numbers_in(row["num"])) if row is not None else []
            if row is not None and len(found) == 1 and norm_label(row["label"]) not in block:
                block[norm_label(row["label"])] = found[0].value
                continue
            if len(block) >= 2:
                out.series.append(block)
            block = {}
            if row is not None and len(found) == 1:
                block[norm_label(row["label"])] = found[0].value
        out._ranked_by_column(index)
        return out

    def _ranked_by_column(self, index: LabelIndex) -> None:
        """A rank beside a label: "rank region units" over "1 East 143", or "East rank: 1"."""
        ranks = index.get("rank")
        for value, *_, where in ranks.values if ranks is not None else []:
            names = re.findall(r"[A-Za-z][\w'&-]*(?: [A-Za-z][\w'&-]*)*", where.partition(": ")[2])
            if len(names) == 1 and norm_label(names[0]) != "rank" and value.is_integer():
                self.explicit.setdefault(norm_label(names[0]), int(value))
        for label, cells in index.cells.items():
            values = {v for v, *_ in cells.values}
            if label.endswith(" rank") and len(values) == 1 and values.pop().is_integer():
                self.explicit.setdefault(label.removesuffix(" rank"), int(cells.values[0][0]))

    def rank_of(self, label: str, order: str, *, superlative: bool) -> int | None:
        if label in self.explicit and not superlative:
            return self.explicit[label]
        held = [s for s in self.series if label in s]
        if len(held) != 1 or not order:
            return None  # no series, or several: which one the answer means is unclear
        value = held[0][label]
        sign = 1 if order == "down" else -1
        return 1 + sum(1 for v in held[0].values() if sign * v > sign * value)

    def labels(self) -> set[str]:
        return set(self.explicit) | {label for s in self.series for label in s}


def subject(text: str, start: int, end: int, labels: set[str]) -> str | None:
    """The one label the sentence around [start, end) names of those `labels` ranks."""
    head = max(0, start - 300)  # a window: the cost stays linear in the answer
    ends = [m.end() for m in _SENTENCE.finditer(text, head, start)]
    stop = _SENTENCE.search(text, end, min(len(text), end + 300))
    tail = min(len(text), end + 300)
    sentence = norm_label(text[ends[-1] if ends else head : stop.start() if stop else tail])
    words = sentence.split()
    named = {
        " ".join(words[i : i + n])
        for n in (3, 2, 1)
        for i in range(len(words) - n + 1)
        if " ".join(words[i : i + n]) in labels
    }
    return named.pop() if len(named) == 1 else None
