"""execbox.testing.FakeSandbox: the pipeline's stages over the fake backend (policy, budget,
cache, redaction, records, admission), and the fake's own promises (caps, callbacks, cancel,
sessions' workspace). Nothing here needs root or the runtime image."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

import execbox
from execbox import Executor, Status
from execbox.budget import Budget
from execbox.testing import FakeResult, FakeRun, FakeSandbox

pytestmark = pytest.mark.fake_sandbox

SECRET = "sk-fake-0123456789abcdef"


@pytest.fixture
def fake() -> FakeSandbox:
    return FakeSandbox(lambda run: FakeResult(stdout=f"ran {run.code}\n"), digest="fake:1")


@pytest.fixture
def ex(fake: FakeSandbox) -> Iterator[Executor]:
    with Executor(backend=fake, cache=False) as executor:
        yield executor


def test_a_denied_run_never_reaches_the_backend_and_is_recorded(
    ex: Executor, fake: FakeSandbox
) -> None:
    r = ex.run("import socket", profile="minimal")
    assert r.status is Status.policy_denied and r.error and r.error.rule == "import.deny"
    assert fake.runs == []
    record = ex.store.get(r.run_id)
    assert record is not None and record.status == "policy_denied"


def test_an_allowed_run_reaches_the_backend_as_a_typed_spec(
    ex: Executor, fake: FakeSandbox
) -> None:
    r = ex.run(
        "import pandas\nprint(1)",
        stdin="in",
        files={"a.csv": b"x"},
        env={"K": "v"},
        limits={"timeout_s": 3},
    )
    assert r.ok and r.stdout == "ran import pandas\nprint(1)\n"
    assert r.image_digest == "fake:1"
    (spec,) = fake.runs
    assert spec.run_id == r.run_id and spec.kind == "pandas" and spec.stdin == b"in"
    assert list(spec.files) == [("a.csv", b"x")] and dict(spec.env or {}) == {"K": "v"}
    assert spec.limits.timeout_s == 3
    record = ex.store.get(r.run_id)
    assert record is not None and record.result.stdout == r.stdout


def test_a_cache_hit_does_not_reach_the_backend(fake: FakeSandbox) -> None:
    with Executor(backend=fake, cache=True) as ex:
        first, again = ex.run("print(2)"), ex.run("print(2)")
    assert not first.cached and again.cached and again.stdout == first.stdout
    assert len(fake.runs) == 1


def test_the_budget_is_charged_what_the_backend_reports_then_refuses(
    ex: Executor, fake: FakeSandbox
) -> None:
    fake.handler = lambda run: FakeResult(wall_ms=600.0)
    budget = Budget(exec_s=1.0)
    assert ex.run("print(1)", budget=budget).ok
    assert ex.run("print(1)", budget=budget).ok  # 0.4 s left: clipped, not refused
    refused = ex.run("print(1)", budget=budget)
    assert refused.status is Status.budget_exceeded and len(fake.runs) == 2


def test_fake_output_is_redacted_live_in_the_result_and_in_the_record(
    ex: Executor, fake: FakeSandbox
) -> None:
    def leak(run: FakeRun) -> FakeResult:
        run.write(f"live {SECRET}\n")
        return FakeResult(stderr=f"err {SECRET}\n", exit_code=1)

    fake.handler = leak
    seen: list[bytes] = []
    r = ex.run("print(1)", secrets=[SECRET], on_stdout=seen.append)
    assert r.status is Status.error
    assert SECRET not in r.stdout + r.stderr and "[REDACTED" in r.stdout
    assert SECRET.encode() not in b"".join(seen) and b"live" in b"".join(seen)
    record = ex.store.get(r.run_id)
    assert record is not None and SECRET not in record.result.stdout + record.result.stderr


def test_output_past_the_cap_is_cut_and_reported_as_output_limit(
    ex: Executor, fake: FakeSandbox
) -> None:
    fake.handler = lambda run: "x" * 5000
    seen: list[bytes] = []
    r = ex.run("print(1)", limits={"output_bytes": 1024}, on_stdout=seen.append)
    assert r.status is Status.output_limit and r.stdout_truncated
    assert len(r.stdout) == 1024 and len(b"".join(seen)) == 1024


def test_a_backend_failure_is_a_sandbox_error_never_cached(fake: FakeSandbox) -> None:
    fake.handler = lambda run: FakeResult(sandbox_error="the fake broke")
    with Executor(backend=fake, cache=True) as ex:
        first, again = ex.run("print(3)"), ex.run("print(3)")
    assert first.status is Status.sandbox_error and first.error
    assert first.error.message == "the fake broke" and not again.cached


def test_cancel_ends_a_run_the_handler_is_in(ex: Executor, fake: FakeSandbox) -> None:
    entered = threading.Event()

    def wait(run: FakeRun) -> FakeResult:
        entered.set()
        while not run.cancelled:
            threading.Event().wait(0.01)
        return FakeResult()

    fake.handler = wait
    cancel = execbox.Cancel()
    thread = threading.Thread(target=lambda: (entered.wait(5), cancel.cancel()))
    thread.start()
    r = ex.run("print(1)", cancel=cancel)
    thread.join()
    assert r.status is Status.error and r.error and r.error.type == "Cancelled"


def test_artifacts_come_back_with_bytes_and_metadata(ex: Executor, fake: FakeSandbox) -> None:
    fake.handler = lambda run: FakeResult(artifacts={"out/a.txt": b"hello"})
    r = ex.run("print(1)")
    art = r.artifact("out/a.txt")
    assert art.data == b"hello" and art.size == 5 and art.mime_type == "text/plain"


def test_a_session_keeps_a_workspace_for_the_files_api_and_cells(
    ex: Executor, fake: FakeSandbox
) -> None:
    fake.handler = lambda run: FakeResult(artifacts={"made.txt": b"by a cell"})
    with ex.session(files={"seed.txt": b"40"}) as s:
        assert s.files.read("seed.txt") == b"40"
        s.files.write("up/b.bin", b"\x00")
        cell = s.run("x = 1")
        assert cell.ok and cell.session_id == s.id
        assert {a.path for a in s.files.list()} == {"seed.txt", "up/b.bin", "made.txt"}
        s.files.remove("seed.txt")
        with pytest.raises(execbox.UsageError):
            s.files.read("seed.txt")
    assert fake.runs[-1].kind == "cell" and fake.sessions[s.id].closed
    with pytest.raises(execbox.SessionClosed):
        s.run("x")


def test_killing_a_session_ends_the_cell_the_handler_is_in(ex: Executor, fake: FakeSandbox) -> None:
    entered = threading.Event()

    def wait(run: FakeRun) -> FakeResult:
        entered.set()
        deadline = time.monotonic() + 30
        while not run.cancelled and time.monotonic() < deadline:
            threading.Event().wait(0.01)
        return FakeResult()

    fake.handler = wait
    s = ex.session()
    thread = threading.Thread(target=lambda: (entered.wait(5), s.close()))
    thread.start()
    started = time.monotonic()
    r = s.run("print(1)")
    thread.join()
    assert time.monotonic() - started < 10, "the cell ran on after its session was killed"
    assert not r.ok and s.closed, r


def test_a_cell_that_ends_the_interpreter_ends_the_session(ex: Executor, fake: FakeSandbox) -> None:
    fake.handler = lambda run: FakeResult(exit_code=1, ended=True)
    s = ex.session()
    assert s.run("import os; os._exit(1)").status is Status.error
    assert s.closed
    with pytest.raises(execbox.SessionClosed):
        s.run("1")


def test_admission_bounds_runs_over_the_fake_too(fake: FakeSandbox) -> None:
    inside, peak, lock = [0], [0], threading.Lock()

    def count(run: FakeRun) -> FakeResult:
        with lock:
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
        threading.Event().wait(0.02)
        with lock:
            inside[0] -= 1
        return FakeResult()

    fake.handler = count
    results: list[execbox.RunResult] = []
    with Executor(backend=fake, cache=False, max_concurrency=2) as ex:
        threads = [
            threading.Thread(target=lambda: results.append(ex.run("print(1)"))) for _ in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(results) == 8 and all(r.ok for r in results) and peak[0] == 2


def test_a_backend_and_an_image_together_are_a_usage_error(fake: FakeSandbox) -> None:
    with pytest.raises(execbox.UsageError, match="not both"):
        Executor(backend=fake, image=object())  # type: ignore[arg-type]


def test_closing_the_executor_closes_the_backend(fake: FakeSandbox) -> None:
    Executor(backend=fake).close()
    assert fake.closed


def test_stats_of_an_executor_on_a_fake_have_no_host(fake: FakeSandbox) -> None:
    with Executor(backend=fake, cache=False) as ex:
        assert ex.run("print(1)").ok
        stats = ex.stats()
        assert stats.host is None and stats.replacements == 0 and stats.runs_waiting == 0
