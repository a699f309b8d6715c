"""A syntax tree's nodes in one list, parent before children: the policy's walk over the code,
iterative (deep code cannot exhaust the stack) and skipping the fields that hold no nodes."""

from __future__ import annotations

import ast
import functools
import re
from typing import Any

__all__ = ["tree_nodes"]


# ASDL types of fields that never hold a node to look into: names, constants, and the
# context and operator singletons.
_LEAF_TYPES = frozenset(
    {
        "identifier",
        "string",
        "constant",
        "int",
        "expr_context",
        "operator",
        "boolop",
        "unaryop",
        "cmpop",
        "type_ignore",
    }
)


@functools.cache
def _child_fields(cls: Any) -> tuple[str, ...]:
    """The fields of node class `cls` that may hold nodes, from its ASDL signature
    (`Name(identifier id, expr_context ctx)`); every field when the signature is unreadable."""
    if not issubclass(cls, ast.AST):
        return ()
    match = re.fullmatch(r"\w+\((.*)\)", (cls.__doc__ or "").strip(), re.DOTALL)
    if match is None:
        return tuple(cls._fields)
    types = {}
    for declaration in filter(None, (d.strip() for d in match.group(1).split(","))):
        kind, _, name = declaration.rpartition(" ")
        types[name] = kind.rstrip("*?")
    return tuple(f for f in cls._fields if types.get(f) not in _LEAF_TYPES)


def tree_nodes(tree: ast.AST) -> list[Any]:
    """The nodes of `tree`, each parent before its children, as `ast.walk` yields them but
    without the context and operator singletons, and faster (docs/PERFORMANCE.md): it skips
    the fields that hold names and constants. The list may also hold None (the key of a `**`
    entry in a dict display)."""
    found: list[Any] = [tree]
    for node in found:  # the list grows as it is read
        for name in _child_fields(node.__class__):
            value = getattr(node, name, None)
            if value.__class__ is list:
                found += value
            elif value is not None:
                found.append(value)
    return found
