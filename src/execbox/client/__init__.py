"""`execbox.Client` and `execbox.AsyncClient`: the HTTP API with the local Executor's methods.

    ex = execbox.Executor()                                   # local
    ex = execbox.Client("http://127.0.0.1:8000", api_key)     # remote: the same calls follow
    r = ex.run("print(1)", limits={"timeout_s": 2})           # -> RunResult, artifacts' .data set
    with ex.session() as s:
        s.run("x = 41"); s.run("x + 1").outputs

Errors come back as the same exceptions: UsageError (bad input, unknown run or session, auth),
Overloaded (quotas and back-pressure: retry later), SessionClosed, SandboxUnavailable.
Passing `on_stdout`/`on_stderr` streams the output (server-sent events) as it is written.

The names load lazily: `execbox run` reaches a local server through `client.uds` without
importing httpx or pydantic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import lazy

__all__ = [
    "AsyncClient",
    "AsyncRemoteFiles",
    "AsyncRemoteSession",
    "Client",
    "FileSource",
    "OutputCallback",
    "RemoteFiles",
    "RemoteSession",
]

_WHERE = {
    "AsyncClient": "aio",
    "AsyncRemoteFiles": "aio",
    "AsyncRemoteSession": "aio",
    "Client": "sync",
    "RemoteFiles": "sync",
    "RemoteSession": "sync",
    "FileSource": "wire",
    "OutputCallback": "wire",
}

if TYPE_CHECKING:
    from .aio import AsyncClient, AsyncRemoteFiles, AsyncRemoteSession
    from .sync import Client, RemoteFiles, RemoteSession
    from .wire import FileSource, OutputCallback


def __getattr__(name: str) -> Any:
    return lazy.attribute(__name__, _WHERE, globals(), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
