"""A tree's manifest (`manifest.json`): what it was built from and what it holds. `build`
writes it once; what is remade from the tree later (its C parts, its filesystem file, the list
of its modules for a tree built before that was recorded) amends it in place, atomically."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

FILE = "manifest.json"


def read(root: Path) -> dict[str, object]:
    """The manifest of the tree at `root`."""
    data: dict[str, object] = json.loads((root / FILE).read_text())
    return data


def write(root: Path, data: Mapping[str, object]) -> None:
    write_atomic(root / FILE, json.dumps(data, indent=2) + "\n")


def write_atomic(path: Path, text: str) -> None:
    """Readers see the old text or the new, never part of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
