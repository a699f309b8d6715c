"""What the E2B tests share: a real `execbox serve --e2b` on loopback, over an executor and a
run store of its own (the server shares its sessions among the active keys, and other
modules' keys in a shared store would each be owed a share), and fresh keys on it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import execbox
from execbox.server import Settings, create_app
from execbox.server.background import serving
from execbox.server.state import ServerState

MAX_REQUEST_BYTES = 1 << 20


class E2BServer:
    def __init__(self, url: str, state: ServerState) -> None:
        self.url, self.state = url, state

    def key(self, prefix: str = "e2b", max_sessions: int = 6) -> tuple[str, str]:
        """A fresh tenant: (name, key)."""
        assert self.state.keys is not None
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        return name, self.state.keys.create(name, max_sessions=max_sessions)

    def revoke(self, name: str) -> None:
        """No longer owed a share of the server's sessions (a key revoked already is fine)."""
        assert self.state.keys is not None
        try:
            self.state.keys.revoke(name)
        except execbox.UsageError:
            pass

    def runs_of(self, tenant: str) -> int:
        assert self.state.keys is not None
        return self.state.keys.count_runs(tenant)


@contextmanager
def e2b_serving(
    tmp_path_factory: pytest.TempPathFactory, **settings: object
) -> Iterator[tuple[str, ServerState]]:
    """(url, state) of a server with the E2B face on, these `Settings` over the defaults here."""
    records = tmp_path_factory.mktemp("e2b") / "runs.db"
    chosen: dict[str, object] = {
        "e2b": True,
        "session_starts_per_key": 4,
        "session_starts_per_s": 100.0,
        "max_request_bytes": MAX_REQUEST_BYTES,
        **settings,
    }
    with execbox.Executor(cache=False, records=f"sqlite:///{records}") as own:
        app = create_app(own, Settings(**chosen))  # type: ignore[arg-type]
        with serving(app) as url:
            yield url, app.state.execbox


def use_sdk(monkeypatch: pytest.MonkeyPatch, url: str, key: str) -> None:
    """The SDK's environment: all a team changes to move from E2B to execbox."""
    monkeypatch.setenv("E2B_API_URL", url + "/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", url + "/e2b")
    monkeypatch.setenv("E2B_API_KEY", key)
