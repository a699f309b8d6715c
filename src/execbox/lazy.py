"""Names a package exports but imports only when first asked for (`execbox`, `execbox.client`
and `execbox.agent` keep their start cheap this way)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def attribute(package: str, where: Mapping[str, str], namespace: dict[str, Any], name: str) -> Any:
    """`package`'s `name`, imported from its module in `where` and kept in `namespace`."""
    module = where.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", package), name)
    namespace[name] = value
    return value
