"""Results the pipeline makes itself: from what the sandbox returned, for runs that never
started, and the comparison of a replay with its record."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from .contract import Artifact, ErrorInfo, Metrics, NetworkConnection, RunResult, Status
from .errors import ExecboxError
from .sandbox.host.pump import RawRun
from .sandbox.inside.runner import compile_error_record

log = logging.getLogger(__name__)


def not_started(base: RunResult) -> RunResult:
    """The result of a run cancelled before it started: nothing ran."""
    return base.model_copy(
        update={
            "status": Status.error,
            "error": ErrorInfo(type="Cancelled", message="the run was cancelled before it started"),
        }
    )


def undecodable(base: RunResult, exc: SyntaxError) -> RunResult:
    """The result of source bytes that do not decode: what the sandbox reports for code that
    does not compile (status error, exit status 1, the SyntaxError on stderr)."""
    record = compile_error_record(exc)
    return base.model_copy(
        update={
            "status": Status.error,
            "exit_code": 1,
            "stderr": record["traceback"],
            "error": ErrorInfo(**record),
        }
    )


def result_of(
    base: RunResult, raw: RawRun, allowed: Callable[[], list[str] | None] | None = None
) -> RunResult:
    """The result of a finished run; `allowed` gives the environments the run's profile
    allows (a missing module's hint names only those; None: all), asked only for that hint."""
    meta = raw.meta
    status = Status(meta["status"])
    error = ErrorInfo(**meta["error"]) if meta.get("error") else None
    if error is not None and (
        error.type == "ModuleNotFoundError"
        or (error.type == "Error" and error.message.startswith("Cannot find"))
    ):
        error = with_missing_hint(error, base.image_digest, allowed() if allowed else None)
    if (raw.stdout_truncated or raw.stderr_truncated) and status in (Status.ok, Status.error):
        status = Status.output_limit
        error = ErrorInfo(
            type="OutputLimitExceeded",
            message=f"output exceeded {base.limits.output_bytes} bytes on stdout or stderr; "
            "raise limits.output_bytes (CLI --output-bytes)",
        )
    if raw.network_limit is not None and status in (Status.ok, Status.error):
        # The proxy refused traffic past the limit and had the run killed: that ended it.
        status = Status.network_limit
        error = ErrorInfo(type="NetworkLimitExceeded", message=raw.network_limit)
    arts = [
        Artifact(**a, data=d) for a, d in zip(meta["artifacts"], raw.artifact_data, strict=True)
    ]
    return base.model_copy(
        update={
            "status": status,
            "exit_code": meta.get("exit_code"),
            "signal": meta.get("signal"),
            "stdout": raw.stdout.decode("utf-8", "replace"),
            "stderr": raw.stderr.decode("utf-8", "replace"),
            "stdout_truncated": raw.stdout_truncated,
            "stderr_truncated": raw.stderr_truncated,
            "error": error,
            "artifacts": arts,
            "artifacts_truncated": bool(meta.get("artifacts_truncated")),
            "inputs_read": meta.get("inputs_read"),
            "metrics": Metrics(**meta["metrics"]),
            "network_log": [NetworkConnection(**entry) for entry in raw.network_log],
            "unenforced_limits": meta.get("unenforced_limits", []),
        }
    )


def with_missing_hint(
    error: ErrorInfo, image_digest: str, allowed: list[str] | None = None
) -> ErrorInfo:
    """A missing Python module's or npm package's error with what to do: the environments
    among `allowed` (None: all) that have it, or whom to ask (see `environments.missing_hint`)."""
    from . import environments

    module = environments.missing_module(error.type, error.message)
    if module is not None:
        return _with_hint(
            error,
            "module",
            module,
            lambda: environments.missing_hint(module, image_digest, allowed),
        )
    package = environments.missing_package(error.type, error.message)
    if package is not None:
        return _with_hint(
            error, "package", package, lambda: environments.missing_package_hint(package, allowed)
        )
    return error


def _with_hint(error: ErrorInfo, kind: str, name: str, hint: Callable[[], str | None]) -> ErrorInfo:
    try:
        text = hint()
    except ExecboxError as exc:  # an environment that cannot be read: the run's error stands
        log.warning("no hint for the missing %s %s: %s", kind, name, exc)
        return error
    if text is None:
        return error
    return error.model_copy(update={"message": f"{error.message} ({text})"})


def with_kept_data(result: RunResult, spool_dir: str, cap: int) -> RunResult:
    """Spooled artifacts: read back the bytes of those the record store keeps (the same
    first-come choice within `cap` as `RunStore.save`), so the record has them."""
    arts, budget = [], cap
    for index, art in enumerate(result.artifacts):
        if art.data is None and art.size <= budget:
            budget -= art.size
            art = art.model_copy(update={"data": Path(spool_dir, str(index)).read_bytes()})
        arts.append(art)
    return result.model_copy(update={"artifacts": arts}) if arts else result


class ReplayReport(BaseModel):
    """How a replay compares with the recorded run."""

    original: RunResult
    replay: RunResult
    matches: bool
    differences: list[str]
    image_changed: bool
    env_redacted: list[str]

    @classmethod
    def compare(
        cls, original: RunResult, replay: RunResult, env_redacted: list[str]
    ) -> ReplayReport:
        diffs = []
        for name in (
            "status",
            "exit_code",
            "signal",
            "stdout",
            "stderr",
            "stdout_truncated",
            "stderr_truncated",
        ):
            if getattr(original, name) != getattr(replay, name):
                diffs.append(name)
        if (original.error and original.error.type) != (replay.error and replay.error.type):
            diffs.append("error.type")
        if [(a.path, a.sha256) for a in original.artifacts] != [
            (a.path, a.sha256) for a in replay.artifacts
        ]:
            diffs.append("artifacts")
        return cls(
            original=original,
            replay=replay,
            matches=not diffs,
            differences=diffs,
            image_changed=original.image_digest != replay.image_digest,
            env_redacted=env_redacted,
        )
