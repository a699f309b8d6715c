"""What the sync and async clients share: request bodies, errors from responses, server-sent
events."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import ValidationError

from ..contract import BoundSecret, InputFile, Limits, RunResult
from ..errors import ExecboxError, UsageError
from .answer import Events as Events
from .answer import error_for
from .answer import stream_error as answer_stream_error

OutputCallback = Callable[[bytes], None]
FileSource = Any  # bytes, or a path (str / os.PathLike), as for Executor.run


class Request:
    """One HTTP call to make: method, path, JSON or raw body."""

    def __init__(
        self, method: str, path: str, *, json_body: Any = None, content: bytes | None = None
    ) -> None:
        self.method, self.path, self.json_body, self.content = method, path, json_body, content

    def kwargs(self) -> dict[str, Any]:
        if self.content is not None:
            return {
                "content": self.content,
                "headers": {"Content-Type": "application/octet-stream"},
            }
        return {"json": self.json_body} if self.json_body is not None else {}


def error(response: httpx.Response) -> ExecboxError:
    """The execbox exception for an error response."""
    return error_for(response.status_code, response.content, response.headers.get("Retry-After"))


def check(response: httpx.Response) -> httpx.Response:
    if response.is_error:
        raise error(response)
    return response


def run_body(
    code: str,
    *,
    language: str,
    stdin: bytes | str | None,
    files: Mapping[str, FileSource] | None,
    limits: Limits | Mapping[str, Any] | None,
    env: Mapping[str, str] | None,
    profile: str,
    cache: bool | None,
    secrets: Iterable[str],
    environment: str | None = None,
    network: str | Sequence[str] = "none",
    bound_secrets: Iterable[BoundSecret | Mapping[str, Any]] = (),
) -> dict[str, Any]:
    from ..request import make_request  # validates (and reads file paths) as a local run would

    request = make_request(
        code,
        language=language,
        stdin=stdin,
        files=files,
        limits=limits,
        env=env,
        profile=profile,
        network=network,
        environment=environment,
    )
    body = request.model_dump(mode="json")
    # Only the limits the caller set: the server fills the rest from the run's profile, as a
    # local run does (all of Limits' defaults would override a profile's own).
    body["limits"] = request.limits.model_dump(mode="json", exclude_unset=True)
    if environment is None:  # a server from before environments knows no such field
        del body["environment"]
    body.update(cache=cache, secrets=list(secrets))
    bound = _bound(bound_secrets)
    if bound:  # only then: a server from before bound secrets refuses the field
        body["bound_secrets"] = bound
    return body


def _bound(bound_secrets: Iterable[BoundSecret | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Bound secrets as the body carries them, checked as the server checks their shape."""
    try:
        return [BoundSecret.model_validate(b).model_dump(exclude_none=True) for b in bound_secrets]
    except ValidationError as exc:
        raise UsageError(f"bound_secrets: {exc}") from exc


def session_body(
    *,
    profile: str,
    limits: Limits | Mapping[str, Any] | None,
    env: Mapping[str, str] | None,
    files: Mapping[str, FileSource] | None,
    idle_timeout_s: float,
    max_lifetime_s: float,
    secrets: Iterable[str],
    environment: str | None = None,
    network: str | Sequence[str] = "none",
    language: str = "python",
) -> dict[str, Any]:
    from ..request import make_request

    checked = make_request(
        "",
        language=language,
        files=files,
        limits=limits,
        env=env,
        profile=profile,
        environment=environment,
        network=network,
    )
    return {
        **({"environment": environment} if environment is not None else {}),
        **({"network": checked.network} if checked.network != "none" else {}),
        **({"language": language} if language != "python" else {}),
        "profile": profile,
        "limits": checked.limits.model_dump() if limits else None,
        "env": checked.env,
        "files": [InputFile.model_dump(f, mode="json") for f in checked.files],
        "idle_timeout_s": idle_timeout_s,
        "max_lifetime_s": max_lifetime_s,
        "secrets": list(secrets),
    }


def artifact_path(path: str) -> str:
    return quote(path, safe="/")


def dispatch(
    event: tuple[str, str], on_stdout: OutputCallback | None, on_stderr: OutputCallback | None
) -> RunResult | None:
    """Hand an output event to its callback; return the result when it is the last event."""
    name, data = event
    if name == "result":
        return RunResult.model_validate_json(data)
    if name == "error":
        raise answer_stream_error(data)
    callback = on_stdout if name == "stdout" else on_stderr if name == "stderr" else None
    if callback is not None:
        callback(json.loads(data)["text"].encode())
    return None


def stream_error(response: httpx.Response, body: bytes) -> ExecboxError:
    return error(httpx.Response(response.status_code, content=body, headers=response.headers))
