"""The OpenAI Agents SDK and smolagents plugs are optional: the one-box path never imports
their frameworks."""

from __future__ import annotations

from pathlib import Path

from .conftest import modules_the_one_box_path_imports


def test_the_one_box_path_never_imports_the_agents_sdk_or_smolagents(tmp_path: Path) -> None:
    assert modules_the_one_box_path_imports(tmp_path, "agents", "smolagents") == []
