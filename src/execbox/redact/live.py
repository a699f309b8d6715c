"""Redaction of live output: the bytes a run writes pass the same `Redactor` as its final result
before any callback, server-sent event or terminal sees them.

A secret may arrive split across two writes (or two reads of the pipe), so some text is held
back until it is known not to be the first part of one. What is held, and why it is enough:

* **Line by line.** Text is released up to its last line end (``\\n`` or ``\\r``; progress bars
  redraw with ``\\r``, so they stay live). No key pattern of `redact` can match across a line
  end: every character class in the table excludes ``\\r`` and ``\\n``, except the PEM private
  key rule. A registered value without a line break cannot straddle one either, nor can a
  value's start or end shown alone (`redact.part_length`: parts stop at a line break). So redacting
  line by line finds exactly what redacting the whole output finds: the concatenated live
  text equals the result's redacted stdout (or stderr), however the writes were split.
* **A PEM private key** spans lines: from its BEGIN line, text is held until a line that cannot
  belong to the key (`_closes_pem`: its END line, or any line with a character a key body
  cannot hold), so the block is redacted whole. Each line is scanned once (the state is kept
  between writes), and a block is held at most `PEM_HOLD_CHARS`: past that it is shown as one
  placeholder and its further body lines are dropped up to the line that closes it (there the
  live text redacts more than the result does, which keeps the short lines of an unclosed block).
* **A masked display across line breaks** (`redact.MIN_PAIR`: a value's start and end shown
  together, with at most two line breaks between them): a line ending in a start piece and
  marks is held, with the lines after it, until a line shows no end piece can follow (at most
  `redact.MAX_GAP` characters of marks and two more line breaks).
* **A registered value containing a line break** (or a form of one that keeps it, see
  `redact.forms`): the last ``len(value) - 1`` characters stay held, and no cut falls inside an
  occurrence. The escaped forms (repr, JSON, URL) have none: they are caught line by line.
* **Bound.** A partial line is held until its line end or the end of the run; the run's output
  cap (``limits.output_bytes``) bounds it. There is no cut inside a line: a token of any length
  (a JWT, a key) may be in progress, and a cut there could release the part before it.

Bytes split inside a UTF-8 sequence are decoded incrementally, as the final result decodes
them whole (invalid bytes become U+FFFD in both); the callbacks receive UTF-8.
"""

from __future__ import annotations

import bisect
import codecs
import re
from collections.abc import Callable

from .redactor import Redactor

__all__ = ["PEM_HOLD_CHARS", "LiveRedactor"]

# An unclosed PEM block is held at most this long (a 16384-bit RSA key is ~13 KB). Past it the
# block is redacted whole from its BEGIN marker to the line that closes it, none of it shown.
PEM_HOLD_CHARS = 64 * 1024

# The start of the PEM rule's match (`rules.RULES`, "private_key").
_PEM_BEGIN = re.compile(r"-----BEGIN[ ][A-Z0-9 ]*PRIVATE[ ]KEY(?:[ ]BLOCK)?-----")
# A character no PEM body line holds: outside the base64 alphabet and blanks. A line with a
# colon (an armour header, "Comment: ...", may hold anything) or a backslash (an escaped
# newline, "\\n", separates key lines in JSON) is taken as possibly part of a key.
_NOT_PEM_BODY = re.compile(r"[^A-Za-z0-9+/= \t]")
_PEM_END = re.compile(r"[ \t]*-----END[ ][A-Z0-9 ]*PRIVATE[ ]KEY(?:[ ]BLOCK)?-----")
_LINE_END = re.compile(r"[\r\n]")


def _closes_pem(line: str) -> bool:
    """Whether a key body cannot run through `line` (so a PEM match before it ends there)."""
    return ":" not in line and "\\" not in line and _NOT_PEM_BODY.search(line) is not None


def _last_line_end(text: str, hi: int) -> int:
    """The position just after the last ``\\n`` or ``\\r`` in ``text[:hi]``; 0 if none."""
    return max(text.rfind("\n", 0, hi), text.rfind("\r", 0, hi)) + 1


class LiveRedactor:
    """One output stream (a run's stdout, or its stderr): `write` the raw bytes as they come,
    `close` once at the end. Each releases the redacted text that is safe to show to `emit`
    (UTF-8 bytes); after `close`, everything was released, nothing held."""

    def __init__(self, redactor: Redactor, emit: Callable[[bytes], None]) -> None:
        self._redactor = redactor
        self._emit = emit
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending = ""  # text not yet released
        # Escaped forms hold no line break but the HTML one keeps the value's own.
        self._multiline = tuple(s for s in redactor.forms if "\n" in s or "\r" in s)
        self._hold = max((len(s) for s in self._multiline), default=1) - 1
        self._closed = False
        # PEM scan state, so each line is looked at once however long a block is held. Offsets
        # are in the whole stream: `_base` is where `_pending` starts in it.
        self._base = 0
        self._scanned = 0  # the complete lines before it were scanned
        self._pem: tuple[int, int] | None = None  # open block: start of its BEGIN line, marker
        self._blocks: list[tuple[int, int]] = []  # closed: (BEGIN line start, closing line start)
        self._dropping = False  # inside a block redacted whole at the cap: its lines go unseen

    def write(self, data: bytes) -> None:
        text = self._decoder.decode(data)
        if not text:
            return
        self._pending += text
        # Only a line end in the new text can move the cut: look there first (a long line
        # written in many pieces is not rescanned).
        start = len(self._pending) - len(text)
        if self._pending.find("\n", start) == -1 and self._pending.find("\r", start) == -1:
            return
        self._scan(self._base + _last_line_end(self._pending, len(self._pending)))
        cut = self._cut()
        if cut:
            released, self._pending = self._pending[:cut], self._pending[cut:]
            self._base += cut
            del self._blocks[: bisect.bisect_left(self._blocks, self._base, key=_closing)]
            self._release(released)

    def close(self) -> None:
        """Release what is held (the end of the run: no secret can continue it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        rest, self._pending = self._pending + self._decoder.decode(b"", final=True), ""
        if self._dropping:  # the last line of a block cut at the cap, unless it ends the block
            rest = _after_pem_end(rest, 0) if _closes_pem(rest) else ""
        if rest:  # the stream's end: it may stop inside a secret (see `Redactor.redact_end`)
            self._emit(self._redactor.redact_end(rest).encode())

    def _release(self, text: str) -> None:
        self._emit(self._redactor.redact(text).encode())

    def _drop(self, upto: int) -> None:
        """Forget the pending text before stream offset `upto` unseen (a capped PEM block)."""
        self._pending = self._pending[upto - self._base :]
        self._base = upto
        self._blocks.clear()

    def _scan(self, end: int) -> None:
        """Follow the PEM blocks through the complete lines up to stream offset `end`."""
        pos = max(self._scanned, self._base)
        while pos < end:
            text, base = self._pending, self._base
            if self._dropping:
                closing = _pem_closing_line(text, pos - base, end - base)
                if closing is None:
                    self._drop(end)
                    break
                self._dropping = False
                self._drop(base + _after_pem_end_at(text, closing))
                pos = self._base
                continue
            if self._pem is None:
                m = _PEM_BEGIN.search(text, pos - base, end - base)
                if m is None:
                    break
                self._pem = (base + _last_line_end(text, m.start()), base + m.start())
                pos = base + m.end()
            closing = _pem_closing_line(text, pos - base, end - base)
            if closing is None:
                break
            self._blocks.append((self._pem[0], base + closing))
            self._pem = None
            pos = base + closing  # that line ends this block; another may begin in it
        self._scanned = end
        if self._pem is not None and end - self._pem[0] > PEM_HOLD_CHARS:
            # Held this long, the block is taken as a key to its last line: shown as one
            # placeholder now, and its further body lines are not shown at all.
            marker = self._pem[1] - self._base
            self._emit(
                (self._redactor.redact(self._pending[:marker]) + "[REDACTED:private_key]").encode()
            )
            self._drop(end)
            self._pem = None
            self._dropping = True

    def _cut(self) -> int:
        """The largest position where the pending text can be released: a line end that no
        secret can straddle, whatever follows (see the module docstring); 0 if none."""
        text = self._pending
        hi = len(text) - self._hold
        if self._pem is not None:
            hi = min(hi, self._pem[0] - self._base)
        while hi > 0:
            cut = _last_line_end(text, hi)
            if cut == 0:
                return 0
            limit = min(
                self._secret_limit(text, cut),
                self._block_limit(cut),
                self._redactor.pair_hold(text, cut),
            )
            if limit >= cut:
                return cut
            hi = limit
        return 0

    def _secret_limit(self, text: str, cut: int) -> int:
        """`cut`, or the start of an occurrence of a multi-line registered value around it."""
        limit = cut
        for value in self._multiline:
            # An occurrence straddling `cut` starts within len(value) - 1 before it.
            start = text.find(value, max(0, cut - len(value) + 1), cut + len(value) - 1)
            if start != -1 and start < cut:
                limit = min(limit, start)
        return limit

    def _block_limit(self, cut: int) -> int:
        """`cut`, or the start of the BEGIN line of a closed PEM block whose closing line is
        not complete before `cut` (blocks follow each other: only one can be)."""
        at = self._base + cut
        i = bisect.bisect_left(self._blocks, at, key=_closing)
        if i < len(self._blocks) and self._blocks[i][0] < at:
            return self._blocks[i][0] - self._base
        return cut


def _closing(block: tuple[int, int]) -> int:
    return block[1]


def _after_pem_end_at(text: str, pos: int) -> int:
    """`pos`, or past a PEM END marker starting the line at `pos` (the end of a capped block)."""
    m = _PEM_END.match(text, pos)
    return m.end() if m is not None else pos


def _after_pem_end(text: str, pos: int) -> str:
    return text[_after_pem_end_at(text, pos) :]


def _pem_closing_line(text: str, pos: int, cut: int) -> int | None:
    """The start of the first complete line from `pos` (before `cut`) that a key body cannot
    run through, so a PEM match begun before `pos` ends within it; None if there is none."""
    while pos < cut:
        m = _LINE_END.search(text, pos, cut)
        if m is None:
            return None
        if _closes_pem(text[pos : m.start()]):
            return pos
        pos = m.end()
    return None
