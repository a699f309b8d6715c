"""What goes wrong on the host side of the sandbox: the sandbox itself failed, not the code."""

from __future__ import annotations


class HostError(Exception):
    """The zygote or a supervisor failed; the message says where."""


class HostRetired(HostError):
    """The host was replaced (see `ZygoteProcess.retire`) and takes no new runs or sessions:
    ask for the one that replaced it."""


class RunNotStarted(HostError):
    """The slot's staged program, or its supervisor, was gone before the program took the
    code (killed from outside): no code ran, so the request may be sent again."""
