"""Labels of printed Python and JSON values: the strings and keys a number sits under in a
value printed on one line ("[('East', 143)]"), over several (json.dumps(indent=2), pprint),
or apart, as parallel arrays ("['East' 'West']" then "[143  98]": position i labels i).

Read conservatively: a value is read only when it parses and its numbers are exactly the
numbers its lines show, in order; arrays only when they have the same length. What is not
clear gives no labels. The cost is linear in the output: a value longer than `MAX_LITERAL`
characters is not parsed.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field

from .quantities import Found, numbers_in

MAX_LITERAL = 20_000  # characters of a printed value parsed for its labels; longer: not read
_ARRAYS_APART = 50  # lines after a list of names that a list of numbers may follow at

Labelled = tuple[str, str, Found, str]  # label, kind ("row", "key"), number, where
_Leaf = tuple[float, list[tuple[str, str]]]  # a number and its labels (label, kind)

# "['East' 'West']", "names = ['East', 'West']", "Index(['East', 'West'], dtype='object')",
# "array([143,  98])", "units: [143, 98]": one flat list, perhaps named or wrapped.
_ARRAY = re.compile(
    r"\s*(?:[A-Za-z_][\w.]*\s*[:=]\s*)?(?:[A-Za-z_][\w.]*\()?\s*\[(?P<body>[^\[\]]*)\]"
    r"(?:\s*,\s*(?:dtype|name|length)=[^()]*)?\)?\s*,?\s*"
)
_STRING = re.compile(r"""'([^'\n]*)'|"([^"\n]*)\"""")


def literal_labels(text: str, found: list[Found], where: str) -> list[Labelled]:
    """A value printed on one line: in [('East', 143)], {'East': {'units': 143}} and
    [{'name': 'East', 'units': 143}] the strings beside a number and the keys above it."""
    return _labelled(text.strip().rstrip(","), [(f, where) for f in found])


def _labelled(body: str, found: list[tuple[Found, str]]) -> list[Labelled]:
    if len(body) > MAX_LITERAL or body[:1] not in ("(", "[", "{"):
        return []
    try:
        value = ast.literal_eval(body)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        try:
            value = json.loads(body)
        except (ValueError, RecursionError):
            return []
    leaves: list[_Leaf] = []
    try:
        _walk(value, [], leaves)
    except RecursionError:
        return []
    if len(leaves) != len(found) or any(
        v != f.value for (v, _), (f, _) in zip(leaves, found, strict=True)
    ):
        return []  # numbers inside strings, or spelled otherwise: the shape is not clear
    return [
        (label, kind, f, where)
        for (_, labels), (f, where) in zip(leaves, found, strict=True)
        for label, kind in labels
    ]


def _walk(node: object, labels: list[tuple[str, str]], leaves: list[_Leaf]) -> None:
    """The numbers under `node` in printed order, each with the labels above it."""
    if isinstance(node, bool) or node is None or isinstance(node, str):
        return
    if isinstance(node, int | float):
        leaves.append((float(node), labels))
    elif isinstance(node, dict):
        # A record names itself by its text fields: {"name": "East", "units": 143}.
        names = [(v, "row") for v in node.values() if isinstance(v, str)]
        for key, child in node.items():
            if isinstance(key, int | float) and not isinstance(key, bool):
                leaves.append((float(key), labels))
            mine = [(key, "key" if isinstance(child, int | float) else "row")]
            _walk(child, labels + names + (mine if isinstance(key, str) else []), leaves)
    elif isinstance(node, list | tuple | set):
        items = list(node)
        # A pair: ('East', 143) labels its numbers by its text.
        lead = items[0] if isinstance(node, tuple) and items else None
        mine = [(lead, "row")] if isinstance(lead, str) else []
        for child in items:
            _walk(child, labels + mine, leaves)


def _depth(text: str) -> int:
    """How many brackets `text` leaves open, those in quotes not counted."""
    depth = 0
    for m in re.finditer(r"""'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"|[\[{(]|[\]})]""", text):
        token = m[0]
        if token in "[{(":
            depth += 1
        elif token in "]})":
            depth -= 1
    return depth


@dataclass
class Reader:
    """Reads an output's lines in order for values printed over several lines."""

    _open: list[tuple[str, str]] = field(default_factory=list)  # a value's lines so far
    _depth: int = 0
    _size: int = 0
    _names: list[str] = field(default_factory=list)  # the last list of names printed
    _since: int = 0  # lists read since then

    @property
    def reading(self) -> bool:
        """Whether a value is open: its next lines must be read whatever they hold."""
        return bool(self._open)

    def read(self, text: str, where: str) -> list[Labelled]:
        """The labels the value `text` (a line, its dates blanked) closes or completes; a line
        that neither opens a value nor holds a list may be left unread."""
        out: list[Labelled] = []
        if self._open or text.lstrip()[:1] in ("{", "["):
            out += self._multiline(text, where)
        if self._names:
            self._since += 1
            if self._since > _ARRAYS_APART:
                self._names = []
        if "[" in text:
            out += self._arrays(text, where)
        return out

    def _multiline(self, text: str, where: str) -> list[Labelled]:
        """json.dumps(indent=2) and pprint: a value opened on a line of its own start."""
        depth = _depth(text)
        if not self._open:
            if depth <= 0:
                return []  # a value on one line: `literal_labels` reads it
            self._depth, self._size = 0, 0
        self._open.append((text, where))
        self._depth += depth
        self._size += len(text) + 1
        if self._size > MAX_LITERAL or self._depth < 0:
            self._open = []
            return []
        if self._depth > 0:
            return []
        lines, self._open = self._open, []
        found = [(f, w) for line, w in lines for f in numbers_in(line)]
        return _labelled("\n".join(line for line, _ in lines).strip().rstrip(","), found)

    def _arrays(self, text: str, where: str) -> list[Labelled]:
        """A list of names, then a list of as many numbers: the i-th name labels the i-th."""
        array = _ARRAY.fullmatch(text)
        if array is None:
            return []
        body = array["body"]
        names = [a or b for a, b in _STRING.findall(body)]
        if names and not _STRING.sub("", body).strip(" \t,"):
            self._names, self._since = names, 0
            return []
        if len(self._names) < 2:
            return []
        cells = [c for c in re.split(r"[\s,]+", body.strip()) if c]
        found = [f for c in cells for f in numbers_in(c) if (f.start, f.end) == (0, len(c))]
        if len(found) != len(cells) or len(found) != len(self._names):
            return []  # a percentage, a string among them, another length: not read
        return [(name, "row", f, where) for name, f in zip(self._names, found, strict=True)]
