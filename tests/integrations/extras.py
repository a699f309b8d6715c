"""The frameworks are optional extras: their tests skip when one is not installed, unless
EXECBOX_REQUIRE_INTEGRATIONS is set (CI installs `.[integrations]` and sets it), where a
missing framework is a failure, never a silent skip."""

from __future__ import annotations

import importlib
import os
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path
from types import ModuleType

import pytest


def requires(module: str) -> ModuleType:
    if os.environ.get("EXECBOX_REQUIRE_INTEGRATIONS"):
        return importlib.import_module(module)
    found: ModuleType = pytest.importorskip(
        module, reason=f"{module} is not installed: pip install -e '.[integrations]'"
    )
    return found


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "integrations"


def example(name: str) -> ModuleType:
    """One of examples/integrations, loaded as a module."""
    spec = spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
