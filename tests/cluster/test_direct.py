"""The direct channel between a caller and a node's host (`execbox.cluster.direct`), on
loopback without a cluster: only a peer with the token is served, frames of every size come
back whole, a call never hangs past its timeout or its channel's end, and a late answer is
never read as the next call's."""

from __future__ import annotations

import os
import pickle
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from execbox.cluster import direct
from execbox.cluster.backend import DIRECT_ENV, direct_wanted
from execbox.cluster.direct import (
    MAX_HELLOS,
    TOKEN_BYTES,
    ChannelBroken,
    Client,
    Listener,
    send_frame,
)
from execbox.cluster.host import NodeHost
from tests.cluster.conftest import MakesADirectory
from tests.conftest import _host_can_sandbox, sandbox_missing

pytestmark = pytest.mark.timeout(60)

Serve = Callable[[Callable[[bytes], bytes]], tuple[Listener, Client]]


@pytest.fixture
def serve() -> Iterator[Serve]:
    made: list[tuple[Listener, Client]] = []

    def start(handle: Callable[[bytes], bytes]) -> tuple[Listener, Client]:
        listener = Listener("127.0.0.1", handle)
        client = Client(listener.address, listener.token)
        made.append((listener, client))
        return listener, client

    yield start
    for listener, client in made:
        client.close()
        listener.close()


def test_a_peer_without_the_token_is_never_served(serve: Serve, tmp_path: Path) -> None:
    seen: list[bytes] = []

    def handle(frame: bytes) -> bytes:
        seen.append(frame)
        pickle.loads(frame)
        return b"ok"

    listener, _ = serve(handle)
    target = tmp_path / "unpickled"
    for hello in (b"\0" * TOKEN_BYTES, listener.token[:-1] + b"\0", b"short"):
        with socket.create_connection(listener.address, timeout=10) as sock:
            sock.sendall(hello)
            try:
                send_frame(sock, pickle.dumps(MakesADirectory(target)))
                assert sock.recv(100) == b"", "the listener answered a peer without its token"
            except (
                ConnectionResetError,
                BrokenPipeError,
            ):  # closed before it read the frame: refused all the same
                pass
    assert seen == [] and not target.exists()


def test_frames_of_every_size_come_back_whole(serve: Serve) -> None:
    _, client = serve(lambda frame: frame[::-1])
    for size in (0, 1, 65536 - 8, 65536 - 7, 65536, 3 << 20, 12 << 20):
        payload = os.urandom(size)
        assert client.call(payload, 30) == payload[::-1], size


def test_callers_in_parallel_each_get_their_own_answer(serve: Serve) -> None:
    def handle(frame: bytes) -> bytes:
        time.sleep(0.01)
        return b"re:" + frame

    _, client = serve(handle)
    wrong: list[tuple[bytes, bytes]] = []

    def caller(n: int) -> None:
        for i in range(20):
            asked = f"{n}-{i}".encode()
            got = client.call(asked, 30)
            if got != b"re:" + asked:
                wrong.append((asked, got))

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert wrong == []


def test_a_late_answer_is_not_read_as_the_next_calls(serve: Serve) -> None:
    def handle(frame: bytes) -> bytes:
        if frame == b"slow":
            time.sleep(1.0)
        return frame

    _, client = serve(handle)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        client.call(b"slow", 0.2)
    assert time.monotonic() - t0 < 0.9
    assert client.call(b"next", 10) == b"next"
    time.sleep(1.0)  # the slow answer has been sent by now, to a connection that is gone
    assert client.call(b"after", 10) == b"after"


def test_closing_either_end_ends_a_call_in_flight(serve: Serve) -> None:
    release = threading.Event()

    def handle(frame: bytes) -> bytes:
        release.wait(30)
        return frame

    for close_listener in (False, True):
        listener, client = serve(handle)
        errors: list[BaseException] = []

        def call(client: Client = client, errors: list[BaseException] = errors) -> None:
            try:
                client.call(b"x", 60)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=call)
        thread.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        (listener if close_listener else client).close()
        thread.join(10)
        assert not thread.is_alive() and time.monotonic() - t0 < 5
        assert len(errors) == 1 and isinstance(errors[0], ChannelBroken), errors
        with pytest.raises(ChannelBroken):
            client.call(b"y", 5)
    release.set()


def test_ray_client_callers_go_direct_only_when_told() -> None:
    assert direct_wanted("10.0.0.5:6379", {}) and direct_wanted("auto", {})
    assert not direct_wanted("ray://head:10001", {})
    assert direct_wanted("ray://head:10001", {DIRECT_ENV: "1"})
    assert not direct_wanted("auto", {DIRECT_ENV: "0"})
    assert direct_wanted("auto", {DIRECT_ENV: "yes please"})  # not a setting: the default


def test_a_closed_listener_leaves_no_thread_behind(serve: Serve) -> None:
    before = set(threading.enumerate())
    listener, client = serve(lambda frame: frame)
    assert client.call(b"x", 10) == b"x"
    ours = [t for t in set(threading.enumerate()) - before if t.name.startswith("execbox-direct")]
    assert len(ours) == 2  # the accept loop and the one connection's
    client.close()
    listener.close()
    for thread in ours:
        thread.join(5)
        assert not thread.is_alive(), thread.name


def test_a_peer_dribbling_bytes_is_cut_off_at_the_hello_time(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(direct, "HELLO_S", 1.0)
    listener, client = serve(lambda frame: frame)
    with socket.create_connection(listener.address, timeout=10) as sock:
        t0 = time.monotonic()
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            for _ in range(TOKEN_BYTES - 1):  # a byte well within each read's own timeout
                sock.sendall(b"\0")
                time.sleep(0.25)
        held = time.monotonic() - t0
    assert held < 3.0, f"a peer without the token held its connection {held:.1f} s"
    assert client.call(b"x", 10) == b"x"


def test_strangers_get_a_bounded_number_of_threads_and_crowd_no_caller_out(
    serve: Serve,
) -> None:
    listener, client = serve(lambda frame: b"re:" + frame)
    strangers = []
    try:
        for _ in range(150):  # silent: they never send the token, and stay
            strangers.append(socket.create_connection(listener.address, timeout=10))
        time.sleep(0.5)
        serving = [t for t in threading.enumerate() if t.name == "execbox-direct-conn"]
        assert len(serving) <= MAX_HELLOS, f"{len(serving)} threads for strangers"
        t0 = time.monotonic()
        assert client.call(b"in", 20) == b"re:in"
        # Not after the strangers' hello time: they are ended to make room for it.
        assert time.monotonic() - t0 < direct.HELLO_S - 1
    finally:
        for sock in strangers:
            sock.close()


def test_a_thread_that_cannot_start_refuses_one_peer_not_every_later_one(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed: list[str] = []

    class Scarce(threading.Thread):
        def start(self) -> None:
            if self.name == "execbox-direct-conn" and not failed:
                failed.append(self.name)
                raise RuntimeError("can't start new thread")
            super().start()

    monkeypatch.setattr(threading, "Thread", Scarce)  # the one direct.py starts
    listener, client = serve(lambda frame: frame)
    with pytest.raises(ChannelBroken):
        client.call(b"first", 10)
    assert failed
    assert client.call(b"second", 10) == b"second"


@pytest.mark.parametrize("tls", ["", "1", "true"])
def test_a_host_opens_no_direct_port_when_ray_uses_tls(
    tls: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ray's calls would be encrypted, the direct channel would not: token and secrets in clear.
    reason = _host_can_sandbox()
    if reason:
        sandbox_missing(reason)
    monkeypatch.setenv("RAY_USE_TLS", tls)
    host = NodeHost("node-a", {"pool_size": 1}, "127.0.0.1")
    try:
        kind, facts = host.ready("caller")
        assert kind == "ok", facts
        assert (facts["direct"] is None) == bool(tls)
    finally:
        host.close()
