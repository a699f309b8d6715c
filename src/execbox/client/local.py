"""`execbox run` through a running server: which server, and the run sent to it.

The server is the one named by `--server` or `EXECBOX_SERVER` (a `unix:PATH` socket, or an
`http(s)://` URL whose key comes from `EXECBOX_API_KEY` or the file `EXECBOX_API_KEY_FILE`
names); failing to reach it is an error. Without one, the local socket of an `execbox serve`
using the same execbox home is used when it exists; if nothing answers there the run happens
in this process, as it would without a server. `EXECBOX_SERVER=none` always runs in-process.
A socket, found or named, is sent a run only when its file and the server answering on it are
this user's (or root's): the run carries its code and its secrets, and whoever can write where
the socket lives could otherwise listen there in the server's place. Nor is a key sent in the
clear: an `http://` server off this machine is refused unless the caller accepts it.

Finding the server imports nothing heavy: a run on the socket goes through `client.uds`.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import SandboxUnavailable, UsageError
from ..server.local import default_socket_path

if TYPE_CHECKING:
    from ..contract import RunRequest, RunResult

SERVER_ENV = "EXECBOX_SERVER"
KEY_ENV = "EXECBOX_API_KEY"
KEY_FILE_ENV = "EXECBOX_API_KEY_FILE"
NO_SERVER = "none"
PLAIN_HTTP_FLAG = "allow-plain-http-key"
# Time for the answer beyond the run's own wall limit: queueing, artifacts, the records.
ANSWER_MARGIN_S = 120.0


class Target(NamedTuple):
    """A server to send runs to."""

    name: str  # as the user knows it: unix:PATH or the URL
    base_url: str
    socket: Path | None
    key: str | None
    explicit: bool  # asked for: not reaching it is an error, never a silent in-process run


class Unreachable(SandboxUnavailable):
    """Nothing answered at the server: the run was not sent."""


def find_server(explicit: str | None, *, plain_http: bool = False) -> Target | None:
    """The server `execbox run` should use, or None to run in-process. `plain_http`: send a
    key to an `http://` server that is not on loopback (refused otherwise)."""
    spec = explicit if explicit is not None else os.environ.get(SERVER_ENV, "")
    if spec == NO_SERVER:
        return None
    if spec:
        return _parse(spec, plain_http)
    path = default_socket_path()
    try:
        found = stat.S_ISSOCK(path.lstat().st_mode)
    except OSError:
        found = False
    if not found:
        return None
    return Target(f"unix:{path}", "http://execbox", path, None, explicit=False)


def answers(target: Target) -> bool:
    """Whether a server accepts connections on the target's socket (a file left by a server
    that died does not): checked before a discovered server is sent a run, so a run is never
    both sent and then run again in-process."""
    if target.socket is None:
        return True
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(os.fspath(target.socket))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def foreign(path: Path) -> str | None:
    """Why the socket at `path` is not this user's own server (its file or the process that
    answers on it belongs to another user), or None when it is, or when nothing answers."""
    mine = (os.geteuid(), 0)
    try:
        owner = path.lstat().st_uid
    except OSError:
        return None
    if owner not in mine:
        return f"the socket {path} belongs to uid {owner}, not to this user"
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(os.fspath(path))
        creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    finally:
        probe.close()
    _pid, uid, _gid = struct.unpack("3i", creds)
    if uid not in mine:
        return f"the server on {path} runs as uid {uid}, not as this user"
    return None


def _parse(spec: str, plain_http: bool) -> Target:
    if spec.startswith("unix:"):
        path = Path(spec.removeprefix("unix:"))
        if not path.is_absolute():
            raise UsageError(f"--server {spec}: give unix:/ABSOLUTE/PATH")
        return Target(spec, "http://execbox", path, None, explicit=True)
    if spec.startswith(("http://", "https://")):
        key = _key()
        if key is not None and spec.startswith("http://") and not plain_http:
            _refuse_key_in_the_clear(spec)
        return Target(spec, spec.rstrip("/"), None, key, explicit=True)
    raise UsageError(
        f"--server {spec!r}: give unix:/PATH/serve.sock, http(s)://HOST:PORT, or {NO_SERVER}"
    )


def _refuse_key_in_the_clear(url: str) -> None:
    """UsageError unless `url`'s host is this machine's loopback: anyone on the path to any
    other host reads a key sent over plain HTTP, and can then run code as its tenant."""
    import ipaddress
    from urllib.parse import urlsplit

    try:
        host = urlsplit(url).hostname or ""
    except ValueError as exc:
        raise UsageError(f"--server {url!r}: {exc}") from exc
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise UsageError(
            f"--server {url}: the API key would cross the network unencrypted; use "
            f"https://, a loopback address, or --{PLAIN_HTTP_FLAG} to send it anyway"
        )


def _key() -> str | None:
    key = os.environ.get(KEY_ENV)
    if key:
        return key
    key_file = os.environ.get(KEY_FILE_ENV)
    if not key_file:
        return None
    try:
        key = Path(key_file).read_text().strip()
    except OSError as exc:
        raise UsageError(f"{KEY_FILE_ENV}: cannot read {key_file}: {exc}") from exc
    if not key:
        raise UsageError(f"{KEY_FILE_ENV}: {key_file} is empty")
    return key


def run_on(
    target: Target,
    request: RunRequest,
    *,
    cache: bool | None,
    secrets: Iterable[str],
    bound_secrets: list[dict[str, Any]],
    on_stdout: Callable[[bytes], None] | None,
    on_stderr: Callable[[bytes], None] | None,
) -> RunResult:
    """Run `request` on the server; its artifacts carry their bytes. Unreachable when the
    server could not be reached; other failures raise the client's ExecboxError."""
    import httpx

    from .sync import Client

    transport = httpx.HTTPTransport(uds=os.fspath(target.socket)) if target.socket else None
    timeout = request.limits.timeout_s + ANSWER_MARGIN_S
    with Client(target.base_url, target.key, timeout_s=timeout, transport=transport) as client:
        try:
            return client.run(
                request.code,
                language=request.language,
                stdin=request.stdin,
                files={f.name: f.data for f in request.files},
                limits=request.limits,
                env=request.env,
                profile=request.profile,
                environment=request.environment,
                cache=cache,
                secrets=secrets,
                network=request.network,
                bound_secrets=bound_secrets,
                on_stdout=on_stdout,
                on_stderr=on_stderr,
            )
        except SandboxUnavailable as exc:
            if isinstance(exc.__cause__, httpx.ConnectError):
                raise Unreachable(
                    f"cannot reach the execbox server at {target.name}: {exc.__cause__}"
                ) from exc
            raise


def choose(explicit: str | None, *, plain_http: bool = False) -> Target | None:
    """The server for a run, or None to run it in this process (saying why on stderr when
    a server was found but cannot take it)."""
    target = find_server(explicit, plain_http=plain_http)
    if target is None:
        return None
    # A socket carries no key: only a server of this user's would run it, so another user's
    # is sent nothing, named or found.
    why = foreign(target.socket) if target.socket is not None else None
    if why and target.explicit:
        raise UsageError(f"--server {target.name}: {why}; the run is not sent there")
    if why:
        _note(f"{why}; it is not sent this run, which runs in this process")
        return None
    if target.explicit or answers(target):
        return target
    _note(f"no execbox serve answers at {target.name}; running in this process")
    return None


def _note(text: str) -> None:
    import click

    click.echo(f"[execbox] {text}", err=True)
