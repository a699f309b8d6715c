"""execbox's HTTP API (FastAPI on uvicorn). `create_app` and `Settings` load lazily, so the
`execbox` command starts without importing the web stack; `execbox serve` and `execbox keys`
live in `server.cli`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Settings", "create_app"]

if TYPE_CHECKING:
    from .app import create_app
    from .state import Settings


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    if name == "Settings":
        from .state import Settings

        return Settings
    raise AttributeError(f"module 'execbox.server' has no attribute {name!r}")
