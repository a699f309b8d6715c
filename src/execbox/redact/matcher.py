"""Finding registered values in text: every form of every value, and every start or end of a
form shown alone or in a masked display, in one pass of one Aho-Corasick automaton
(`ahocorasick_rs`), so the cost of a scan does not grow with the number of values."""

from __future__ import annotations

import bisect
import functools
import re

from ahocorasick_rs import AhoCorasick, Implementation, MatchKind

from .forms import (
    GAP_CHARS,
    MAX_GAP,
    MAX_GAP_BREAKS,
    MAX_PART,
    MIN_CUT_PREFIX,
    MIN_PAIR,
    first_line,
    forms,
    last_line,
    pair_need,
    part_length,
)

__all__ = ["Matcher", "matcher_for"]

# Lone surrogates (bytes that were not UTF-8, decoded with surrogateescape) have no UTF-8 for
# the automaton: each becomes U+FFFD, one character for one, in the text and in the patterns.
_SURROGATE = re.compile("[\ud800-\udfff]")
# Of the redactors built per request, those whose forms are this small are kept for reuse
# (a caller sends the same few secrets with every run); larger ones are built each time.
_CACHED_FORMS_CHARS = 16 * 1024


_CHUNK = 64  # characters compared at once while following a value


def _common_prefix(text: str, at: int, line: str) -> int:
    """How many characters of `text` from `at` are the start of `line`."""
    limit = min(len(line), len(text) - at)
    if text.startswith(line[:limit], at):
        return limit
    n = 0
    while n + _CHUNK <= limit and text.startswith(line[n : n + _CHUNK], at + n):
        n += _CHUNK
    for x, y in zip(text[at + n : at + n + _CHUNK], line[n : n + _CHUNK], strict=False):
        if x != y:
            break
        n += 1
    return n


def _common_suffix(text: str, end: int, line: str) -> int:
    """How many characters of `text` before `end` are the end of `line`."""
    size = len(line)
    limit = min(size, end)
    if text[end - limit : end] == line[size - limit :]:
        return limit
    n = 0
    while (
        n + _CHUNK <= limit
        and text[end - n - _CHUNK : end - n] == line[size - n - _CHUNK : size - n]
    ):
        n += _CHUNK
    for x, y in zip(
        reversed(text[max(0, end - n - _CHUNK) : end - n]),
        reversed(line[max(0, size - n - _CHUNK) : size - n]),
        strict=False,
    ):
        if x != y:
            break
        n += 1
    return n


def _coalesced(
    hits: list[tuple[int, int, int]], before: int, after: int, size: int
) -> list[tuple[int, int]]:
    """The union of the spans from `before` characters before each hit to `after` after it."""
    out: list[tuple[int, int]] = []
    lo, hi = hits[0][1] - before, hits[0][2] + after
    for _, s, e in hits:
        if s - before > hi:
            out.append((max(0, lo), min(size, hi)))
            lo = s - before
        hi = e + after
    out.append((max(0, lo), min(size, hi)))
    return out


def _gap_ends(text: str, at: int) -> list[int]:
    """Where a run of marks from `at` may end (`at` itself first): at most MAX_GAP of them,
    with at most MAX_GAP_BREAKS line breaks."""
    return _gap(text, at, range(at, min(len(text), at + MAX_GAP)), 1)


def _gap_starts(text: str, at: int) -> list[int]:
    """Where a run of marks ending at `at` may start (`at` itself first); see `_gap_ends`."""
    return _gap(text, at, range(at - 1, max(-1, at - 1 - MAX_GAP), -1), 0)


def _gap(text: str, at: int, positions: range, past: int) -> list[int]:
    """The bounds of a run of marks met walking `positions` away from `at`: each mark read
    moves the bound to its own position plus `past` (1 walking forwards, 0 backwards)."""
    out, breaks = [at], 0
    for pos in positions:
        c = text[pos]
        if c not in GAP_CHARS:
            break
        breaks += c in "\r\n"
        if breaks > MAX_GAP_BREAKS:
            break
        out.append(pos + past)
    return out


class Matcher:
    """Every form of every registered value, and every start or end of a form at least
    `part_length` long, found in one pass of one Aho-Corasick automaton.

    The automaton holds the forms whole and, for each form, its first and last `part_length`
    characters (its parts); a part's match is then widened along its form as far as the text
    follows it. Parts stop at a line break, so live output, redacted line by line, finds the
    same spans. The automaton reports leftmost-longest matches without overlap; an occurrence
    that starts inside a reported one and runs past it ("abab" twice in "ababab") is found by
    `_extend`, so the spans cover every occurrence, as the union of their spans."""

    def __init__(self, values: tuple[str, ...]) -> None:
        found = {f for v in values for f in forms(v)}
        self.forms = tuple(sorted(found, key=lambda f: (-len(f), f)))
        self.form_set = frozenset(found)
        # Characters a form's cut start can end on (see `Redactor.redact_end`): most outputs
        # end on a line break, which none holds, and need no look at the forms.
        self.cut_ends = frozenset(c for f in self.forms for c in f[MIN_CUT_PREFIX - 1 : -1])
        # The mirror, for text cut at its start (see `Redactor.redact_start`).
        self.cut_starts = frozenset(
            c for f in self.forms for c in f[1 : len(f) - MIN_CUT_PREFIX + 1]
        )
        self._reach = len(self.forms[0]) - 1  # how far past a match an overlapping one can end
        # Each pattern with the lines it starts (a form's first line, followed forward from a
        # match) and ends (a form's last line, followed backward).
        starts: dict[str, list[str]] = {f: [] for f in self.forms}
        ends: dict[str, list[str]] = {f: [] for f in self.forms}
        for f in self.forms:
            n = part_length(f)
            if len(f) <= n:
                continue
            first, last = first_line(f), last_line(f)
            if len(first) >= n:
                starts.setdefault(first[:n], []).append(first)
                ends.setdefault(first[:n], [])
            if len(last) >= n:
                ends.setdefault(last[-n:], []).append(last)
                starts.setdefault(last[-n:], [])
        patterns = tuple(starts)
        self._starts = tuple(tuple(starts[p]) for p in patterns)
        self._ends = tuple(tuple(ends[p]) for p in patterns)
        self._automaton = AhoCorasick(
            [_SURROGATE.sub("\ufffd", p) for p in patterns],
            matchkind=MatchKind.LeftmostLongest,
            # Builds in tens of microseconds for a few values (the DFA takes ten times more),
            # and scans as fast as the others on output.
            implementation=Implementation.ContiguousNFA,
        )
        self._pairs_setup()

    def _pairs_setup(self) -> None:
        """A second automaton for masked displays: each form's start and end anchors (half of
        `pair_need`, so one of a pair's pieces holds one), found with overlaps; and, for
        live output, each start piece by its last MIN_PAIR characters (`pair_hold`)."""
        info: dict[str, list[int]] = {}  # anchor: indexes in _pair_info
        self._pair_info: list[tuple[str, str, bool, int, int, int]] = []
        # Every start piece by its last MIN_PAIR characters, every end piece by its first.
        self._start_tails: dict[str, list[str]] = {}
        self._end_heads: dict[str, list[str]] = {}
        for f in self.forms:
            first, last = first_line(f), last_line(f)
            # A piece may be a part too (redacted alone); up to twice MAX_PART, the other one,
            # shorter, is redacted with it.
            top = min(2 * MAX_PART, len(f) - 1)
            a_max, b_max, need = min(top, len(first)), min(top, len(last)), pair_need(f)
            q = max(MIN_PAIR, -(-need // 2))
            if a_max + b_max < need:
                continue
            for is_start, anchor in ((True, first[:q]), (False, last[-q:])):
                if (a_max if is_start else b_max) >= q:
                    info.setdefault(anchor, []).append(len(self._pair_info))
                    self._pair_info.append((first, last, is_start, need, a_max, b_max))
            for a in range(MIN_PAIR, a_max + 1):
                tails = self._start_tails.setdefault(first[a - MIN_PAIR : a], [])
                if first[:a] not in tails:
                    tails.append(first[:a])
            for b in range(MIN_PAIR, b_max + 1):
                heads = self._end_heads.setdefault(last[-b:][:MIN_PAIR], [])
                if last[-b:] not in heads:
                    heads.append(last[-b:])
        anchors = tuple(info)
        self._anchor_info = tuple(tuple(info[a]) for a in anchors)
        self._anchors: tuple[AhoCorasick, AhoCorasick] | None = None
        if anchors:
            clean = [_SURROGATE.sub("\ufffd", a) for a in anchors]
            # Leftmost-longest skips ahead fast on ordinary text (overlapping search is four
            # times slower); the anchors overlapping a hit are then found in its window.
            self._anchors = (
                AhoCorasick(
                    clean,
                    matchkind=MatchKind.LeftmostLongest,
                    implementation=Implementation.ContiguousNFA,
                ),
                AhoCorasick(clean, implementation=Implementation.ContiguousNFA),
            )
            self._anchor_reach = max(map(len, anchors))

    def _pairs(
        self, text: str, covered: list[tuple[int, int]] | None = None
    ) -> list[tuple[int, int]]:
        """The spans of the pieces of every masked display of a form in `text` (a start and
        an end shown together: see MIN_PAIR), unsorted. A hit inside a span of `covered`
        (sorted, disjoint: what is redacted already, a whole value repeated) is no pair's."""
        if self._anchors is None:
            return []
        covered = covered or []
        covered_starts = [c[0] for c in covered]

        def inside(s: int, e: int) -> bool:
            i = bisect.bisect_right(covered_starts, s) - 1
            return i >= 0 and e <= covered[i][1]

        try:
            first_hits = self._anchors[0].find_matches_as_indexes(text)
        except UnicodeEncodeError:
            text = _SURROGATE.sub("\ufffd", text)
            first_hits = self._anchors[0].find_matches_as_indexes(text)
        out: list[tuple[int, int]] = []
        # A piece is tried once, from its longest hit (a hit inside it finds nothing more).
        # Hostile text (a value's start repeated) hits at every character: past this much
        # work, each hit's neighbourhood that a pair through it could cover is redacted
        # instead (more, never less).
        budget = len(text) // 16 + (1 << 19)  # in characters compared
        wide = 4 * MAX_PART + MAX_GAP  # a start piece, a gap, an end piece
        starts: dict[tuple[int, int], int] = {}  # (info, piece end): piece start
        ends: dict[tuple[int, int], int] = {}  # (info, piece start): piece end
        reach = self._anchor_reach
        for k, (_, s, e) in enumerate(first_hits):
            if covered and inside(s, e):
                continue
            budget -= 2 * reach
            if budget < 0:
                out += _coalesced(first_hits[k:], wide, reach + wide, len(text))
                break
            window = text[s : e + reach - 1]  # anchors overlapping this one
            for i, a, b in self._anchors[1].find_matches_as_indexes(window, overlapping=True):
                if s + a >= e or (covered and inside(s + a, s + b)):  # the next hit's; redacted
                    continue
                for info in self._anchor_info[i]:
                    first, last, is_start, _need, a_max, b_max = self._pair_info[info]
                    budget -= a_max + b_max
                    if is_start:
                        n = _common_prefix(text, s + a, first[: a_max + 1])
                        if n <= a_max:
                            starts.setdefault((info, s + a + n), s + a)
                    else:
                        n = _common_suffix(text, s + b, last[len(last) - b_max - 1 :])
                        if n <= b_max:
                            ends[info, s + b - n] = s + b
        return out + self._completed(text, starts, ends, budget)

    def _completed(
        self,
        text: str,
        starts: dict[tuple[int, int], int],
        ends: dict[tuple[int, int], int],
        budget: int,
    ) -> list[tuple[int, int]]:
        """The spans of the pairs the pieces found (`_pairs`) complete, within `budget`."""
        out: list[tuple[int, int]] = []
        wide = 4 * MAX_PART + MAX_GAP
        for found, is_start in ((starts, True), (ends, False)):
            for (info, at), other in found.items():
                s, e = (other, at) if is_start else (at, other)
                if budget < 0:
                    out.append((max(0, s - wide), min(len(text), e + wide)))
                    continue
                spans, cost = self._pair_at(text, s, e, self._pair_info[info])
                out += spans
                budget -= cost
        return out

    def _pair_at(
        self, text: str, s: int, e: int, info: tuple[str, str, bool, int, int, int]
    ) -> tuple[list[tuple[int, int]], int]:
        """The spans of a pair whose start piece (or end piece, as `info` says) is
        text[s:e], and how many comparisons finding it took."""
        first, last, is_start, need, _a_max, _b_max = info
        low = max(MIN_PAIR, need - (e - s))
        tries = 0
        if is_start:
            for g in _gap_ends(text, e):
                best = 0
                for piece in self._end_heads.get(text[g : g + MIN_PAIR], ()):
                    tries += len(piece)
                    if (
                        len(piece) >= max(low, best + 1)
                        and last.endswith(piece)
                        and text.startswith(piece, g)
                    ):
                        best = len(piece)
                if best:
                    return [(s, e), (g, g + best)], tries
        else:
            for g in _gap_starts(text, s):
                best = 0
                for piece in self._start_tails.get(text[max(0, g - MIN_PAIR) : g], ()):
                    tries += len(piece)
                    if (
                        len(piece) >= max(low, best + 1)
                        and first.startswith(piece)
                        and text.startswith(piece, g - len(piece))
                    ):
                        best = len(piece)
                if best:
                    return [(g - best, g), (s, e)], tries
        return [], tries

    def pair_hold(self, text: str, cut: int) -> int:
        """`cut`, or the start of a form's start piece that only marks and at most
        MAX_GAP_BREAKS line breaks separate from `cut` (its end piece may follow it)."""
        held = cut
        for g in _gap_starts(text, cut):
            for piece in self._start_tails.get(text[g - MIN_PAIR : g], ()) if g >= MIN_PAIR else ():
                if text.startswith(piece, g - len(piece)):
                    held = min(held, g - len(piece))
        if held == cut:
            return cut
        # With the text after `cut` known as far as a pair could reach, hold only for a pair
        # that is there: a start piece on every line must not hold them all.
        reach = cut + MAX_GAP + 2 * MAX_PART + 1
        if reach >= len(text):
            return held
        spans = self._pairs(text[held:reach])  # a start piece's span, then its end piece's
        at = cut - held
        return (
            held
            if any(spans[i][0] < at < spans[i + 1][1] for i in range(0, len(spans) - 1, 2))
            else cut
        )

    def _find(self, text: str) -> list[tuple[int, int, int]]:
        try:
            return self._automaton.find_matches_as_indexes(text)
        except UnicodeEncodeError:
            return self._automaton.find_matches_as_indexes(_SURROGATE.sub("\ufffd", text))

    def _widen(
        self, text: str, index: int, start: int, end: int, budget: int
    ) -> tuple[int, int, int]:
        """The span of a pattern's match widened along the forms it starts or ends, and the
        budget left (each form followed costs it); past the budget, widened as far as any
        form could reach instead (more is redacted, never less)."""
        starts, ends = self._starts[index], self._ends[index]
        if budget < 0:
            return (
                max(0, end - self._reach - 1) if ends else start,
                min(len(text), start + self._reach + 1) if starts else end,
                budget,
            )
        widened_start, widened_end = start, end
        for line in starts:
            n = _common_prefix(text, start, line)
            budget -= n + _CHUNK
            widened_end = max(widened_end, start + n)
        for line in ends:
            n = _common_suffix(text, end, line)
            budget -= n + _CHUNK
            widened_start = min(widened_start, end - n)
        return widened_start, widened_end, budget

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Spans covering every occurrence of a form, and of a start or an end of one at least
        `part_length` long, in `text`: sorted and disjoint."""
        spans: list[tuple[int, int]] = []
        # Following forms and extending spans rescans the text: at most this much of it in
        # all, so a hostile text (a value overlapping itself at every character, a value's
        # start repeated) stays linear. Past it, each match is widened by the longest a form
        # overlapping it could reach: the same occurrences covered, and some text around them.
        budget = 8 * len(text) + (1 << 20)
        for index, start, end in self._find(text):
            if spans and start < spans[-1][1] and budget >= 0:
                continue  # what starts in an extended span ends in it (`_extend`)
            start, end, budget = self._widen(text, index, start, end, budget)
            if budget < 0:
                end = min(len(text), end + self._reach)
            else:
                start, end, budget = self._extend(text, start, end, budget)
            # A span widened backward (a value's end) may reach over the spans before it.
            while spans and start < spans[-1][1]:
                start, end = min(start, spans[-1][0]), max(end, spans.pop()[1])
            spans.append((start, end))
        pairs = self._pairs(text, spans)
        if not pairs:
            return spans
        merged: list[tuple[int, int]] = []
        for start, end in sorted(spans + pairs):
            if merged and start < merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((start, end))
        return merged

    def _extend(self, text: str, start: int, end: int, budget: int) -> tuple[int, int, int]:
        """The span moved past every occurrence that starts in `text[start:end]` and ends
        after it (repeatedly, as such an occurrence may itself be overlapped); the budget
        left."""
        pos = start + 1
        while pos < end < len(text):
            hi = min(len(text), end + self._reach)
            budget -= hi - pos
            if budget < 0:
                return start, hi, budget
            first = self._find(text[pos:hi])
            if not first or pos + first[0][1] >= end:
                break
            index, a, b = first[0]
            s, e, budget = self._widen(text, index, pos + a, pos + b, budget)
            start, end = min(start, s), max(end, e)
            pos += a + 1
        return start, end, budget


@functools.lru_cache(maxsize=64)
def _cached_matcher(values: tuple[str, ...]) -> Matcher:
    return Matcher(values)


def matcher_for(values: tuple[str, ...]) -> Matcher | None:
    if not values:
        return None
    if sum(map(len, values)) * 4 <= _CACHED_FORMS_CHARS:
        return _cached_matcher(values)
    return Matcher(values)
