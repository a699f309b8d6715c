"""What a registered value looks like when a program shows it: its escaped forms, and how
much of a form's start or end, shown alone or in a pair, counts as the value.

A value is matched in the forms a program shows it in (`forms`): Python's repr and ascii() of a
str or bytes, JSON (ASCII-only or not), URL-encoding and HTML; and a form's start or end shown
alone, from `part_length` characters (half the form, within MIN_PART and MAX_PART), whatever
follows or precedes it: displays cut values short with many marks (``...``, ``[...]``,
``[truncated]``, ``(more)``) or none (a slice, a column, a wrap), so no list of marks is
complete; and a start and an end of a form shown together, each shorter than that (a masked
display, `key[:6] + '...' + key[-6:]`: see MIN_PAIR).
"""

from __future__ import annotations

import html
import json
import re
from urllib.parse import quote, quote_plus

__all__ = [
    "GAP_CHARS",
    "LINE_BREAK",
    "MAX_GAP",
    "MAX_GAP_BREAKS",
    "MAX_PART",
    "MIN_CUT_PREFIX",
    "MIN_PAIR",
    "MIN_PART",
    "first_line",
    "forms",
    "last_line",
    "node_forms",
    "pair_need",
    "part_length",
    "shell_forms",
]

MIN_CUT_PREFIX = 3  # a cut secret's start this long or longer is redacted (see `redact_end`)
# A value's start or end shown without the rest (a display cut it short, with any mark or
# none; a slice; a wrap) is redacted from half its length, never from less than MIN_PART
# characters (a shorter run of a word-like value is ordinary text) and always from MAX_PART
# (that much of a long key is a leak however long the rest is). See `part_length`.
MIN_PART = 8
MAX_PART = 16
# A masked display (`key[:6] + '...' + key[-6:]`) shows a start and an end of a value, each
# shorter than its part, close together: such a pair is redacted when the two cover half the
# form (`pair_need`), each from MIN_PAIR characters, with at most MAX_GAP characters of marks,
# blanks, punctuation and at most MAX_GAP_BREAKS line breaks between them (`GAP_CHARS`).
MIN_PAIR = 3
MAX_GAP = 12
MAX_GAP_BREAKS = 2
GAP_CHARS = frozenset(" \t\r\n.\u2026*\u00b7\u2022#-_~/|[](){}<>,;:'\"`")
LINE_BREAK = re.compile("[\r\n]")


def forms(value: str) -> tuple[str, ...]:
    """The texts `value` becomes when a program shows it, `value` first, each once: inside a
    Python str or bytes literal (repr and ascii(), with a quote escaped or not: repr escapes
    ' only when the whole string holds both quotes), in JSON (`json.dumps`, ASCII-only or
    not), URL-encoded (`quote`, with and without '/' kept, and `quote_plus`), HTML-escaped
    (quotes too, or only & < > as in a DataFrame's text/html), as Node's `util.inspect` and
    bash quote it (`node_forms`, `shell_forms`), and those of each line of a multi-line value
    from MIN_PART characters. Escapes of escapes (the JSON of a repr) are
    not among them."""
    out = [
        value,
        repr(value)[1:-1],
        repr('"' + value)[2:-1],
        ascii(value)[1:-1],
        ascii('"' + value)[2:-1],
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        html.escape(value),
        html.escape(value, quote=False),
    ]
    out += node_forms(value)
    # Each line of a multi-line value (a PEM key) on its own: Node's util.inspect shows such a
    # string inside an object as one quoted piece per line, joined by ` +` and a line break.
    if LINE_BREAK.search(value):
        for line in LINE_BREAK.split(value):
            if len(line) >= MIN_PART:
                out += forms(line)
    try:
        raw = value.encode()
    except UnicodeEncodeError:  # a lone surrogate has no UTF-8: no bytes, URL or shell form
        return tuple(dict.fromkeys(out))
    out += [
        repr(raw)[2:-1],
        repr(b'"' + raw)[3:-1],
        quote(raw, safe=""),
        quote(raw),
        quote_plus(raw),
        *shell_forms(value),
    ]
    return tuple(dict.fromkeys(out))


# Node's util.inspect (console.log of an object) escapes these by name, other control
# characters and lone surrogates as \xNN and \uNNNN in upper case (Python's repr: \x08,
# \x0c, lower case).
_NODE_NAMED = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r", "\\": "\\\\"}
_NODE_ESCAPED = re.compile(r"[\x00-\x1f\\\x7f-\x9f\ud800-\udfff]")


def _node_escape(c: str) -> str:
    return _NODE_NAMED.get(c) or (f"\\x{ord(c):02X}" if ord(c) < 0x100 else f"\\u{ord(c):04X}")


def node_forms(value: str) -> tuple[str, ...]:
    """`value` inside the quotes of Node's `util.inspect`: ' escaped (a value holding every
    quote kind) or not (inspect picks a quote the value lacks)."""
    shown = _NODE_ESCAPED.sub(lambda m: _node_escape(m[0]), value)
    return (shown, shown.replace("'", "\\'"))


# What bash's printf %q escapes with a backslash anywhere (~ and # only at the start).
_SHELL_BACKSLASHED = re.compile(r"""[ \t\n'"\\|&;()<>!{}*\[\]?^$`,]|^[~#]""")
_SHELL_DOUBLE = re.compile(r'["\\$`]')
# bash's $'...': these by name, printable ASCII as it is, other bytes in octal.
_ANSI_C_NAMED = dict(zip("\x1b\x07\x0b\x08\x0c\n\r\t\\'", "Eavbfnrt\\'", strict=True))
_ANSI_C_ESCAPED = re.compile(r"[^\x20-\x26\x28-\x5b\x5d-\x7e]")


def shell_forms(value: str) -> tuple[str, ...]:
    """`value` as bash quotes it: `printf %q` (backslashes), `${v@Q}`, `set -x` and `set`
    (single quotes, ' as '\\''), `declare -p` (double quotes) and $'...' (any of them, for a
    value with a control character or, in the C locale a run has, any non-ASCII one; in a
    UTF-8 locale a printable non-ASCII character stays as it is)."""
    return (
        _SHELL_BACKSLASHED.sub(lambda m: "\\" + m[0], value),
        value.replace("'", "'\\''"),
        _SHELL_DOUBLE.sub(lambda m: "\\" + m[0], value),
        _ANSI_C_ESCAPED.sub(lambda m: _ansi_c(m[0], utf8=False), value),
        _ANSI_C_ESCAPED.sub(lambda m: _ansi_c(m[0], utf8=True), value),
    )


def _ansi_c(c: str, *, utf8: bool) -> str:
    """Character `c` inside bash's $'...': by name, or its UTF-8 bytes in octal (a printable
    non-ASCII character as it is in a UTF-8 locale)."""
    if c in _ANSI_C_NAMED:
        return "\\" + _ANSI_C_NAMED[c]
    if utf8 and ord(c) > 0x7F and c.isprintable():
        return c
    return "".join(f"\\{b:03o}" for b in c.encode())


def part_length(form: str) -> int:
    """How long a start or an end of `form` shown alone must be to be redacted: half of it,
    within MIN_PART and MAX_PART (a form no longer than that has no part but itself)."""
    return max(MIN_PART, min(len(form) // 2, MAX_PART))


def pair_need(form: str) -> int:
    """How many characters a start and an end of `form` shown together (`MIN_PAIR`) must
    cover between them to be redacted: half of it, never more than MAX_PART."""
    return max(2 * MIN_PAIR, min(len(form) // 2, MAX_PART))


def last_line(text: str) -> str:
    """`text` from its last line break on."""
    return text[max(text.rfind("\n"), text.rfind("\r")) + 1 :]


def first_line(text: str) -> str:
    """`text` up to its first line break."""
    return LINE_BREAK.split(text, maxsplit=1)[0]
