"""The Redactor: which secrets a text holds (registered values and known formats), and the
text with each replaced by ``[REDACTED:<kind>]``; the text around it (header names,
``https://user:``, ``?token=``) stays, so output remains readable and diffable."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..contract import check_secrets
from ..errors import UsageError
from .forms import MIN_CUT_PREFIX
from .holes import Hole, utf8
from .matcher import matcher_for
from .rules import PLACEHOLDER, REGISTERED, RULES, SCREEN_MAX, SHORTEST, lower_same_length, screen

__all__ = ["DEFAULT", "MIN_SECRET_LEN", "Finding", "Redactor", "checked_secrets"]

# Registered values shorter than this are skipped, silently. A 1-3 character value ("1", "ab",
# "yes") occurs by chance all over ordinary output: redacting every occurrence would shred the
# output, and the pattern of redaction marks would itself reveal the value. Such a value is not
# a secret worth the name; callers register real credentials.
MIN_SECRET_LEN = 4


@dataclass(frozen=True, slots=True)
class Finding:
    """One secret in a text: its kind and its span ``text[start:end]``."""

    kind: str
    start: int
    end: int


def _subtract(
    spans: list[tuple[int, int, int, str]], holes: list[tuple[int, int]]
) -> list[tuple[int, int, int, str]]:
    """`spans` with the parts inside `holes` (sorted, disjoint) removed."""
    out: list[tuple[int, int, int, str]] = []
    for start, end, prio, kind in spans:
        for h_start, h_end in holes:
            if h_end <= start or h_start >= end:
                continue
            if h_start > start:
                out.append((start, h_start, prio, kind))
            start = max(start, h_end)
            if start >= end:
                break
        if start < end:
            out.append((start, end, prio, kind))
    return out


class Redactor:
    """Finds and replaces secrets in text. Immutable and thread-safe; build once, reuse."""

    def __init__(self, secrets: Iterable[str] = (), *, patterns: bool = True) -> None:
        """`secrets`: exact values to redact wherever they occur (also inside longer strings).
        `patterns=False`: only those, not the known formats.

        Values shorter than `MIN_SECRET_LEN` characters are skipped without a warning (see
        `MIN_SECRET_LEN` for why).
        """
        kept = {s for s in secrets if len(s) >= MIN_SECRET_LEN}
        self._secrets: tuple[str, ...] = tuple(sorted(kept, key=lambda s: (-len(s), s)))
        self._matcher = matcher_for(self._secrets)  # None without registered values: no cost
        self._rules = RULES if patterns else ()

    @property
    def secrets(self) -> tuple[str, ...]:
        """The registered values (those long enough to be kept), longest first."""
        return self._secrets

    @property
    def forms(self) -> tuple[str, ...]:
        """Every text redacted as a registered value: each value and its escaped `forms`,
        longest first."""
        return self._matcher.forms if self._matcher is not None else ()

    def with_secrets(self, more: Iterable[str]) -> Redactor:
        """A Redactor that also redacts the values in `more` (this one when there are none:
        it is immutable)."""
        more = tuple(more)
        return Redactor((*self._secrets, *more), patterns=bool(self._rules)) if more else self

    def registered_only(self) -> Redactor:
        """A Redactor for the same registered values and no known formats."""
        return Redactor(self._secrets, patterns=False)

    # Complex on purpose: one pass of the automaton, whole values and parts, within one budget.
    def findings(self, text: str) -> list[Finding]:  # noqa: C901
        """The secrets in `text`, sorted, non-overlapping (overlapping hits merged)."""
        if not text:
            return []
        raw: list[tuple[int, int, int, str]] = []  # (start, end, priority, kind)
        if self._matcher is not None:
            raw.extend((s, e, 0, REGISTERED) for s, e in self._matcher.spans(text))
        lowered: str | None = None
        rules = self._rules
        if rules and len(text) <= SCREEN_MAX:
            if len(text) < SHORTEST:  # every rule's match is longer (a short output)
                rules = ()
            else:
                lowered = lower_same_length(text)
                if not screen(text, lowered):
                    rules = ()
        for prio, rule in enumerate(rules, start=1):
            if rule.min_len > len(text):
                continue
            if rule.lowered:
                if lowered is None:
                    lowered = lower_same_length(text)
                subject = lowered
            else:
                subject = text
            for m in rule.pattern.finditer(subject):
                start, end = m.span()
                for g in rule.groups:
                    if m.start(g) != -1:
                        start, end = m.span(g)
                        break
                if end > start:
                    raw.append((start, end, prio, rule.kind))
        if not raw:
            return []
        if "[REDACTED:" in text:
            raw = _subtract(raw, [m.span() for m in PLACEHOLDER.finditer(text)])
        raw.sort(key=lambda f: (f[0], -f[1], f[2]))
        merged: list[Finding] = []
        for start, end, _prio, kind in raw:
            if merged and start < merged[-1].end:
                last = merged[-1]
                if end > last.end:
                    merged[-1] = Finding(last.kind, last.start, end)
                continue
            merged.append(Finding(kind, start, end))
        return merged

    def redact(self, text: str) -> str:
        """`text` with every secret replaced by ``[REDACTED:<kind>]``.

        Registered values become ``[REDACTED:secret]``. Idempotent: redacting the result again
        changes nothing.
        """
        found = self.findings(text)
        if not found:
            return text
        parts: list[str] = []
        pos = 0
        for f in found:
            parts.append(text[pos : f.start])
            parts.append(f"[REDACTED:{f.kind}]")
            pos = f.end
        parts.append(text[pos:])
        return "".join(parts)

    def pair_hold(self, text: str, cut: int) -> int:
        """`cut`, or where text released up to `cut` must stop: the start of a registered
        value's start piece that an end piece after `cut` could complete (a masked display
        across a line break, see MIN_PAIR)."""
        return self._matcher.pair_hold(text, cut) if self._matcher is not None else cut

    def redact_end(self, text: str) -> str:
        """`redact(text)` for text that ends a stream: an output cut at its cap (or a program
        ending mid-write) may end with the start of a registered secret, which no longer
        matches it whole; that start is redacted too, from MIN_CUT_PREFIX characters on."""
        text = self.redact(text)
        if self._matcher is None or not text or text[-1] not in self._matcher.cut_ends:
            return text
        cut = max(_cut_start(text, form) for form in self._matcher.forms)
        return text[:-cut] + "[REDACTED:secret]" if cut else text

    def redact_start(self, text: str) -> str:
        """`redact(text)` for text cut at its start (the kept tail of a traceback): it may
        begin with the end of a registered secret, which is redacted too, from MIN_CUT_PREFIX
        characters on. For text cut in the middle, apply this to the part after the cut and
        `redact_end` to the part before it."""
        text = self.redact(text)
        if self._matcher is None or not text or text[0] not in self._matcher.cut_starts:
            return text
        cut = max(_cut_end(text, form) for form in self._matcher.forms)
        return "[REDACTED:secret]" + text[cut:] if cut else text

    def seal(self, text: str, digest: Callable[[bytes], str]) -> tuple[str, list[Hole]]:
        """`redact(text)`, and a `Hole` for each placeholder it wrote (none: `text` itself),
        with `digest` of the UTF-8 of what it replaced."""
        found = self.findings(text)
        if not found:
            return text, []
        parts: list[str] = []
        holes: list[Hole] = []
        pos = at = 0
        for f in found:
            parts.append(text[pos : f.start])
            at += f.start - pos
            mark = f"[REDACTED:{f.kind}]"
            parts.append(mark)
            piece = text[f.start : f.end]
            whole = f.kind != REGISTERED or self._matcher is None or piece in self._matcher.form_set
            holes.append(Hole(at, f.kind, digest(utf8(piece)), None if whole else len(piece)))
            at += len(mark)
            pos = f.end
        parts.append(text[pos:])
        return "".join(parts), holes


def _cut_start(text: str, value: str) -> int:
    """The longest k, at least MIN_CUT_PREFIX and less than len(value), with `text` ending in
    `value[:k]`; 0 if none. Only the last len(value) - 1 characters are looked at."""
    tail = text[max(0, len(text) - len(value) + 1) :] if len(value) > 1 else ""
    head = value[:MIN_CUT_PREFIX]
    at = tail.find(head)
    while at != -1:
        if value.startswith(tail[at:]):
            return len(tail) - at
        at = tail.find(head, at + 1)
    return 0


def _cut_end(text: str, value: str) -> int:
    """The longest k, at least MIN_CUT_PREFIX and less than len(value), with `text` starting
    with `value[-k:]`; 0 if none. Only the first len(value) - 1 characters are looked at."""
    head = text[: len(value) - 1]
    tail = value[-MIN_CUT_PREFIX:] if len(value) > MIN_CUT_PREFIX else ""
    at = head.rfind(tail) if tail else -1
    while at != -1:
        end = at + MIN_CUT_PREFIX
        if value.endswith(head[:end]):
            return end
        at = head.rfind(tail, 0, end - 1)
    return 0


def checked_secrets(secrets: Iterable[str]) -> tuple[str, ...]:
    """The secrets one request registers, within the caps of `contract.check_secrets` (a
    flood of values would cost every result), else UsageError naming the cap."""
    try:
        return check_secrets(secrets)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


DEFAULT = Redactor()
