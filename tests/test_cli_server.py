"""`execbox run` through a running `execbox serve`: the same answer as a run in the CLI's own
process, found on the server's local socket without a key, and never a silent in-process run
when a server was asked for. A real server process, the real sandbox, the real CLI."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from execbox.contract import RunResult
from execbox.errors import UsageError
from execbox.image import home
from execbox.records import RunStore
from execbox.server.auth import KeyStore
from execbox.server.local import SocketTaken, bind_local_socket

EXECBOX = [sys.executable, "-m", "execbox.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Served:
    def __init__(self, sock: Path, port: int, proc: subprocess.Popen[bytes]) -> None:
        self.sock, self.port, self.proc = sock, port, proc
        self.url = f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def _serving(*options: str) -> Iterator[Served]:
    """`execbox serve` in its own process, its local socket in a home of its own (a directory
    others may pass through, so that only the socket's own mode keeps them out)."""
    where = Path(tempfile.mkdtemp(prefix="execbox-served-"))
    where.chmod(0o711)
    sock, log = where / "serve.sock", where / "serve.log"
    port = _free_port()
    with log.open("wb") as log_file:
        proc = subprocess.Popen(
            [
                *EXECBOX,
                "serve",
                "--port",
                str(port),
                "--socket",
                str(sock),
                "--max-concurrency",
                "2",
                "--pool-size",
                "1",
                "--log-level",
                "warning",
                *options,
            ],
            stdout=subprocess.DEVNULL,
            stderr=log_file,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not get ready"
            time.sleep(0.2)
        yield Served(sock, port, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)
        left = sock.exists()
        shutil.rmtree(where)
    assert not left, "the server left its socket file behind"


@pytest.fixture(scope="module")
def served(executor: Any) -> Iterator[Served]:
    with _serving() as server:
        yield server


def _cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Any:
    return subprocess.run(
        [*EXECBOX, *args],
        capture_output=True,
        timeout=180,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


# What differs between any two runs: ids, timings, memory, the start-cost hint.
_VARYING = re.compile(rb"(run|wall|cpu|mem)=[0-9a-f.]+(ms|MiB)?")


def _plain(proc: Any) -> tuple[int, bytes, list[bytes]]:
    lines = [
        _VARYING.sub(rb"\1=*", line)
        for line in proc.stderr.splitlines()
        if b"[execbox] this command took" not in line
    ]
    return proc.returncode, proc.stdout, lines


def _json(proc: Any) -> dict[str, Any]:
    if proc.returncode == 2:  # a usage error: no result
        return {"exit": 2, "stdout": proc.stdout, "stderr": proc.stderr}
    assert proc.stdout.count(b"\n") == 1, proc.stdout
    # The one line the full path prints: the result as the contract's model writes it.
    assert (
        proc.stdout == RunResult.model_validate_json(proc.stdout).model_dump_json().encode() + b"\n"
    )
    result: dict[str, Any] = json.loads(proc.stdout)
    for varying in ("run_id", "metrics", "created_at", "image_digest", "duration_ms"):
        result.pop(varying, None)
    return {"exit": proc.returncode, **result}


CASES = {
    "ok": ("print('hello'); import sys; print('to err', file=sys.stderr)", []),
    "error": ("print('before')\nraise ValueError('boom')", []),
    "timeout": ("print('spin', flush=True)\nwhile True: pass", ["--timeout", "1"]),
    "artifacts": (
        "import os\nos.makedirs('out', exist_ok=True)\n"
        "open('out/a.txt', 'w').write('alpha')\nopen('b.bin', 'wb').write(bytes(range(256)))",
        [],
    ),
    "stdin": ("import sys; data = sys.stdin.read(); print(len(data), data.upper())", []),
    "input": ("print(open('/workspace/data.csv').read().count(','))", []),
    "env": ("import os; print(os.environ['GREETING'], 'é', '\\u2603')", ["--env", "GREETING=hé"]),
    # The profile's own default limits (60 s here), not Limits' defaults (5 s).
    "profile": ("print('extended')", ["--profile", "extended"]),
    # Refused by the server as invalid (422): the CLI says what it says without a server.
    "invalid": ("print(1)", ["--timeout", "-1"]),
    "bad-env": ("print(1)", ["--env", "NOEQUALS"]),
    "missing-input": ("print(1)", ["--input", "/nonexistent/x.csv"]),
    # Not plain UTF-8: decoded as CPython would, on the full path.
    "cookie": ("# -*- coding: latin-1 -*-\nprint('caf\xe9')", []),
    "undecodable": ("print('\udcff')", []),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_server_run_answers_as_an_in_process_run(served: Served, case: str, tmp_path: Path) -> None:
    code, extra = CASES[case]
    program = tmp_path / "prog.py"
    program.write_bytes(
        code.encode("latin-1")
        if case == "cookie"
        else code.encode("utf-8", "surrogateescape" if case == "undecodable" else "strict")
    )
    if case == "stdin":
        (tmp_path / "in.txt").write_text("some input\n")
        extra = [*extra, "--stdin", str(tmp_path / "in.txt")]
    if case == "input":
        (tmp_path / "d.csv").write_text("a,b,c\n1,2,3\n")
        extra = [*extra, "--input", f"{tmp_path / 'd.csv'}:data.csv"]
    answers = {}
    for where, server in (("here", "none"), ("served", f"unix:{served.sock}")):
        arts = tmp_path / "arts"
        shutil.rmtree(arts, ignore_errors=True)
        plain = _cli(
            "run",
            str(program),
            "--no-cache",
            "--server",
            server,
            "--artifacts-dir",
            str(arts),
            *extra,
        )
        as_json = _cli("run", str(program), "--no-cache", "--server", server, "--json", *extra)
        files = (
            {str(p.relative_to(arts)): p.read_bytes() for p in arts.rglob("*") if p.is_file()}
            if arts.exists()
            else {}
        )
        answers[where] = (_plain(plain), _json(as_json), files)
    assert answers["served"] == answers["here"]
    plain, result, files = answers["served"]
    if case in ("invalid", "bad-env", "missing-input"):
        assert plain[0] == result["exit"] == 2 and not plain[1], plain
        return
    expected_exit = (
        0 if case in ("ok", "artifacts", "stdin", "input", "env", "cookie", "profile") else 1
    )
    assert plain[0] == result["exit"] == expected_exit, plain
    if case == "artifacts":
        assert files == {"out/a.txt": b"alpha", "b.bin": bytes(range(256))}
    if case == "timeout":
        assert result["status"] == "timeout"
    if case == "stdin":
        assert plain[1] == b"11 SOME INPUT\n\n"
    if case == "env":
        assert plain[1] == "hé é \u2603\n".encode()
    if case == "cookie":
        assert plain[1] == "café\n".encode()
    if case == "profile":
        assert result["limits"]["timeout_s"] == 60
    if case == "undecodable":
        assert result["status"] == "error" and result["error"]["type"] == "SyntaxError"


# Modules a CLI run through a local server has no need of: each costs more than Python's start.
HEAVY = ("pydantic", "httpx", "sqlalchemy", "fastapi", "execbox.contract", "execbox.executor")


def test_a_served_run_imports_neither_httpx_nor_pydantic(served: Served, tmp_path: Path) -> None:
    program = tmp_path / "p.py"
    program.write_text("print('light')")
    importing = [sys.executable, "-X", "importtime", "-m", "execbox.cli", "run", str(program)]
    proc = subprocess.run(
        [*importing, "--server", f"unix:{served.sock}"], capture_output=True, timeout=60
    )
    assert (proc.returncode, proc.stdout) == (0, b"light\n"), proc.stderr
    imported = _imported(proc.stderr)
    assert not {m for m in imported if m.split(".")[0] in HEAVY or m in HEAVY}, imported
    # Control: the same command without the server imports them.
    here = subprocess.run([*importing, "--server", "none"], capture_output=True, timeout=180)
    assert here.returncode == 0, here.stderr
    assert {"pydantic", "execbox.contract"} <= _imported(here.stderr)


def _imported(importtime: bytes) -> set[str]:
    """The modules a `python -X importtime` run's stderr says it imported."""
    return {
        line.split(b"|")[-1].strip().decode()
        for line in importtime.splitlines()
        if line.startswith(b"import time:")
    }


def test_discovers_the_socket_in_the_execbox_home_without_a_key(
    served: Served, tmp_path: Path
) -> None:
    """The CLI's home has no runtime image: only the server can have run this."""
    cli_home = served.sock.parent
    program = tmp_path / "p.py"
    program.write_text("print(6 * 7)")
    env = {"EXECBOX_HOME": str(cli_home), "EXECBOX_SERVER": "", "EXECBOX_API_KEY": ""}
    proc = _cli("run", str(program), env=env)
    assert (proc.returncode, proc.stdout) == (0, b"42\n"), proc.stderr
    # Control: the same home without the server's socket cannot run it at all.
    proc = _cli("run", str(program), env={**env, "EXECBOX_SERVER": "none"})
    assert proc.returncode == 2, proc.stderr


def test_a_stale_socket_runs_in_process_and_says_so(tmp_path: Path) -> None:
    cli_home = tmp_path / "home"
    cli_home.mkdir()
    (cli_home / "envs").symlink_to(home() / "envs")  # the runtime image, for the in-process run
    stale = bind_local_socket(cli_home / "serve.sock")
    stale.close()  # the file stays; nothing listens
    program = tmp_path / "p.py"
    program.write_text("print('here')")
    proc = _cli("run", str(program), env={"EXECBOX_HOME": str(cli_home), "EXECBOX_SERVER": ""})
    assert (proc.returncode, proc.stdout) == (0, b"here\n"), proc.stderr
    assert b"no execbox serve answers at unix:" in proc.stderr


def _listen_as_nobody(sock: Path, heard: Path) -> int:
    """A child process listening on `sock` (a file this user made) as uid nobody, appending
    every byte it is sent to `heard`: another user's server in the execbox home. Its pid."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock))
    os.chmod(sock, 0o666)
    fd = os.open(heard, os.O_WRONLY | os.O_APPEND)
    pid = os.fork()
    if pid == 0:  # the child: only system calls, then _exit
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            listener.listen(8)  # the peer credentials a client sees are taken here
            while True:
                conn, _ = listener.accept()
                conn.settimeout(2)
                try:
                    while data := conn.recv(65536):
                        os.write(fd, data)
                except OSError:
                    pass
                conn.close()
        finally:
            os._exit(0)
    listener.close()
    os.close(fd)
    return pid


@pytest.mark.parametrize("owner", ["file", "server"])
def test_another_users_socket_in_the_home_is_sent_nothing(owner: str, tmp_path: Path) -> None:
    """Someone who can write in the execbox home listens on serve.sock: the CLI would send them
    the code and its --secret values. Found, it is sent nothing and the run happens in-process;
    named, it is sent nothing and the run is an error."""
    cli_home = tmp_path / "home"
    cli_home.mkdir()
    (cli_home / "envs").symlink_to(home() / "envs")  # the runtime image, for the in-process run
    heard = tmp_path / "heard"
    heard.touch()
    sock = cli_home / "serve.sock"
    pid = _listen_as_nobody(sock, heard)
    try:
        if owner == "file":
            os.chown(sock, 65534, 65534)
        program = tmp_path / "p.py"
        program.write_text("print('ran')")
        env = {"EXECBOX_HOME": str(cli_home), "EXECBOX_SERVER": ""}
        proc = _cli("run", str(program), "--secret", "hunter2-not-for-them", env=env)
        # Named with --server (a socket in /tmp, say): an error, and nothing sent either.
        named = _cli(
            "run",
            str(program),
            "--secret",
            "hunter2-not-for-them",
            "--server",
            f"unix:{sock}",
            env={"EXECBOX_HOME": str(cli_home)},
        )
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert heard.read_bytes() == b""
    assert (proc.returncode, proc.stdout) == (0, b"ran\n"), proc.stderr
    assert b"not to this user" in proc.stderr or b"not as this user" in proc.stderr
    assert (named.returncode, named.stdout) == (2, b""), named.stderr
    assert b"the run is not sent there" in named.stderr


@pytest.mark.parametrize("server", ["unix:{tmp}/nothing.sock", "http://127.0.0.1:{port}"])
def test_an_explicit_server_that_is_down_is_an_error(server: str, tmp_path: Path) -> None:
    target = server.format(tmp=tmp_path, port=_free_port())
    marker = tmp_path / "ran"
    program = tmp_path / "p.py"
    program.write_text(f"open({str(marker)!r}, 'w')")  # would fail in the sandbox anyway
    for spec in (["--server", target], []):
        proc = _cli("run", str(program), *spec, env={"EXECBOX_SERVER": target})
        assert proc.returncode == 2, proc.stderr
        assert f"cannot reach the execbox server at {target}".encode() in proc.stderr
        assert b"[execbox]" not in proc.stderr


def test_a_bad_server_spec_is_a_usage_error(tmp_path: Path) -> None:
    program = tmp_path / "p.py"
    program.write_text("print(1)")
    proc = _cli("run", str(program), "--server", "localhost:8000")
    assert proc.returncode == 2
    assert b"give unix:/PATH/serve.sock, http(s)://HOST:PORT, or none" in proc.stderr


def test_http_server_needs_a_key_from_the_environment(served: Served, tmp_path: Path) -> None:
    program = tmp_path / "p.py"
    program.write_text("print('keyed')")
    proc = _cli("run", str(program), "--server", served.url, env={"EXECBOX_API_KEY": ""})
    assert proc.returncode == 2
    assert b"missing_api_key" in proc.stderr
    key = _cli("keys", "create", f"cli-{tmp_path.name}").stdout.decode().strip()
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n")
    for env in ({"EXECBOX_API_KEY": key}, {"EXECBOX_API_KEY_FILE": str(key_file)}):
        proc = _cli("run", str(program), "--server", served.url, env=env)
        assert (proc.returncode, proc.stdout) == (0, b"keyed\n"), proc.stderr
    # The TCP port still refuses a keyless run: the socket's trust is the socket's only.
    response = httpx.post(f"{served.url}/v1/runs", json={"code": "print(1)"}, timeout=30)
    assert response.status_code == 401


def test_a_key_is_not_sent_in_the_clear_off_loopback(served: Served, tmp_path: Path) -> None:
    """0.0.0.0 reaches this machine's server, yet the URL names no loopback address: the key
    would be sent as plain text to wherever such a URL leads. Refused, unless asked for."""
    program = tmp_path / "p.py"
    program.write_text("print('keyed')")
    key = _cli("keys", "create", f"clear-{tmp_path.name}").stdout.decode().strip()
    clear = f"http://0.0.0.0:{served.port}"
    for spec in (["--server", clear], []):
        proc = _cli(
            "run", str(program), *spec, env={"EXECBOX_SERVER": clear, "EXECBOX_API_KEY": key}
        )
        assert (proc.returncode, proc.stdout) == (2, b""), proc.stderr
        assert b"the API key would cross the network unencrypted" in proc.stderr
        assert b"--allow-plain-http-key" in proc.stderr
    proc = _cli(
        "run",
        str(program),
        "--server",
        clear,
        "--allow-plain-http-key",
        env={"EXECBOX_API_KEY": key},
    )
    assert (proc.returncode, proc.stdout) == (0, b"keyed\n"), proc.stderr
    # Loopback needs no such flag, and a URL without a key has nothing to leak.
    for url, env in ((f"http://127.0.0.1:{served.port}", {"EXECBOX_API_KEY": key}), (clear, {})):
        proc = _cli("run", str(program), "--server", url, env={"EXECBOX_API_KEY": "", **env})
        assert b"unencrypted" not in proc.stderr
        assert proc.returncode == (0 if env else 2), proc.stderr


def test_a_profiles_default_limits_hold_through_an_http_server(
    served: Served, tmp_path: Path
) -> None:
    """Limits left out take the profile's defaults on the server, as they do in-process."""
    program = tmp_path / "p.py"
    program.write_text("print(1)")
    key = _cli("keys", "create", f"limits-{tmp_path.name}").stdout.decode().strip()
    env = {"EXECBOX_API_KEY": key}
    for extra, timeout_s in (([], 60), (["--timeout", "7"], 7)):
        proc = _cli(
            "run", str(program), "--profile", "extended", "--json", "--server", served.url,
            *extra, env=env,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["limits"]["timeout_s"] == timeout_s


def test_the_socket_is_private_and_checks_the_peer(served: Served) -> None:
    assert served.sock.stat().st_mode & 0o777 == 0o600
    # Opened to everyone by mistake, it still runs nothing for another user.
    os.chmod(served.sock, 0o666)
    try:
        status = _post_as_nobody(served.sock, b'{"code": "print(1)"}')
    finally:
        os.chmod(served.sock, 0o600)
    assert status == b"401"
    # Control: the server's own user gets in with no key.
    transport = httpx.HTTPTransport(uds=str(served.sock))
    with httpx.Client(transport=transport, timeout=60) as client:
        response = client.post("http://x/v1/runs", json={"code": "print(1)"})
    assert response.status_code == 200, response.text


def _post_as_nobody(sock: Path, body: bytes) -> bytes:
    """POST /v1/runs on `sock` from a child running as nobody; the answer's status code."""
    request = (
        b"POST /v1/runs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only system calls, then _exit
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.connect(str(sock))
                conn.sendall(request)
                answer = conn.recv(64)
            os.write(write_end, answer.split(b" ")[1])
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            os.write(write_end, repr(exc).encode())
        os._exit(0)
    os.close(write_end)
    try:
        return os.read(read_end, 4096)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)


def test_a_live_socket_is_not_taken_over(served: Served, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="another execbox serve listens"):
        bind_local_socket(served.sock)
    regular = tmp_path / "file"
    regular.write_text("x")
    with pytest.raises(UsageError, match="is not a socket"):
        bind_local_socket(regular)
    with pytest.raises(UsageError, match="longer than 107 bytes"):
        bind_local_socket(tmp_path / ("x" * 120))


def test_another_users_stale_socket_is_left_alone_with_a_clear_error(tmp_path: Path) -> None:
    """A socket file of another user's where `serve` would listen: not removed (it may be
    theirs, and in /tmp removing it fails for an ordinary user), a clear error instead."""
    where = tmp_path / "shared"
    where.mkdir(mode=0o1777)
    sock = where / "serve.sock"
    stale = bind_local_socket(sock)
    stale.close()  # nothing listens
    os.chown(sock, 65534, 65534)
    with pytest.raises(SocketTaken, match="uid 65534's, not this user's"):
        bind_local_socket(sock)
    assert sock.lstat().st_uid == 65534
    proc = _cli("serve", "--port", str(_free_port()), "--socket", str(sock))
    assert proc.returncode == 2, proc.stderr
    assert b"is a socket of uid 65534's" in proc.stderr
    assert b"Traceback" not in proc.stderr and sock.exists()


def test_a_second_server_leaves_the_socket_to_the_first(served: Served) -> None:
    """Asked for the socket, it refuses to start; on the default one it warns and serves TCP
    only (here it then stops: that home has no runtime image). The first keeps its socket."""
    taken = _cli("serve", "--port", str(_free_port()), "--socket", str(served.sock))
    assert taken.returncode == 2
    assert b"another execbox serve listens on" in taken.stderr
    second = _cli(
        "serve", "--port", str(_free_port()), env={"EXECBOX_HOME": str(served.sock.parent)}
    )
    assert b"this server listens on its TCP port only" in second.stderr, second.stderr
    transport = httpx.HTTPTransport(uds=str(served.sock))
    with httpx.Client(transport=transport, timeout=30) as client:
        assert client.get("http://x/readyz").status_code == 200


def test_keys_create_stores_a_given_key(tmp_path: Path) -> None:
    """`execbox keys create --key-file`: a deployment's secret becomes the tenant's key."""
    db = f"sqlite:///{tmp_path}/keys.db"
    secret = tmp_path / "secret"
    secret.write_text("s3cret-from-a-container-secret-0123456789\n")
    proc = _cli("keys", "create", "deployed", "--key-file", str(secret), "--db", db)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"" and b"stored the given key as 'deployed'" in proc.stderr
    keys = KeyStore(RunStore(db).engine)
    tenant = keys.authenticate("s3cret-from-a-container-secret-0123456789")
    assert tenant is not None and tenant.name == "deployed"
    assert keys.authenticate("s3cret-from-a-container-secret-012345678") is None
    secret.write_text("short")
    proc = _cli("keys", "create", "weak", "--key-file", str(secret), "--db", db)
    assert proc.returncode == 2 and b"32 to 512 characters" in proc.stderr
    # The same secret given for a second tenant: refused as such, not as a taken name.
    secret.write_text("s3cret-from-a-container-secret-0123456789\n")
    proc = _cli("keys", "create", "second", "--key-file", str(secret), "--db", db)
    assert proc.returncode == 2
    assert b"already stored under another name" in proc.stderr, proc.stderr
    assert keys.authenticate("s3cret-from-a-container-secret-0123456789") == tenant


def test_no_key_can_be_the_local_sockets_tenant(tmp_path: Path) -> None:
    """The local socket's runs belong to tenant 'local': a key of that name would list and read
    them, so the name is refused, and a key stored under it before is not accepted."""
    import sqlalchemy as sa

    from execbox.server.auth import api_keys

    keys = KeyStore(RunStore(f"sqlite:///{tmp_path}/keys.db").engine)
    for reserved in ("local", "anonymous"):
        with pytest.raises(UsageError, match="reserved"):
            keys.create(reserved)
    key = keys.create("legacy")
    assert keys.authenticate(key) is not None
    with keys.engine.begin() as conn:
        conn.execute(sa.update(api_keys).values(name="local"))
    assert keys.authenticate(key) is None


def test_no_auth_tcp_callers_are_not_the_local_sockets_tenant(executor: Any) -> None:
    """The local socket is private to its user; with --no-auth the TCP port (on loopback, open
    to every user of the machine) took the same tenant, so a cache hit there told another user
    that this exact code, stdin and environment had run (an oracle for guessed env values)."""
    env = {"TOKEN": "guess-me-0123"}
    with _serving("--no-auth") as server:
        transport = httpx.HTTPTransport(uds=str(server.sock))
        with httpx.Client(transport=transport, timeout=60) as own:
            mine = own.post("http://x/v1/runs", json={"code": "print(1)", "env": env})
        assert mine.status_code == 200, mine.text
        other = httpx.post(
            f"{server.url}/v1/runs", json={"code": "print(1)", "env": env}, timeout=60
        )
        assert other.status_code == 200, other.text
        assert other.json()["cached"] is False
        records = httpx.get(f"{server.url}/v1/runs/{mine.json()['run_id']}", timeout=30)
        assert records.status_code == 404
