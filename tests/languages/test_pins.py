"""Node and bash are pinned: their version and sha256 are part of the image digest, and a
machine without a usable Node says so instead of failing in the sandbox."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from execbox import image
from execbox.sandbox.inside import interpreters


@pytest.fixture
def fake_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory the jail's interpreter search looks in first, and a home of its own."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("EXECBOX_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(interpreters, "SEARCH", (str(bin_dir), *interpreters.SEARCH))
    image.interpreter_problem.cache_clear()
    yield bin_dir
    image.interpreter_problem.cache_clear()


def _fake_node(bin_dir: Path, version: str) -> None:
    node = bin_dir / "node"
    node.write_text(f"#!/bin/sh\necho {version}\n")
    node.chmod(0o755)


def test_another_node_is_another_image_digest(fake_bin: Path) -> None:
    _fake_node(fake_bin, "v22.1.0")
    first = image.image_digest("tree")
    assert image.interpreter_pins()["node"]["version"] == "v22.1.0"  # type: ignore[index]
    _fake_node(fake_bin, "v22.2.0")  # same size, other bytes
    assert image.image_digest("tree") != first
    assert image.image_digest("tree") == image.image_digest("tree")


def test_an_old_node_is_refused_with_the_reason(fake_bin: Path) -> None:
    _fake_node(fake_bin, "v18.19.0")
    problem = image.interpreter_problem("javascript")
    assert problem is not None and "Node.js 20 or newer" in problem and "v18.19.0" in problem
    assert image.interpreter_problem("python") is None


def test_the_machines_node_is_usable() -> None:
    image.interpreter_problem.cache_clear()
    assert image.interpreter_problem("javascript") is None
    assert image.interpreter_problem("bash") is None
