"""Where execbox keeps its state (runtime images, records, keys, the server's socket): a module
of its own so that `execbox run` finds a running server without importing the image code."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """The execbox home: `EXECBOX_HOME`, else `$XDG_DATA_HOME/execbox` (default
    ~/.local/share/execbox)."""
    explicit = os.environ.get("EXECBOX_HOME")
    if explicit:
        return Path(explicit)
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "execbox"
