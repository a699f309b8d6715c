"""execbox: run the code AI agents write, isolated, limited, and with evidence.

    >>> import execbox
    >>> execbox.run("print(6 * 7)").stdout
    '42\\n'

The public names load lazily, so the sandbox's fork server can import `execbox.sandbox` inside
the runtime image without execbox's own dependencies (pydantic, click) installed there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import lazy

__version__ = "0.1.0"

__all__ = [
    "Artifact",
    "AsyncClient",
    "BoundSecret",
    "Cancel",
    "Client",
    "ErrorInfo",
    "Executor",
    "ExecboxError",
    "InputFile",
    "Limits",
    "Metrics",
    "NetworkConnection",
    "Output",
    "Overloaded",
    "RecordsError",
    "RunRequest",
    "RunResult",
    "SandboxError",
    "SandboxUnavailable",
    "Session",
    "SessionClosed",
    "Status",
    "UsageError",
    "run",
]

_WHERE = {
    "Artifact": "contract",
    "AsyncClient": "client",
    "BoundSecret": "contract",
    "Client": "client",
    "ErrorInfo": "contract",
    "InputFile": "contract",
    "Limits": "contract",
    "Metrics": "contract",
    "NetworkConnection": "contract",
    "Output": "contract",
    "RunRequest": "contract",
    "RunResult": "contract",
    "Status": "contract",
    "Executor": "executor",
    "Cancel": "cancel",
    "run": "executor",
    "ExecboxError": "errors",
    "Overloaded": "errors",
    "RecordsError": "errors",
    "SandboxError": "errors",
    "SandboxUnavailable": "errors",
    "UsageError": "errors",
    "SessionClosed": "errors",
    "Session": "sessions",
}

if TYPE_CHECKING:
    from .cancel import Cancel
    from .client import AsyncClient, Client
    from .contract import (
        Artifact,
        BoundSecret,
        ErrorInfo,
        InputFile,
        Limits,
        Metrics,
        NetworkConnection,
        Output,
        RunRequest,
        RunResult,
        Status,
    )
    from .errors import (
        ExecboxError,
        Overloaded,
        RecordsError,
        SandboxError,
        SandboxUnavailable,
        SessionClosed,
        UsageError,
    )
    from .executor import Executor, run
    from .sessions import Session


def __getattr__(name: str) -> Any:
    return lazy.attribute(__name__, _WHERE, globals(), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
