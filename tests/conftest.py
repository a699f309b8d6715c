"""Shared fixtures. The sandbox tests use the real sandbox: a real zygote, real namespaces,
real cgroups. Hostile programs run only after `jailed` has proven the jail is active."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import NoReturn

import pytest

import execbox
from execbox.image import Image
from execbox.sandbox.host.pump import OutputCallback
from execbox.sandbox.inside.cgroup import Hierarchy

# The cluster tests start a Ray cluster and run inside a network namespace of their own: only
# `make test-cluster` runs them (it sets this), never `make test`.
collect_ignore = [] if os.environ.get("EXECBOX_CLUSTER_TESTS") else ["cluster"]


def sandbox_missing(message: str) -> NoReturn:
    """Skip a test that needs the real sandbox; fail it instead when EXECBOX_REQUIRE_SANDBOX
    is set (CI sets it), so that a broken host cannot turn the boundary tests into skips."""
    if os.environ.get("EXECBOX_REQUIRE_SANDBOX"):
        pytest.fail(f"{message} (EXECBOX_REQUIRE_SANDBOX is set)", pytrace=False)
    pytest.skip(message)


def _host_can_sandbox() -> str | None:
    if os.geteuid() != 0:
        return "the sandbox tests need root"
    try:
        Image.load()
    except Exception as exc:  # noqa: BLE001
        return f"no runtime image: {exc}"
    return None


@pytest.fixture(scope="session", autouse=True)
def _records_in_a_temporary_database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every Executor the tests make (CLI subprocesses included) records into a throwaway
    SQLite file, never into the user's own run history."""
    mp = pytest.MonkeyPatch()
    mp.setenv("EXECBOX_DB_URL", f"sqlite:///{tmp_path_factory.mktemp('records')}/runs.db")
    # CLI runs happen in their own process, never on an `execbox serve` the user keeps running.
    mp.setenv("EXECBOX_SERVER", "none")
    yield
    mp.undo()


@pytest.fixture(scope="session")
def executor() -> Iterator[execbox.Executor]:
    """The real sandbox, with the result cache off: every call really runs."""
    reason = _host_can_sandbox()
    if reason:
        sandbox_missing(f"SANDBOX UNAVAILABLE, sandbox tests skipped: {reason}")
    # Not replaced on a schedule: tests read the host's processes and slots, which a
    # replacement mid-test would change (tests/test_hosts.py tests replacement).
    with execbox.Executor(cache=False, rotate_after_runs=None, rotate_after_s=None) as ex:
        yield ex


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark what runs above the sandbox boundary (the fake sandbox, never the real one), so
    `make test-unprivileged` can prove it needs no root."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "fake_executor" in names and not {"executor", "jailed", "hostile"} & set(names):
            item.add_marker(pytest.mark.fake_sandbox)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A `serial` test's claim holds only with the machine to itself: beside other test
    workers it fails, never passes or skips by luck."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and item.get_closest_marker("serial"):
        pytest.fail(
            f"a serial test, on xdist worker {worker}: run the serial tests alone "
            "(`pytest -m serial` without -n; `make test` does)",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def fake_executor() -> Iterator[execbox.Executor]:
    """An Executor over `FakeSandbox` (see tests/fakes.py), with the result cache off: for
    tests of what lies above the sandbox (faces, routing, auth, quotas). No root, no image."""
    from execbox.testing import FakeSandbox
    from tests.fakes import literal_handler

    with execbox.Executor(backend=FakeSandbox(literal_handler), cache=False) as ex:
        yield ex


@pytest.fixture()
def poisoned_records(executor: execbox.Executor) -> Iterator[Callable[[], None]]:
    """For one test, the record of a run whose code says 'poisoned' cannot be written: a
    trigger in the records database aborts its insert, as a failing database would. Yields
    a function that waits until the store's writer has failed on one (without taking the
    failure, which the store raises once)."""
    rows = executor.store._rows
    if rows is None:
        pytest.skip("the records are not in a SQLite file")
    with executor.store.engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TRIGGER poisoned BEFORE INSERT ON runs WHEN NEW.code LIKE '%poisoned%' "
            "BEGIN SELECT RAISE(ABORT, 'the records database refused it'); END"
        )

    def failed() -> None:
        deadline = time.monotonic() + 10
        while not rows._failed:
            assert time.monotonic() < deadline, "no record failed to be written"
            time.sleep(0.01)

    try:
        yield failed
    finally:
        with executor.store.engine.begin() as conn:
            conn.exec_driver_sql("DROP TRIGGER poisoned")


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


# Complex on purpose: one checklist of the jail's properties, a line each.
def prove_jail(ex: execbox.Executor) -> str | None:  # noqa: C901
    """Return None when a run provably has its own pid namespace, cgroup and uid."""
    hier = Hierarchy.discover()
    seen: dict[str, str] = {}
    result: list[execbox.RunResult] = []

    probe_mib = 333  # a memory limit no staged slot has: it marks the probe's own cgroup

    def go() -> None:
        result.append(
            ex.run(
                "import os, time\nprint(os.getpid(), os.getuid())\ntime.sleep(1.0)",
                limits={"memory_mib": probe_mib},
            )
        )

    thread = threading.Thread(target=go)
    thread.start()
    # Ends with the probe: the bound is for a new executor's first run on a slow kernel
    # (user-mode Linux, tests/uml, took over 5 s).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not seen and thread.is_alive():
        for controller, parent in hier.parent_paths.items():
            for name in os.listdir(parent):
                path = os.path.join(parent, name)
                # Only this process's runs: other test processes probe with the same limit.
                if not name.startswith(f"x{os.getpid()}-") or not os.path.isdir(path):
                    continue
                try:
                    procs = _read(os.path.join(path, "cgroup.procs")).split()
                except OSError:  # the run ended and its cgroup went away
                    continue
                if controller in ("memory", "") and procs:
                    limit_file = "memory.limit_in_bytes" if controller else "memory.max"
                    try:
                        limit = _read(os.path.join(path, limit_file)).strip()
                    except OSError:  # gone since its procs were read
                        continue
                    if limit == str(probe_mib << 20):
                        seen["memory_limit"] = limit
                        seen["procs"] = " ".join(procs)
        time.sleep(0.02)
    thread.join()
    if not result or not result[0].ok:
        return f"probe run failed: {result[0] if result else 'no result'}"
    pid, uid = (int(x) for x in result[0].stdout.split())
    if pid > 3:
        return f"run is not in its own pid namespace (pid {pid})"
    if uid == 0:
        return "run has uid 0"
    if not seen:
        return "no cgroup with the probe's own memory limit held the probe's processes"
    for pid_s in seen["procs"].split():
        if int(pid_s) == os.getpid():
            return "the test process itself is in the run's cgroup"
    return None


@pytest.fixture(scope="session")
def jail_problem(executor: execbox.Executor) -> str | None:
    """What `prove_jail` found wrong with the session's executor, or None."""
    return prove_jail(executor)


@pytest.fixture(scope="session")
def jailed(executor: execbox.Executor, jail_problem: str | None) -> execbox.Executor:
    """The executor, after proving that runs are really jailed. Use it for hostile programs."""
    problem = jail_problem
    if problem:
        sandbox_missing(f"JAIL NOT PROVEN, hostile test skipped: {problem}")
    return executor


@pytest.fixture
def hostile(jailed: execbox.Executor) -> execbox.Executor:
    """`jailed`, under the name the hostile session tests use for it."""
    return jailed


@pytest.fixture(scope="module")
def jailed_one_slot() -> Iterator[execbox.Executor]:
    """An executor of its own with one slot of each kind, so that consecutive runs of a kind
    reuse the same slot; proven jailed like `jailed`."""
    reason = _host_can_sandbox()
    if reason:
        sandbox_missing(f"SANDBOX UNAVAILABLE, sandbox tests skipped: {reason}")
    with execbox.Executor(
        cache=False, pool_size=1, rotate_after_runs=None, rotate_after_s=None
    ) as ex:
        problem = prove_jail(ex)
        if problem:
            sandbox_missing(f"JAIL NOT PROVEN, hostile test skipped: {problem}")
        yield ex


class CellRunner:
    """Runs each program as the first cell of a fresh session, so that the attack tests written
    against runs attack sessions too (same `run` signature; everything else is the executor's)."""

    def __init__(self, executor: execbox.Executor) -> None:
        self._executor = executor

    def run(
        self,
        code: str,
        *,
        limits: execbox.Limits | dict[str, object] | None = None,
        env: dict[str, str] | None = None,
        files: dict[str, bytes] | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        **unsupported: object,
    ) -> execbox.RunResult:
        if unsupported:
            pytest.skip(f"not applicable to a session cell: {sorted(unsupported)}")
        with self._executor.session(limits=limits, env=env, files=files) as session:
            return session.run(
                code,
                on_stdout=on_stdout,
                on_stderr=on_stderr,
            )

    def __getattr__(self, name: str) -> object:
        return getattr(self._executor, name)


@pytest.fixture
def as_session_cells() -> type[CellRunner]:
    """CellRunner, for test modules (which cannot import this conftest by name reliably)."""
    return CellRunner


@pytest.fixture
def host_child_fds() -> Callable[[], str]:
    """What a child the host application starts with close_fds=False holds open (`ls -l` of
    its /proc/self/fd), after a control: a descriptor made inheritable is seen there."""

    def listing() -> str:
        r, w = os.pipe()
        os.set_inheritable(w, True)
        try:
            out = subprocess.run(
                ["ls", "-l", "/proc/self/fd/"],
                close_fds=False,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            assert os.readlink(f"/proc/self/fd/{w}") in out
        finally:
            os.close(r)
            os.close(w)
        return out

    return listing


@pytest.fixture(scope="module", autouse=True)
def _close_the_model_library_event_loop() -> Iterator[None]:
    """pydantic-ai's run_sync (and other frameworks' sync entry points) keep an event loop in
    the main thread (reused across calls); close it after each module, so its sockets are not
    left for the garbage collector (which the suite treats as an error)."""
    yield
    import asyncio
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            loop = asyncio.get_event_loop_policy().get_event_loop()
        except RuntimeError:
            return
    if not loop.is_running() and not loop.is_closed():
        loop.close()
