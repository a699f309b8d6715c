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


@pytest.fixture(scope="module", autouse=True)
def _close_the_model_library_event_loop() -> Iterator[None]:
    """pydantic-ai's run_sync keeps an event loop in the main thread (reused across calls);
    close it after each module, so its sockets are not left for the garbage collector (which
    the suite treats as an error) and a later module starts a fresh one."""
    yield
    import asyncio
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            loop = asyncio.get_event_loop_policy().get_event_loop()
        except RuntimeError:
            return
    if not loop.is_running() and not loop.is_closed():
        loop.close()
