from execbox import Executor, Status
from tests.probes import peak_of


def test_print_runs_and_reports_ok(executor: Executor) -> None:
    r = executor.run("print(6 * 7)")
    assert r.status is Status.ok, r
    assert r.stdout == "42\n"
    assert r.exit_code == 0 and r.signal is None and r.error is None
    assert r.image_digest.startswith("sha256:")
    assert r.metrics.wall_ms > 0 and peak_of(r) > 0


def test_jail_is_proven(jail_problem: str | None) -> None:
    # The proof itself, not the `jailed` fixture, which skips when the proof fails.
    assert jail_problem is None
