"""One run's network: its listener opened in the slot it got, served by the proxy, and closed
(the listener and every connection) before the slot can serve another run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .allowlist import Allowlist
from .listener import listen_in
from .proxy import Egress, EgressProxy, Interception, NetworkLimits
from .secrets import BUNDLE_NAME, BUNDLE_PATH, CA_VARS, Binding, environment

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
NO_PROXY_VARS = ("NO_PROXY", "no_proxy")


class RunEgress:
    """The network of one run with an allowlist. `open` may be called again after `close`
    (a run retried on another slot); the log gathers what every opening served."""

    def __init__(
        self,
        proxy: EgressProxy,
        entries: Sequence[str],
        limits: NetworkLimits,
        bindings: Sequence[Binding] = (),
        valid_s: float = 0.0,
    ) -> None:
        self.proxy = proxy
        self.allow = Allowlist.parse(list(entries))
        self.limits = limits
        # Bound secrets: the run's own CA, made now (its certificate goes in as a file), valid
        # for the run's `valid_s` seconds.
        self.tls: Interception | None = proxy.interception(bindings, valid_s) if bindings else None
        self.log: list[dict[str, Any]] = []
        self.limit_message: str | None = None
        self._egress: Egress | None = None

    @property
    def files(self) -> list[tuple[str, bytes]]:
        """Input files the run needs: with bound secrets, the CA bundle its clients trust."""
        if self.tls is None:
            return []
        return [(BUNDLE_NAME, self.tls.ca.bundle)]

    def open(self, pidfd: int, on_limit: Callable[[str], None]) -> dict[str, str]:
        """Listen in the network namespace of the process `pidfd` names (the slot's
        supervisor); the variables that point the run's HTTP clients at the proxy."""
        if pidfd < 0:
            raise OSError("the run slot's supervisor has no pidfd to join its namespace by")
        listener = listen_in(pidfd)
        port = listener.getsockname()[1]
        self._egress = self.proxy.open(listener, self.allow, self.limits, on_limit, self.tls)
        url = f"http://127.0.0.1:{port}"
        # An empty NO_PROXY: nothing of a caller's environment sends a name around the proxy
        # (there is no route around it anyway).
        env = {**dict.fromkeys(PROXY_VARS, url), **dict.fromkeys(NO_PROXY_VARS, "")}
        if self.tls is not None:
            env |= dict.fromkeys(CA_VARS, BUNDLE_PATH)
            env |= environment(self.tls.bindings)
        return env

    def mark(self) -> int:
        """Where the log stands now (`since` gives what came after)."""
        egress = self._egress
        return len(egress.records) if egress is not None else 0

    def since(self, mark: int, end: int | None = None) -> list[dict[str, Any]]:
        """The log's entries from `mark` to `end`, as they stand now (a session's cell)."""
        egress = self._egress
        return [r.as_dict() for r in egress.records[mark:end]] if egress is not None else []

    def limit_now(self) -> str | None:
        """The limit the network passed so far, if it did."""
        egress = self._egress
        return egress.limit_message if egress is not None else self.limit_message

    def close(self) -> None:
        """End the listener and every connection of the run (idempotent)."""
        egress, self._egress = self._egress, None
        if egress is None:
            return
        self.log += self.proxy.end(egress)
        if egress.limit_message is not None:
            self.limit_message = egress.limit_message
