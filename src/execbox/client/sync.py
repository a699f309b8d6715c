"""The blocking client: `Client`, its `RemoteSession` and `RemoteFiles`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from ..contract import Artifact, BoundSecret, Limits, RunResult
from ..errors import (
    SandboxError,
    SandboxUnavailable,
    UsageError,
)
from .wire import (
    Events,
    FileSource,
    OutputCallback,
    Request,
    artifact_path,
    check,
    dispatch,
    run_body,
    session_body,
    stream_error,
)


class Client:
    """The HTTP API, with the local Executor's method names and result types. Thread-safe."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 600.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s, transport=transport
        )

    def _call(self, request: Request) -> httpx.Response:
        try:
            response = self._http.request(request.method, request.path, **request.kwargs())
        except httpx.TransportError as exc:
            raise SandboxUnavailable(f"cannot reach the execbox server: {exc}") from exc
        return check(response)

    def _stream(
        self,
        path: str,
        body: dict[str, Any],
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
    ) -> RunResult:
        try:
            with self._http.stream("POST", path, json=body) as response:
                if response.is_error:
                    raise stream_error(response, response.read())
                events = Events()
                for line in response.iter_lines():
                    event = events.feed(line)
                    result = event and dispatch(event, on_stdout, on_stderr)
                    if result is not None:
                        return result
        except httpx.TransportError as exc:
            raise SandboxUnavailable(f"lost the execbox server mid-run: {exc}") from exc
        raise SandboxError("the server ended the stream without a result")

    def run(
        self,
        code: str,
        *,
        language: str = "python",
        stdin: bytes | str | None = None,
        files: Mapping[str, FileSource] | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        profile: str = "data",
        environment: str | None = None,
        cache: bool | None = None,
        secrets: Iterable[str] = (),
        network: str | Sequence[str] = "none",
        bound_secrets: Iterable[BoundSecret | Mapping[str, Any]] = (),
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> RunResult:
        """Run `code` on the server; the result has its artifacts' bytes in `.data`."""
        body = run_body(
            code,
            language=language,
            stdin=stdin,
            files=files,
            limits=limits,
            env=env,
            profile=profile,
            environment=environment,
            cache=cache,
            secrets=secrets,
            network=network,
            bound_secrets=bound_secrets,
        )
        if on_stdout is not None or on_stderr is not None:
            result = self._stream("/v1/runs/stream", body, on_stdout, on_stderr)
        else:
            result = RunResult.model_validate_json(
                self._call(Request("POST", "/v1/runs", json_body=body)).content
            )
        return self._with_data(result, lambda a: self.artifact(result.run_id, a.path))

    @staticmethod
    def _with_data(result: RunResult, fetch: Callable[[Artifact], bytes | None]) -> RunResult:
        if not result.artifacts:
            return result
        return result.model_copy(
            update={
                "artifacts": [a.model_copy(update={"data": fetch(a)}) for a in result.artifacts]
            }
        )

    def get(self, run_id: str) -> dict[str, Any]:
        """The stored record of one of your runs (as `execbox runs show --json` prints it)."""
        record: dict[str, Any] = self._call(
            Request("GET", f"/v1/runs/{quote(run_id, safe='')}")
        ).json()
        return record

    def artifact(self, run_id: str, path: str) -> bytes | None:
        """The bytes of a run's artifact; None when the server did not keep them."""
        try:
            return self._call(
                Request("GET", f"/v1/runs/{quote(run_id, safe='')}/artifacts/{artifact_path(path)}")
            ).content
        except UsageError as exc:
            if "artifact_not_found" in str(exc):
                return None
            raise

    def session(
        self,
        *,
        profile: str = "data",
        environment: str | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        files: Mapping[str, FileSource] | None = None,
        idle_timeout_s: float = 600.0,
        max_lifetime_s: float = 3600.0,
        secrets: Iterable[str] = (),
        network: str | Sequence[str] = "none",
        language: str = "python",
    ) -> RemoteSession:
        """Start a session on the server (a stateful interpreter with its own workspace)."""
        body = session_body(
            profile=profile,
            environment=environment,
            limits=limits,
            env=env,
            files=files,
            idle_timeout_s=idle_timeout_s,
            max_lifetime_s=max_lifetime_s,
            secrets=secrets,
            network=network,
            language=language,
        )
        info = self._call(Request("POST", "/v1/sessions", json_body=body)).json()
        return RemoteSession(self, info["session_id"])

    def get_session(self, session_id: str) -> RemoteSession:
        """An existing session of yours, by id."""
        self._call(Request("GET", f"/v1/sessions/{quote(session_id, safe='')}"))
        return RemoteSession(self, session_id)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class RemoteFiles:
    """A remote session's workspace files: write, read, list, remove."""

    def __init__(self, session: RemoteSession) -> None:
        self._s = session

    def write(self, path: str, data: bytes) -> Artifact:
        response = self._s._client._call(
            Request("PUT", self._s._path(f"/files/{artifact_path(path)}"), content=bytes(data))
        )
        return Artifact.model_validate_json(response.content)

    def read(self, path: str) -> bytes:
        return self._s._client._call(
            Request("GET", self._s._path(f"/files/{artifact_path(path)}"))
        ).content

    def list(self) -> list[Artifact]:
        response = self._s._client._call(Request("GET", self._s._path("/files")))
        return [Artifact.model_validate(a) for a in response.json()]

    def remove(self, path: str) -> None:
        self._s._client._call(Request("DELETE", self._s._path(f"/files/{artifact_path(path)}")))


class RemoteSession:
    """A session on the server, with the local Session's methods."""

    def __init__(self, client: Client, session_id: str) -> None:
        self._client = client
        self.id = session_id
        self.files = RemoteFiles(self)

    def _path(self, suffix: str = "") -> str:
        return f"/v1/sessions/{quote(self.id, safe='')}{suffix}"

    def _info(self) -> dict[str, Any]:
        info: dict[str, Any] = self._client._call(Request("GET", self._path())).json()
        return info

    @property
    def closed(self) -> bool:
        return bool(self._info()["closed"])

    @property
    def end_reason(self) -> str | None:
        reason: str | None = self._info()["end_reason"]
        return reason

    def run(
        self,
        code: str,
        *,
        timeout_s: float | None = None,
        secrets: Iterable[str] = (),
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> RunResult:
        """Run a cell; artifacts (files the cell created or changed) carry their bytes."""
        body = {"code": code, "timeout_s": timeout_s, "secrets": list(secrets)}
        if on_stdout is not None or on_stderr is not None:
            result = self._client._stream(self._path("/cells/stream"), body, on_stdout, on_stderr)
        else:
            result = RunResult.model_validate_json(
                self._client._call(Request("POST", self._path("/cells"), json_body=body)).content
            )
        return Client._with_data(result, lambda a: self.files.read(a.path))

    def close(self) -> None:
        self._client._call(Request("DELETE", self._path()))

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
