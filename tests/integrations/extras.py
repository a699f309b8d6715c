"""The frameworks are optional extras: their tests skip when one is not installed, unless
EXECBOX_REQUIRE_INTEGRATIONS is set (CI installs `.[integrations]` and sets it), where a
missing framework is a failure, never a silent skip."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def requires(module: str) -> ModuleType:
    if os.environ.get("EXECBOX_REQUIRE_INTEGRATIONS"):
        return importlib.import_module(module)
    found: ModuleType = pytest.importorskip(
        module, reason=f"{module} is not installed: pip install -e '.[integrations]'"
    )
    return found
