"""The pipeline every run goes through, and the long-lived `Executor` that owns the sandbox.

Today: validate the request, run it in the sandbox, build the contract's result. Policy, cache,
redaction and records plug in here as they land (DESIGN.md section 4).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import ValidationError

from .contract import (
    MIB,
    Artifact,
    ErrorInfo,
    Limits,
    Metrics,
    RunRequest,
    RunResult,
    Status,
)
from .errors import SandboxUnavailable, UsageError
from .image import Image
from .sandbox.host import HostError, OutputCallback, RawRun, ZygoteProcess

log = logging.getLogger("execbox")

FileSource = bytes | str | os.PathLike[str]
BACKSTOP_GRACE_S = 15.0  # the supervisor enforces limits; this only catches a stuck supervisor


def new_run_id() -> str:
    return uuid.uuid4().hex


def make_request(code: str, *, language: str = "python", stdin: bytes | str | None = None,
                 files: Mapping[str, FileSource] | None = None,
                 limits: Limits | Mapping[str, Any] | None = None,
                 env: Mapping[str, str] | None = None) -> RunRequest:
    """Build and validate a RunRequest; UsageError says what is wrong."""
    inputs = []
    for name, source in (files or {}).items():
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = bytes(source)
        else:
            try:
                data = Path(source).read_bytes()
            except OSError as exc:
                raise UsageError(f"cannot read input file {name!r} from {source}: {exc}") from exc
        inputs.append({"name": name, "data": data})
    try:
        return RunRequest.model_validate({
            "language": language, "code": code,
            "stdin": stdin.encode() if isinstance(stdin, str) else (stdin or b""), "files": inputs,
            "limits": limits if limits is not None else Limits(), "env": dict(env or {}),
        })
    except ValidationError as exc:
        raise UsageError(str(exc)) from exc


class Executor:
    """Runs code in the sandbox. Thread-safe; start once, run many times, close at the end.

    Construction starts the fork server (about a second: it pre-imports numpy, pandas and
    matplotlib). It raises SandboxUnavailable when this host cannot isolate runs; there is no
    unsandboxed fallback.
    """

    def __init__(self, *, image: Image | None = None, max_concurrency: int | None = None) -> None:
        if os.geteuid() != 0:
            raise SandboxUnavailable(
                "the default isolation tier needs root (namespaces, mounts, cgroups); "
                "run as root, and see `execbox doctor`"
            )
        self.image = image or Image.load()
        self.max_concurrency = max_concurrency or 4 * (os.cpu_count() or 1)
        self._slots = threading.BoundedSemaphore(self.max_concurrency)
        self._lock = threading.Lock()
        self._closed = False
        self._host = self._start_host()
        log.info("execbox executor ready: image %s, cgroup v%s, concurrency %d, zygote %.0f ms",
                 self.image.digest, self._host.info["cgroup_version"], self.max_concurrency,
                 self._host.info["startup_ms"])

    def _start_host(self) -> ZygoteProcess:
        try:
            return ZygoteProcess(self.image.python, self.image.zygote_env(), self.image.ro_paths,
                                 list(self.image.preload))
        except HostError as exc:
            raise SandboxUnavailable(f"{exc}; see `execbox doctor`") from exc

    def _live_host(self) -> ZygoteProcess:
        with self._lock:
            if self._closed:
                raise UsageError("this Executor is closed")
            if not self._host.alive():
                log.warning("the zygote died; starting a new one")
                self._host.close()
                self._host = self._start_host()
            return self._host

    def run(self, code: str, *, language: str = "python", stdin: bytes | str | None = None,
            files: Mapping[str, FileSource] | None = None,
            limits: Limits | Mapping[str, Any] | None = None,
            env: Mapping[str, str] | None = None,
            on_stdout: OutputCallback | None = None,
            on_stderr: OutputCallback | None = None) -> RunResult:
        """Run `code` in a fresh sandbox and return its result (never raises for the code)."""
        request = make_request(code, language=language, stdin=stdin, files=files,
                               limits=limits, env=env)
        return self.run_request(request, on_stdout=on_stdout, on_stderr=on_stderr)

    def run_request(self, request: RunRequest, *, on_stdout: OutputCallback | None = None,
                    on_stderr: OutputCallback | None = None) -> RunResult:
        run_id = new_run_id()
        limits = request.limits
        base = RunResult(
            run_id=run_id, status=Status.sandbox_error, limits=limits,
            code_sha256=hashlib.sha256(request.code.encode()).hexdigest(),
            image_digest=self.image.digest,
        )
        host = self._live_host()
        spec = {
            "timeout_s": limits.timeout_s,
            "cpu_s": limits.effective_cpu_s,
            "memory_bytes": limits.memory_mib * MIB,
            "pids": limits.pids,
            "disk_bytes": limits.disk_mib * MIB,
            "output_bytes": limits.output_bytes,
            "artifact_bytes": limits.artifact_bytes,
            "artifact_files": limits.artifact_files,
            "env": request.env,
            "input_bytes": sum(len(f.data) for f in request.files),
            "input_count": len(request.files),
        }
        with self._slots:
            try:
                raw = host.execute(
                    {"code": request.code, "run_id": run_id, "spec": spec},
                    [(f.name, f.data) for f in request.files], request.stdin,
                    limits.output_bytes, limits.timeout_s + BACKSTOP_GRACE_S,
                    on_stdout, on_stderr,
                )
            except HostError as exc:
                log.error("run %s: sandbox error: %s", run_id, exc)
                return base.model_copy(update={"error": ErrorInfo(type="SandboxError",
                                                                  message=str(exc))})
        return _result(base, raw)

    def close(self) -> None:
        """Stop the fork server; nothing the executor started keeps running."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._host.close()

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _result(base: RunResult, raw: RawRun) -> RunResult:
    meta = raw.meta
    status = Status(meta["status"])
    error = ErrorInfo(**meta["error"]) if meta.get("error") else None
    if (raw.stdout_truncated or raw.stderr_truncated) and status in (Status.ok, Status.error):
        status = Status.output_limit
        error = ErrorInfo(
            type="OutputLimitExceeded",
            message=f"output exceeded {base.limits.output_bytes} bytes on stdout or stderr; "
                    "raise limits.output_bytes (CLI --output-bytes)",
        )
    arts = [Artifact(**a, data=d) for a, d in zip(meta["artifacts"], raw.artifact_data, strict=True)]
    return base.model_copy(update={
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
        "metrics": Metrics(**meta["metrics"]),
    })


def run(code: str, *, language: str = "python", stdin: bytes | str | None = None,
        files: Mapping[str, FileSource] | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None) -> RunResult:
    """One-shot convenience: start an Executor, run `code`, close it."""
    request = make_request(code, language=language, stdin=stdin, files=files, limits=limits,
                           env=env)
    with Executor() as executor:
        return executor.run_request(request)
