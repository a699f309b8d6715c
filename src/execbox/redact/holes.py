"""Holes: where `Redactor.seal` put a placeholder, kept with a keyed digest of what it
replaced, so `refill` can put a value given again back where it was."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .forms import first_line, forms, last_line, part_length

__all__ = ["Hole", "refill", "utf8"]


@dataclass(frozen=True, slots=True)
class Hole:
    """Where `Redactor.seal` put a placeholder: its offset in the sealed text, its kind, and
    the keyed digest of the UTF-8 text it replaced (enough to put a value given again back,
    and no offline test of guesses without the key)."""

    at: int
    kind: str
    digest: str
    # How many characters a start or an end of a registered value it replaced held (None for
    # a whole form or a pattern's match): refilling tries the one piece of each form that long
    # instead of every piece of every length, which costs time quadratic in the value.
    length: int | None = None


def utf8(text: str) -> bytes:
    """The UTF-8 of `text`, a lone surrogate as the byte it was decoded from."""
    return text.encode("utf-8", "surrogateescape")


def refill(
    sealed: str, holes: Iterable[Hole], values: Iterable[str], digest: Callable[[bytes], str]
) -> tuple[str, int]:
    """Put `values` back into the holes of a sealed text, each where its `digest` matches.
    Returns the text and how many holes no value fits (those keep their placeholder)."""
    # A hole may hold a value as the redactor found it: escaped (a literal in the code).
    values = tuple(values)
    by_hash = {digest(utf8(f)): f for v in values for f in forms(v)}
    with_parts = False
    parts: list[str] = []
    pos = missing = 0
    for hole in holes:
        mark = f"[REDACTED:{hole.kind}]"
        value = by_hash.get(hole.digest)
        if value is None and hole.length is not None:  # a start or an end of one this long
            value = _piece_of_length(values, hole.length, hole.digest, digest)
        if value is None and not with_parts:  # an older record's piece: any length
            by_hash.update(_part_digests(values, digest))
            with_parts = True
            value = by_hash.get(hole.digest)
        if value is None or sealed[hole.at : hole.at + len(mark)] != mark:
            missing += 1
            continue
        parts.append(sealed[pos : hole.at])
        parts.append(value)
        pos = hole.at + len(mark)
    parts.append(sealed[pos:])
    return "".join(parts), missing


def _piece_of_length(
    values: Iterable[str], length: int, want: str, digest: Callable[[bytes], str]
) -> str | None:
    """The start or end, `length` characters long, of a form of `values` whose `digest`
    is `want`; None if none is."""
    for form in {f for v in values for f in forms(v)}:
        first, last = first_line(form), last_line(form)
        for piece in (first[:length], last[len(last) - length :]):
            if len(piece) == length and digest(utf8(piece)) == want:
                return piece
    return None


# For a record sealed before holes kept their length: parts of forms longer than this are not
# offered back to its holes (their digests would cost quadratic time).
_REFILL_PART_FORM_CHARS = 4096


def _part_digests(values: Iterable[str], digest: Callable[[bytes], str]) -> dict[str, str]:
    """`digest` of every start and end of every form of `values` the redactor redacts alone."""
    out: dict[str, str] = {}
    for form in {f for v in values for f in forms(v)}:
        if len(form) > _REFILL_PART_FORM_CHARS:
            continue
        first, last = first_line(form), last_line(form)
        for k in range(part_length(form), len(form)):
            for piece in (
                first[:k] if k <= len(first) else "",
                last[len(last) - k :] if k <= len(last) else "",
            ):
                if piece:
                    out.setdefault(digest(utf8(piece)), piece)
    return out
