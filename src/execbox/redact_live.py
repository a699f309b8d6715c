"""Redaction of live output: the bytes a run writes pass the same `Redactor` as its final result
before any callback, server-sent event or terminal sees them.

A secret may arrive split across two writes (or two reads of the pipe), so some text is held
back until it is known not to be the first part of one. What is held, and why it is enough:

* **Line by line.** Text is released up to its last line end (``\\n`` or ``\\r``; progress bars
  redraw with ``\\r``, so they stay live). No key pattern of `redact` can match across a line
  end: every character class in the table excludes ``\\r`` and ``\\n``, except the PEM private
  key rule. A registered value without a line break cannot straddle one either. So redacting
  line by line finds exactly what redacting the whole output finds: the concatenated live
  text equals the result's redacted stdout (or stderr), however the writes were split.
* **A PEM private key** spans lines: from its BEGIN line, text is held until a line that cannot
  belong to the key (`_closes_pem`: its END line, or any line with a character a key body
  cannot hold), so the block is redacted whole.
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

import codecs
import re
from collections.abc import Callable

from .redact import Redactor

__all__ = ["LiveRedactor"]

# The start of the PEM rule's match (redact.py `_RULES`, "private_key").
_PEM_BEGIN = re.compile(r"-----BEGIN[ ][A-Z0-9 ]*PRIVATE[ ]KEY(?:[ ]BLOCK)?-----")
# A character no PEM body line holds: outside the base64 alphabet and blanks. A line with a
# colon (an armour header, "Comment: ...", may hold anything) or a backslash (an escaped
# newline, "\\n", separates key lines in JSON) is taken as possibly part of a key.
_NOT_PEM_BODY = re.compile(r"[^A-Za-z0-9+/= \t]")


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
        cut = self._cut()
        if cut:
            released, self._pending = self._pending[:cut], self._pending[cut:]
            self._release(released)

    def close(self) -> None:
        """Release what is held (the end of the run: no secret can continue it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        rest, self._pending = self._pending + self._decoder.decode(b"", final=True), ""
        if rest:  # the stream's end: it may stop inside a secret (see `Redactor.redact_end`)
            self._emit(self._redactor.redact_end(rest).encode())

    def _release(self, text: str) -> None:
        self._emit(self._redactor.redact(text).encode())

    def _cut(self) -> int:
        """The largest position where the pending text can be released: a line end that no
        secret can straddle, whatever follows (see the module docstring); 0 if none."""
        text = self._pending
        hi = len(text) - self._hold
        while hi > 0:
            cut = _last_line_end(text, hi)
            if cut == 0:
                return 0
            limit = min(self._secret_limit(text, cut), self._pem_limit(text, cut))
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

    def _pem_limit(self, text: str, cut: int) -> int:
        """`cut`, or the start of the line of a PEM block that may still go on past it."""
        pos = 0
        while (m := _PEM_BEGIN.search(text, pos, cut)) is not None:
            closing = _pem_closing_line(text, m.end(), cut)
            if closing is None:
                return _last_line_end(text, m.start())
            pos = closing  # that line ends this block; another may begin in it
        return cut


def _pem_closing_line(text: str, pos: int, cut: int) -> int | None:
    """The start of the first complete line from `pos` (before `cut`) that a key body cannot
    run through, so a PEM match begun before `pos` ends within it; None if there is none."""
    while pos < cut:
        ends = [i for i in (text.find("\n", pos, cut), text.find("\r", pos, cut)) if i != -1]
        if not ends:
            return None
        end = min(ends)
        if _closes_pem(text[pos:end]):
            return pos
        pos = end + 1
    return None
