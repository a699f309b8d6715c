"""Runs made again from their record: a run the policy held, released (`approve`), and a
recorded run replayed under its recorded limits (`replay`). Both go through the pipeline by
`Executor.rerun`, the one entry point this module uses."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .call import Origin
from .contract import BoundSecret, RunRequest, RunResult, Status
from .errors import UsageError
from .redact import checked_secrets
from .request import bind_secrets
from .results import ReplayReport

if TYPE_CHECKING:
    from .executor import Executor
    from .records import RunRecord
    from .sandbox.host.pump import OutputCallback


def approve(
    executor: Executor,
    run_id: str,
    *,
    approved_by: str | None,
    on_stdout: OutputCallback | None,
    on_stderr: OutputCallback | None,
    secrets: Iterable[str],
    bound_secrets: Sequence[BoundSecret | Mapping[str, Any]] = (),
) -> RunResult:
    """Release a run the policy held (`needs_approval`) and run it now, once."""
    store = executor.store
    record = store.get(run_id)
    if record is None:
        raise UsageError(f"no run {run_id!r}")
    if record.status != Status.needs_approval.value:
        raise UsageError(f"run {run_id} is {record.status}, not held for approval")
    if record.rejected_at is not None:
        raise UsageError(f"run {run_id} was rejected by {record.rejected_by or 'someone'}")
    secrets = tuple(secrets)
    request = store.request_of(record, secrets)  # before it is marked released
    _check_environment(executor, record, request, "released")
    bound = bind_secrets(bound_secrets, request)
    if not store.mark_approved(run_id, approved_by):
        raise UsageError(f"run {run_id} was already released")
    return executor.rerun(
        request,
        Origin(kind="approval", source=run_id, approved=True),
        checked_secrets(secrets),
        record.session_id,
        on_stdout,
        on_stderr,
        bound,
    )


def replay(executor: Executor, run_id: str, *, secrets: Iterable[str]) -> ReplayReport:
    """Run a recorded run again under its recorded limits and compare the outcomes."""
    store = executor.store
    record = store.get(run_id)
    if record is None:
        raise UsageError(f"no run {run_id!r}")
    if record.status in (
        Status.policy_denied.value,
        Status.needs_approval.value,
        Status.budget_exceeded.value,
    ):
        raise UsageError(f"run {run_id} never ran ({record.status}); nothing to replay")
    if record.policy.rule == "code.encoding":
        raise UsageError(
            f"run {run_id}'s code was bytes that do not decode, and the record "
            "keeps only a rendering of them (bad bytes as \\x escapes): run "
            "the file again instead"
        )
    secrets = tuple(secrets)
    request = store.request_of(record, secrets)
    _check_environment(executor, record, request, "replayed")
    # Records made before secrets were sealed kept redacted environment values only.
    redacted_env = sorted(k for k, v in request.env.items() if "[REDACTED" in v)
    again = executor.rerun(
        request,
        Origin(kind="replay", source=run_id, approved=True),
        checked_secrets(secrets),
        None,
        None,
        None,
    )
    return ReplayReport.compare(record.result, again, redacted_env)


def _check_environment(
    executor: Executor, record: RunRecord, request: RunRequest, doing: str
) -> None:
    """UsageError naming the environment and the image of a recorded run whose environment
    is not built any more (it never runs in another instead)."""
    if request.environment is None:
        return
    try:
        executor.environment(request.environment)
    except UsageError as exc:
        raise UsageError(
            f"run {record.run_id} ran in environment {request.environment!r} (image "
            f"{record.image_digest or 'none: it did not run'}), which is not built any more, "
            f"so it cannot be {doing}: {exc}"
        ) from exc
