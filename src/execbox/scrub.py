"""Redaction stage of the pipeline: every text of a result the code produced, and its live output."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .contract import Artifact, NetworkConnection, RunResult
from .redact import Redactor
from .redact.live import LiveRedactor
from .sandbox.host.pump import OutputCallback
from .sandbox.inside.runner import CUT_HEAD, CUT_TAIL


class _Guarded:
    """A caller's output callback that is not called again once it raised: the run goes on to
    its end and is recorded, and the pipeline raises the exception after (`LiveOutput`)."""

    def __init__(self, callback: OutputCallback) -> None:
        self.callback = callback
        self.failure: BaseException | None = None

    def __call__(self, data: bytes) -> None:
        if self.failure is None:
            try:
                self.callback(data)
            except BaseException as exc:  # a KeyboardInterrupt too: raised once recorded
                self.failure = exc


@dataclass
class LiveOutput:
    """A run's output callbacks, redacted as the result will be (None where the caller gave
    none), and what one of the caller's callbacks raised."""

    on_stdout: OutputCallback | None
    on_stderr: OutputCallback | None
    guards: tuple[_Guarded, ...]

    def raise_failure(self) -> None:
        """Raise what a caller's callback raised during the run, if anything."""
        for guard in self.guards:
            if guard.failure is not None:
                raise guard.failure


@contextlib.contextmanager
def live_output(
    redactor: Redactor, on_stdout: OutputCallback | None, on_stderr: OutputCallback | None
) -> Iterator[LiveOutput]:
    """The output callbacks behind a `LiveRedactor` each: what they see is redacted as the
    result will be. What is held back is released when the run ends, on every path (on an
    error too, and a callback failing then does not hide the error)."""
    if on_stdout is None and on_stderr is None:
        yield LiveOutput(None, None, ())
        return
    guards = tuple(_Guarded(cb) for cb in (on_stdout, on_stderr) if cb is not None)
    callbacks = iter(guards)
    out = LiveRedactor(redactor, next(callbacks)) if on_stdout is not None else None
    err = LiveRedactor(redactor, next(callbacks)) if on_stderr is not None else None
    streams = (out, err)
    try:
        yield LiveOutput(out.write if out else None, err.write if err else None, guards)
    finally:
        for stream in streams:
            if stream is not None:
                stream.close()


def redact_result(result: RunResult, redactor: Redactor) -> RunResult:
    """Scrub secrets from everything the code produced as text."""
    stdout, stderr = redactor.redact_end(result.stdout), redactor.redact_end(result.stderr)
    if (
        stdout is result.stdout
        and stderr is result.stderr
        and not result.outputs
        and result.error is None
        and not result.artifacts
        and not result.network_log
    ):
        return result  # nothing to scrub (`redact` returns its argument then): no copy
    update: dict[str, Any] = {"stdout": stdout, "stderr": stderr}
    if result.outputs:  # every one: the code chooses the MIME type, so any may hold text
        # A MIME type is the code's text too, cut at 200 characters by the sandbox.
        update["outputs"] = [
            o.model_copy(
                update={
                    "mime_type": redactor.redact_end(o.mime_type),
                    "data": redactor.redact(o.data),
                }
            )
            for o in result.outputs
        ]
    if result.error is not None:
        error = result.error
        update["error"] = error.model_copy(
            update={
                "type": redact_cut(redactor, error.type),  # the code names its exception
                "message": redact_cut(redactor, error.message),
                "traceback": redact_cut(redactor, error.traceback) if error.traceback else None,
                "rule": redactor.redact(error.rule) if error.rule else None,
            }
        )
    if result.artifacts:
        update["artifacts"] = redact_paths(result.artifacts, redactor)
    if result.network_log:
        update["network_log"] = redact_network_log(result.network_log, redactor)
    return result.model_copy(update=update)


def redact_network_log(
    entries: list[NetworkConnection], redactor: Redactor
) -> list[NetworkConnection]:
    """The hosts and methods the code asked its proxy for, scrubbed."""
    return [
        e.model_copy(
            update={
                "method": redactor.redact(e.method),
                "host": redactor.redact(e.host),
                "message": redactor.redact(e.message) if e.message else None,
            }
        )
        for e in entries
    ]


def redact_cut(redactor: Redactor, text: str) -> str:
    """`redactor.redact(text)`, and where the sandbox cut the text to a cap (its CUT_HEAD and
    CUT_TAIL marks) also the part of a secret the cut left on either side of the mark."""
    text = redactor.redact(text)
    if CUT_HEAD not in text and CUT_TAIL not in text:
        return text
    parts = re.split(f"({re.escape(CUT_HEAD)}|{re.escape(CUT_TAIL)})", text)
    for i in range(0, len(parts), 2):  # texts at even indexes, marks between them
        if i > 0 and parts[i - 1] == CUT_HEAD:
            parts[i] = redactor.redact_start(parts[i])
        if i + 1 < len(parts) and parts[i + 1] == CUT_TAIL:
            parts[i] = redactor.redact_end(parts[i])
    return "".join(parts)


def redact_paths(artifacts: list[Artifact], redactor: Redactor) -> list[Artifact]:
    """The artifacts with their paths redacted (the bytes stay as written). A path is also a
    key (downloads by name, the record's artifact blobs): a redacted path that another
    artifact already has gets a ``~N`` suffix, so each stays unique."""
    paths = [redactor.redact(a.path) for a in artifacts]
    if all(p is a.path for p, a in zip(paths, artifacts, strict=True)):
        return artifacts
    taken = {p for p, a in zip(paths, artifacts, strict=True) if p is a.path}
    out: list[Artifact] = []
    for path, art in zip(paths, artifacts, strict=True):
        if path is not art.path:
            unique, n = path, 1
            while unique in taken:
                n += 1
                unique = f"{path}~{n}"
            taken.add(unique)
            art = art.model_copy(update={"path": unique})
        out.append(art)
    return out
