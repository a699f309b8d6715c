"""The console's list query on real PostgreSQL: the JSON paths it reads (a run's wall time and
error type) and its filters work there as on SQLite."""

from __future__ import annotations

from execbox.contract import ErrorInfo, Metrics, RunRequest, RunResult, Status
from execbox.records import PolicyInfo, RunStore
from execbox.server.console import queries
from tests.test_records_postgres import pg_server, pg_url  # noqa: F401 - fixtures


def _save(store: RunStore, run_id: str, code: str, error: str | None) -> None:
    result = RunResult(
        run_id=run_id,
        status=Status.error if error else Status.ok,
        stdout="o" * 100_000,
        code_sha256="c" * 64,
        image_digest="sha256:img",
        metrics=Metrics(wall_ms=12.5, cpu_ms=1.0, memory_peak_bytes=None),
        error=ErrorInfo(type=error, message="m") if error else None,
    )
    store.save(RunRequest(code=code), result, policy=PolicyInfo(decision="allow"))


def test_run_rows_reads_wall_time_error_type_and_filters_on_postgresql(pg_url: str) -> None:  # noqa: F811
    store = RunStore(pg_url)
    try:
        assert store.engine.dialect.name == "postgresql"
        _save(store, "run-ok", "x = '100%_done'\n" + "y = 1\n" * 40, None)
        _save(store, "run-bad", "raise KeyError()\n", "KeyError")
        store.settle()
        rows = {r.run_id: r for r in queries.run_rows(store.engine, None, limit=10)}
        assert rows["run-ok"].wall_ms == 12.5 and rows["run-ok"].error_type is None
        assert rows["run-bad"].error_type == "KeyError"
        assert len(rows["run-ok"].code_head) == queries.CODE_HEAD
        found = queries.run_rows(store.engine, None, limit=10, code_contains="0%_d")
        assert [r.run_id for r in found] == ["run-ok"]
        assert (
            queries.run_rows(store.engine, None, limit=10, code_contains="%x") == []
        )  # a wildcard would match
        assert [
            r.run_id for r in queries.run_rows(store.engine, None, limit=10, status="error")
        ] == ["run-bad"]
    finally:
        store.close()
