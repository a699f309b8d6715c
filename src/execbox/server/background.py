"""Running the app under uvicorn: `Server` (used by `execbox serve`) and `serving`, which
serves an app on a background thread for tests, notebooks and benchmarks in one process.

    with serving(create_app(executor)) as url:
        execbox.Client(url, key).run("print(1)")
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from .guard import guarded_protocol

# Longer than clients' pool expiry (httpx: 5 s, uvicorn's default too): the client, not the
# server, must drop an idle connection, or a request sent as the server closes it is lost.
KEEP_ALIVE_S = 30.0


class Server(uvicorn.Server):
    """uvicorn's server, telling the app when shutdown begins, so runs still going when the
    grace period (`timeout_graceful_shutdown`) ends answer `server_shutting_down` instead of
    having their connections cut."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        # Run once the sockets are closed: uvicorn re-raises SIGTERM after shutdown, so code
        # after `run()` never runs when a signal stopped the server.
        self.after_shutdown: list[Callable[[], None]] = []

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        state = getattr(getattr(self.config.app, "state", None), "execbox", None)
        if state is not None:
            state.begin_drain(self.config.timeout_graceful_shutdown)
        try:
            await super().shutdown(sockets=sockets)
        finally:
            for step in self.after_shutdown:
                step()


def config(app: Any, **options: Any) -> uvicorn.Config:
    """uvicorn's settings for `app`: with an execbox app, its connection guard (header and
    body timeouts, connections per client, the listen backlog) from the app's Settings."""
    state = getattr(getattr(app, "state", None), "execbox", None)
    if state is not None:
        settings = state.settings
        options["http"] = guarded_protocol(
            settings.header_timeout_s, settings.body_timeout_s, settings.max_connections_per_client
        )
        options["backlog"] = settings.listen_backlog
    options.setdefault("timeout_keep_alive", KEEP_ALIVE_S)
    return uvicorn.Config(app, **options)


@contextmanager
def serving(
    app: Any, *, host: str = "127.0.0.1", port: int = 0, startup_timeout_s: float = 60.0
) -> Iterator[str]:
    """Run `app` under uvicorn on a thread; yield its base URL; stop it (lifespan shutdown
    included) and join the thread on exit. `port=0` picks a free port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    server = Server(config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=30))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="execbox-server", daemon=True
    )
    thread.start()
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the server failed to start (see its log)")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start within {startup_timeout_s:g} s")
            time.sleep(0.01)
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()
