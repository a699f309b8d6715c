"""Secret redaction: scrub credentials from text before it is stored, logged or returned.

Applied to stdout, stderr, error messages and tracebacks. Two sources of secrets:

* **Known formats**, a table of regular expressions (`rules`).
* **Registered values**: exact strings the caller passes (`Redactor(secrets)`), matched anywhere,
  also inside longer words, in the escaped forms a program shows them in, and as a start or an
  end of one shown alone or together (`forms`), all in one pass of one automaton (`matcher`).

Redaction defends against a secret shown by accident. It does not stop code that sets out to
leak one: a piece from the middle, an encoding (base64, reversed, spaced) or an escape of an
escape is not recognised.

Each secret becomes ``[REDACTED:<kind>]`` (`redactor`); `holes` puts values given again back
into a sealed text, and `live` redacts output as it streams, line by line.
"""

from __future__ import annotations

from .forms import MAX_GAP, MAX_PART, MIN_PAIR, MIN_PART, forms, pair_need, part_length
from .holes import Hole, refill
from .redactor import DEFAULT, MIN_SECRET_LEN, Finding, Redactor, checked_secrets

__all__ = [
    "DEFAULT",
    "MAX_GAP",
    "MAX_PART",
    "MIN_PAIR",
    "MIN_PART",
    "MIN_SECRET_LEN",
    "Finding",
    "Hole",
    "Redactor",
    "checked_secrets",
    "forms",
    "pair_need",
    "part_length",
    "refill",
]
