"""What a server's answer means, in the standard library only (the clients and the CLI's
fast path share it): the execbox exception of an error answer, and server-sent events."""

from __future__ import annotations

import json

from ..errors import (
    ExecboxError,
    Overloaded,
    RecordsError,
    SandboxError,
    SandboxUnavailable,
    SessionClosed,
    UsageError,
)

# Quotas, back-pressure and a server going down: retry later (Overloaded, as locally).
RETRY_LATER = {
    "overloaded",
    "rate_limited",
    "concurrency_limited",
    "session_quota",
    "server_shutting_down",
}


def error_for(status: int, body: bytes, retry_after: str | None = None) -> ExecboxError:
    """The execbox exception for an error answer: its HTTP status, body and Retry-After."""
    try:
        detail = json.loads(body)["error"]
        code, message = str(detail["code"]), str(detail["message"])
    except (ValueError, KeyError, TypeError):
        code, message = f"http_{status}", body.decode("utf-8", "replace")[:500]
    text = f"{message} [{code}, HTTP {status}]"
    if code == "session_closed":
        return SessionClosed(text)
    if code in RETRY_LATER:
        return Overloaded(text + (f"; retry after {retry_after} s" if retry_after else ""))
    if code in ("sandbox_unavailable", "not_ready"):
        return SandboxUnavailable(text)
    if code == "records_error":
        return RecordsError(text)
    if status < 500:
        return UsageError(text)
    return SandboxError(text)


def stream_error(data: str) -> ExecboxError:
    """The exception for a stream's `error` event (its data carries the HTTP status)."""
    try:
        status = int(json.loads(data).get("status", 500))
    except (ValueError, AttributeError, TypeError):
        status = 500
    return error_for(status, data.encode())


class Events:
    """Server-sent events parser: feed lines, get (event, data) at each blank line."""

    def __init__(self) -> None:
        self.name, self.data = "message", []  # type: tuple[str, list[str]]

    def feed(self, line: str) -> tuple[str, str] | None:
        if not line:
            if not self.data:
                return None
            done = (self.name, "\n".join(self.data))
            self.name, self.data = "message", []
            return done
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            self.name = value
        elif field == "data":
            self.data.append(value)
        return None
