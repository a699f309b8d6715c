"""`execbox.Client` and `execbox.AsyncClient`: the HTTP API with the local Executor's methods.

    ex = execbox.Executor()                                   # local
    ex = execbox.Client("http://127.0.0.1:8000", api_key)     # remote: the same calls follow
    r = ex.run("print(1)", limits={"timeout_s": 2})           # -> RunResult, artifacts' .data set
    with ex.session() as s:
        s.run("x = 41"); s.run("x + 1").outputs

Errors come back as the same exceptions: UsageError (bad input, unknown run or session, auth),
Overloaded (quotas and back-pressure: retry later), SessionClosed, SandboxUnavailable.
Passing `on_stdout`/`on_stderr` streams the output (server-sent events) as it is written.
"""

from __future__ import annotations

from .aio import AsyncClient, AsyncRemoteFiles, AsyncRemoteSession
from .sync import Client, RemoteFiles, RemoteSession
from .wire import FileSource, OutputCallback

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
