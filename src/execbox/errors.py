"""Exceptions raised at the caller: what went wrong for the caller or the host.

What the untrusted code did is never an exception: it is a `status` and an `error` on the result.
"""

from __future__ import annotations


class ExecboxError(Exception):
    """Base of every exception execbox raises."""


class UsageError(ExecboxError):
    """The caller asked for something invalid (bad limits, a missing file, a closed executor)."""


class SandboxUnavailable(ExecboxError):
    """This host cannot isolate a run (no root, no namespaces, no cgroups, no runtime image).

    execbox never falls back to running code unsandboxed; `execbox doctor` says what is missing.
    """


class SandboxError(ExecboxError):
    """The sandbox itself failed while running code (execbox's fault, never the code's)."""


class RecordsError(ExecboxError):
    """Run records could not be written to the records database (the log names the runs).

    Records are committed after their results return (within ~50 ms), so this is raised by
    the first run to start after the failure (before its code runs) or by close; a record
    written before its result returns (input files, artifacts, after close) raises it
    there."""


class Overloaded(ExecboxError):
    """Too many runs are waiting for this executor; try again later (back-pressure)."""


class SessionClosed(ExecboxError):
    """The session has ended (closed, expired, or killed by a limit); the message says why.

    Every call on an ended session raises this; start a new session to go on."""
