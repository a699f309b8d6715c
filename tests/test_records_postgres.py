"""The run store on a real PostgreSQL server: durable, concurrent, deduplicated.

A throwaway server (Debian's postgresql 15 binaries) is started once for this module: initdb into
a temporary directory, listening only on a unix socket inside it, fsync off. Every test gets its
own fresh database on that server. As root the server runs as the `postgres` system user
(initdb refuses root). The module is skipped, with the reason, when psycopg, the PostgreSQL
binaries or (as root) the `postgres` user are missing. Nothing is left running afterwards:
teardown stops the server (pg_ctl stop -m immediate) and removes its directory, and the
postmaster is a child of pytest with a parent-death signal, so it goes even if pytest is killed.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from execbox.contract import Artifact, InputFile, RunRequest, RunResult, Status
from execbox.records import PolicyInfo, RunStore

pytest.importorskip(
    "psycopg",
    reason="PostgreSQL record tests need the psycopg driver: pip install -e '.[postgres]'",
)

PG_BINDIRS = [
    Path("/usr/lib/postgresql/15/bin"),
    *sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True),
]


def _pg_binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for bindir in PG_BINDIRS:
        if (bindir / name).is_file():
            return str(bindir / name)
    return None


def _free_port() -> int:
    # Only names the socket file (.s.PGSQL.<port>) in our own directory; TCP stays off.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fail(what: str, proc: subprocess.CompletedProcess[str]) -> str:
    return f"{what} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"


def _wait_ready(server: subprocess.Popen[bytes], socket_dir: Path, port: int, log: Path) -> None:
    """Return once the server accepts connections; fail with its log if it exits or stalls."""
    import psycopg

    deadline = time.monotonic() + 30
    while True:
        if server.poll() is not None:
            pytest.fail(
                f"postgres exited with {server.returncode}:\n{log.read_text(errors='replace')}"
            )
        try:
            psycopg.connect(
                host=str(socket_dir),
                port=port,
                user="postgres",
                dbname="postgres",
                connect_timeout=2,
            ).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                pytest.fail(f"postgres not ready after 30 s:\n{log.read_text(errors='replace')}")
            time.sleep(0.05)


@pytest.fixture(scope="module")
def pg_server() -> Iterator[Callable[[], str]]:
    """A PostgreSQL server for this module; yields a factory of fresh database URLs."""
    tools = {name: _pg_binary(name) for name in ("initdb", "pg_ctl", "postgres")}
    missing = [name for name, path in tools.items() if path is None]
    if missing:
        pytest.skip(
            f"PostgreSQL record tests SKIPPED: {', '.join(missing)} not found on PATH or "
            f"in /usr/lib/postgresql/*/bin (install Debian's postgresql package)"
        )
    run_as: dict[str, Any] = {}
    owner: pwd.struct_passwd | None = None
    if os.geteuid() == 0:  # initdb refuses root: run initdb and the server as `postgres`
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip(
                "PostgreSQL record tests SKIPPED: running as root and there is no "
                "`postgres` system user to run initdb and the server as"
            )
        run_as = {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}

    base = Path(tempfile.mkdtemp(prefix="execbox-pg-"))
    data, log = base / "data", base / "server.log"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}
    if owner is not None:
        os.chown(base, owner.pw_uid, owner.pw_gid)
        env["HOME"] = str(base)
    port = _free_port()

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            cwd=base,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            **run_as,
        )

    server: subprocess.Popen[bytes] | None = None
    try:
        t0 = time.monotonic()
        proc = run(
            str(tools["initdb"]),
            "-D",
            str(data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
            "--no-instructions",
        )
        if proc.returncode != 0:
            pytest.fail(_fail("initdb", proc))
        # The postmaster is our own child (not daemonized by pg_ctl start), and setpriv makes the
        # kernel send it SIGQUIT (immediate shutdown) should pytest die without its teardown
        # (SIGKILL, or a CI timeout's SIGTERM): no server outlives the test run.
        setpriv = shutil.which("setpriv")
        watch = [setpriv, "--pdeathsig", "QUIT", "--"] if setpriv else []
        with open(log, "wb") as out:
            server = subprocess.Popen(
                [
                    *watch,
                    str(tools["postgres"]),
                    "-D",
                    str(data),
                    "-p",
                    str(port),
                    "-c",
                    "listen_addresses=",
                    "-c",
                    f"unix_socket_directories={base}",
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=200",
                    "-c",
                    "deadlock_timeout=200ms",
                ],
                cwd=base,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **run_as,
            )
        _wait_ready(server, base, port, log)
        print(f"\nPostgreSQL server up in {time.monotonic() - t0:.2f} s at {base} (port {port})")

        admin = sa.create_engine(
            f"postgresql+psycopg://postgres@/postgres?host={base}&port={port}",
            isolation_level="AUTOCOMMIT",
            poolclass=sa.NullPool,
        )
        numbers = itertools.count(1)

        def fresh_url() -> str:
            name = f"execbox_test_{next(numbers)}"
            with admin.connect() as conn:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
            return f"postgresql+psycopg://postgres@/{name}?host={base}&port={port}"

        yield fresh_url
        admin.dispose()
    finally:
        if server is not None:
            run(str(tools["pg_ctl"]), "-D", str(data), "-m", "immediate", "-w", "stop")
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=10)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server: Callable[[], str]) -> str:
    return pg_server()


@pytest.fixture
def open_store(pg_url: str) -> Iterator[Callable[..., RunStore]]:
    """Open RunStores on this test's database; all are closed (pools disposed) at the end."""
    opened: list[RunStore] = []

    def opener(**kwargs: Any) -> RunStore:
        store = RunStore(pg_url, **kwargs)
        assert store.engine.dialect.name == "postgresql"
        opened.append(store)
        return store

    yield opener
    for store in opened:
        store.close()


def _run(i: int, art: bytes = b"", status: Status = Status.ok) -> tuple[RunRequest, RunResult]:
    req = RunRequest(
        code=f"print({i})", stdin=b"in", files=[InputFile(name="a.csv", data=b"x,y\n")]
    )
    arts = [Artifact(path="out.bin", size=len(art), sha256=f"{i:064x}", mime_type="x/y", data=art)]
    res = RunResult(
        run_id=f"run{i:05d}",
        status=status,
        stdout=f"{i}\n",
        code_sha256="c" * 64,
        image_digest="sha256:img",
        artifacts=arts if art else [],
    )
    return req, res


def _in_threads(
    n: int, work: Callable[[int], None], gates: Sequence[threading.Barrier] = ()
) -> list[BaseException]:
    """Run work(0..n-1) in n threads released together; return what they raised.

    A thread that fails breaks every barrier (the start gate and `gates`, which work() may wait
    on), so the others stop with BrokenBarrierError instead of waiting forever.
    """
    errors: list[BaseException] = []
    barriers = [threading.Barrier(n, timeout=60), *gates]

    def body(t: int) -> None:
        try:
            barriers[0].wait()
            work(t)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            for barrier in barriers:
                barrier.abort()

    threads = [threading.Thread(target=body, args=(t,), daemon=True) for t in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=90)
    assert not any(th.is_alive() for th in threads), "worker threads hung"
    # The first failure is the interesting one; BrokenBarrierError only follows from it.
    return sorted(errors, key=lambda e: isinstance(e, threading.BrokenBarrierError))


def _blob_count(store: RunStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.scalar(sa.text("select count(*) from blobs")) or 0)


def test_record_survives_a_new_store_on_the_same_url(pg_url: str) -> None:
    req = RunRequest(
        code="print(open('a.csv').read())",
        stdin=b"\x00stdin\xff",
        files=[
            InputFile(name="a.csv", data=b"x,y\n1,2\n"),
            InputFile(name="data/raw.bin", data=bytes(range(256))),
        ],
        env={"A": "1"},
        profile="data",
    )
    res = RunResult(
        run_id="run-pg-1",
        status=Status.ok,
        stdout="x,y\n1,2\n",
        code_sha256="c" * 64,
        image_digest="sha256:img",
        artifacts=[
            Artifact(
                path="plot.png", size=4, sha256="d" * 64, mime_type="image/png", data=b"\x89PNG"
            )
        ],
    )
    store = RunStore(pg_url)
    store.save(
        req,
        res,
        policy=PolicyInfo(decision="allow", rule="r", line=3),
        env={"A": "1"},
        session_id="s1",
        cache_key="k" * 64,
    )
    store.close()

    again = RunStore(pg_url)
    try:
        assert again.engine.dialect.name == "postgresql"
        rec = again.get("run-pg-1")
        assert rec is not None
        # artifact bytes are not part of the result's JSON: they come back from the blob table
        assert rec.result == res.model_copy(
            update={"artifacts": [a.model_copy(update={"data": None}) for a in res.artifacts]}
        )
        assert again.with_artifact_data(rec.result) == res
        assert rec.code == req.code and rec.env == {"A": "1"}
        assert rec.policy == PolicyInfo(decision="allow", rule="r", line=3)
        assert rec.session_id == "s1" and rec.cache_key == "k" * 64 and rec.kind == "run"
        assert [(m["name"], m["size"]) for m in rec.inputs] == [("a.csv", 8), ("data/raw.bin", 256)]
        rebuilt = again.request_of(rec)
        assert rebuilt.files == req.files and rebuilt.stdin == b"\x00stdin\xff"
        assert rebuilt.code == req.code and rebuilt.env == req.env and rebuilt.limits == req.limits
        assert again.artifact_data("run-pg-1", "plot.png") == b"\x89PNG"
        assert again.count() == 1
    finally:
        again.close()


def test_eight_threads_of_a_hundred_writers_lose_no_record(
    open_store: Callable[..., RunStore],
) -> None:
    store = open_store()

    def writer(t: int) -> None:
        for i in range(100):
            req, res = _run(t * 1000 + i, art=b"same bytes in every run")
            store.save(req, res, policy=PolicyInfo(), env={})

    assert _in_threads(8, writer) == []
    assert store.count() == 800
    # inputs, stdin and the shared artifact bytes are stored once, however often they recur
    assert _blob_count(store) == 3


def test_concurrent_writers_of_the_same_new_blobs_in_any_order_all_succeed(
    open_store: Callable[..., RunStore],
) -> None:
    # Every round, 8 threads each store a run whose blobs are new and shared with the others,
    # listed in a different order per thread, and partly shared (one blob per thread pair):
    # the races that a "select, then insert, then catch IntegrityError" scheme gets wrong.
    store = open_store()
    rounds = 25
    gates = [threading.Barrier(8, timeout=60) for _ in range(rounds)]

    def writer(t: int) -> None:
        for r in range(rounds):
            shared = [f"r{r} shared {k}".encode() for k in range(4)]
            shared = shared[t % 4 :] + shared[: t % 4]
            if t % 2:
                shared.reverse()
            files = [InputFile(name=f"f{k}", data=d) for k, d in enumerate(shared)]
            files.append(InputFile(name="pair", data=f"r{r} pair {t // 2}".encode()))
            req = RunRequest(code="pass", stdin=f"r{r} stdin".encode(), files=files)
            res = RunResult(
                run_id=f"r{r:03d}t{t}",
                status=Status.ok,
                code_sha256="c" * 64,
                image_digest="sha256:img",
            )
            gates[r].wait()
            store.save(req, res, policy=PolicyInfo(), env={})

    errors = _in_threads(8, writer, gates)
    assert errors == [], errors[:3]
    assert store.count() == rounds * 8
    assert _blob_count(store) == rounds * (4 + 4 + 1)  # shared, pair, stdin
    rec = store.get("r007t5")
    assert rec is not None and store.request_of(rec).stdin == b"r7 stdin"


def test_approval_releases_a_held_run_only_once(open_store: Callable[..., RunStore]) -> None:
    store = open_store()
    req, res = _run(3)
    store.save(
        req,
        res.model_copy(update={"status": Status.needs_approval}),
        policy=PolicyInfo(decision="needs_approval", rule="call.approval"),
        env={},
    )
    assert store.mark_approved("run00003", "alice") is True
    assert store.mark_approved("run00003", "bob") is False
    rec = store.get("run00003")
    assert rec is not None and rec.approved_by == "alice" and rec.approved_at is not None
    req, res = _run(4)
    store.save(req, res, policy=PolicyInfo(), env={})
    assert store.mark_approved("run00004", "alice") is False  # not held
    assert store.mark_approved("nope", "alice") is False


def test_concurrent_approvals_release_a_held_run_exactly_once(
    open_store: Callable[..., RunStore],
) -> None:
    store = open_store()
    for i in range(10):
        req, res = _run(i, status=Status.needs_approval)
        store.save(req, res, policy=PolicyInfo(decision="needs_approval"), env={})
    wins: list[tuple[str, str]] = []

    def approver(t: int) -> None:
        for i in range(10):
            if store.mark_approved(f"run{i:05d}", f"user{t}"):
                wins.append((f"run{i:05d}", f"user{t}"))

    assert _in_threads(8, approver) == []
    assert sorted(run_id for run_id, _ in wins) == [f"run{i:05d}" for i in range(10)]
    for run_id, user in wins:
        rec = store.get(run_id)
        assert rec is not None and rec.approved_by == user


def test_cache_returns_live_entries_only_and_purges_expired(
    open_store: Callable[..., RunStore],
) -> None:
    store = open_store()
    for i in (5, 6):
        req, res = _run(i)
        store.save(req, res, policy=PolicyInfo(), env={})
    assert store.cache_lookup("k" * 64) is None
    store.cache_store("k" * 64, "run00005", ttl_s=-1)
    assert store.cache_lookup("k" * 64) is None
    store.cache_store("k" * 64, "run00005", ttl_s=60)
    hit = store.cache_lookup("k" * 64)
    assert hit is not None and hit.run_id == "run00005"
    store.cache_store("k" * 64, "run00006", ttl_s=60)  # replaces the entry
    hit = store.cache_lookup("k" * 64)
    assert hit is not None and hit.run_id == "run00006"
    store.cache_store("e" * 64, "run00005", ttl_s=-1)
    assert store.cache_purge_expired() == 1
    assert store.cache_lookup("k" * 64) is not None


def test_concurrent_stores_of_one_cache_key_all_succeed(
    open_store: Callable[..., RunStore],
) -> None:
    # Identical runs finishing together each store the same cache key.
    store = open_store()
    for t in range(8):
        req, res = _run(t)
        store.save(req, res, policy=PolicyInfo(), env={})

    def storer(t: int) -> None:
        for r in range(20):
            store.cache_store(f"{r:064x}", f"run{t:05d}", ttl_s=60)

    errors = _in_threads(8, storer)
    assert errors == [], errors[:3]
    for r in range(20):
        hit = store.cache_lookup(f"{r:064x}")
        assert hit is not None and hit.run_id in {f"run{t:05d}" for t in range(8)}
    with store.engine.connect() as conn:
        assert conn.scalar(sa.text("select count(*) from cache")) == 20


def test_list_is_newest_first_and_filters_by_status_and_session(
    open_store: Callable[..., RunStore],
) -> None:
    store = open_store()
    statuses = [Status.ok, Status.error, Status.ok, Status.timeout, Status.error, Status.ok]
    for i, status in enumerate(statuses):
        req, res = _run(i, status=status)
        store.save(req, res, policy=PolicyInfo(), env={}, session_id="even" if i % 2 else "odd")
        time.sleep(0.002)  # distinct created_at, whatever the clock's resolution
    assert [r.run_id for r in store.list()] == [f"run{i:05d}" for i in (5, 4, 3, 2, 1, 0)]
    assert [r.run_id for r in store.list(limit=2)] == ["run00005", "run00004"]
    assert [r.run_id for r in store.list(status="error")] == ["run00004", "run00001"]
    assert [r.status for r in store.list(status="ok")] == ["ok", "ok", "ok"]
    assert store.list(status="forbidden") == []
    assert [r.run_id for r in store.list(session_id="even")] == ["run00005", "run00003", "run00001"]
    assert [r.run_id for r in store.list(status="ok", session_id="odd")] == ["run00002", "run00000"]
