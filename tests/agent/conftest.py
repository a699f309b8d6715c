"""Fixtures of the agent tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import execbox
from execbox.agent.trace import TraceStore


@pytest.fixture
def traces(executor: execbox.Executor) -> TraceStore:
    return TraceStore(executor.store.engine)


@pytest.fixture
def no_model_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[None]:
    for name in ("EXECBOX_MODEL", "EXECBOX_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EXECBOX_AGENT_CONFIG", str(tmp_path / "absent.toml"))
    yield
