"""`execbox.Client` and `execbox.AsyncClient`: the HTTP API with the local Executor's methods.

    ex = execbox.Executor()                                   # local
    ex = execbox.Client("http://127.0.0.1:8000", api_key)     # remote: the same calls follow
    r = ex.run("print(1)", limits={"timeout_s": 2})           # -> RunResult, artifacts' .data set
    with ex.session() as s:
        s.run("x = 41"); s.run("x + 1").outputs

Errors come back as the same exceptions: UsageError (bad input, unknown run or session, auth),
Overloaded (quotas and back-pressure: retry later), SessionClosed, SandboxUnavailable.
Passing `on_stdout`/`on_stderr` streams the output (server-sent events) as it is written.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from .contract import Artifact, InputFile, Limits, RunResult
from .errors import (
    ExecboxError,
    Overloaded,
    RecordsError,
    SandboxError,
    SandboxUnavailable,
    SessionClosed,
    UsageError,
)

OutputCallback = Callable[[bytes], None]
FileSource = Any  # bytes, or a path (str / os.PathLike), as for Executor.run

# Quotas, back-pressure and a server going down: retry later (Overloaded, as locally).
_RETRY_LATER = {
    "overloaded",
    "rate_limited",
    "concurrency_limited",
    "session_quota",
    "server_shutting_down",
}


class _Request:
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


def _error(response: httpx.Response) -> ExecboxError:
    """The execbox exception for an error response."""
    try:
        detail = response.json()["error"]
        code, message = str(detail["code"]), str(detail["message"])
    except (ValueError, KeyError, TypeError):
        code, message = f"http_{response.status_code}", response.text[:500]
    text = f"{message} [{code}, HTTP {response.status_code}]"
    if code == "session_closed":
        return SessionClosed(text)
    if code in _RETRY_LATER:
        return Overloaded(
            text
            + (
                f"; retry after {response.headers['Retry-After']} s"
                if "Retry-After" in response.headers
                else ""
            )
        )
    if code in ("sandbox_unavailable", "not_ready"):
        return SandboxUnavailable(text)
    if code == "records_error":
        return RecordsError(text)
    if response.status_code < 500:
        return UsageError(text)
    return SandboxError(text)


def _check(response: httpx.Response) -> httpx.Response:
    if response.is_error:
        raise _error(response)
    return response


def _run_body(
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
) -> dict[str, Any]:
    from .request import make_request  # validates (and reads file paths) as a local run would

    request = make_request(
        code, language=language, stdin=stdin, files=files, limits=limits, env=env, profile=profile
    )
    body = request.model_dump(mode="json")
    body.update(cache=cache, secrets=list(secrets))
    return body


def _session_body(
    *,
    profile: str,
    limits: Limits | Mapping[str, Any] | None,
    env: Mapping[str, str] | None,
    files: Mapping[str, FileSource] | None,
    idle_timeout_s: float,
    max_lifetime_s: float,
    secrets: Iterable[str],
) -> dict[str, Any]:
    from .request import make_request

    checked = make_request("", files=files, limits=limits, env=env, profile=profile)
    return {
        "profile": profile,
        "limits": checked.limits.model_dump() if limits else None,
        "env": checked.env,
        "files": [InputFile.model_dump(f, mode="json") for f in checked.files],
        "idle_timeout_s": idle_timeout_s,
        "max_lifetime_s": max_lifetime_s,
        "secrets": list(secrets),
    }


def _artifact_path(path: str) -> str:
    return quote(path, safe="/")


class _Events:
    """Server-sent events parser: feed lines, get (event, data) at each blank line."""

    def __init__(self) -> None:
        self.name, self.data = "message", []  # type: tuple[str, list[str]]

    def feed(self, line: str) -> tuple[str, str] | None:
        if not line:
            if not self.data:
                return None
            done = (self.name, "\n".join(self.data))
            self.name, self.data = "message", []
            return done
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            self.name = value
        elif field == "data":
            self.data.append(value)
        return None


def _dispatch(
    event: tuple[str, str], on_stdout: OutputCallback | None, on_stderr: OutputCallback | None
) -> RunResult | None:
    """Hand an output event to its callback; return the result when it is the last event."""
    name, data = event
    if name == "result":
        return RunResult.model_validate_json(data)
    if name == "error":
        try:
            status = int(json.loads(data).get("status", 500))
        except (ValueError, AttributeError, TypeError):
            status = 500
        raise _error(
            httpx.Response(
                status, content=data.encode(), headers={"Content-Type": "application/json"}
            )
        )
    callback = on_stdout if name == "stdout" else on_stderr if name == "stderr" else None
    if callback is not None:
        callback(json.loads(data)["text"].encode())
    return None


def _stream_error(response: httpx.Response, body: bytes) -> ExecboxError:
    return _error(httpx.Response(response.status_code, content=body, headers=response.headers))


# ---- synchronous ---------------------------------------------------------------------------


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

    def _call(self, request: _Request) -> httpx.Response:
        try:
            response = self._http.request(request.method, request.path, **request.kwargs())
        except httpx.TransportError as exc:
            raise SandboxUnavailable(f"cannot reach the execbox server: {exc}") from exc
        return _check(response)

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
                    raise _stream_error(response, response.read())
                events = _Events()
                for line in response.iter_lines():
                    event = events.feed(line)
                    result = event and _dispatch(event, on_stdout, on_stderr)
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
        cache: bool | None = None,
        secrets: Iterable[str] = (),
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> RunResult:
        """Run `code` on the server; the result has its artifacts' bytes in `.data`."""
        body = _run_body(
            code,
            language=language,
            stdin=stdin,
            files=files,
            limits=limits,
            env=env,
            profile=profile,
            cache=cache,
            secrets=secrets,
        )
        if on_stdout is not None or on_stderr is not None:
            result = self._stream("/v1/runs/stream", body, on_stdout, on_stderr)
        else:
            result = RunResult.model_validate_json(
                self._call(_Request("POST", "/v1/runs", json_body=body)).content
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
            _Request("GET", f"/v1/runs/{quote(run_id, safe='')}")
        ).json()
        return record

    def artifact(self, run_id: str, path: str) -> bytes | None:
        """The bytes of a run's artifact; None when the server did not keep them."""
        try:
            return self._call(
                _Request(
                    "GET", f"/v1/runs/{quote(run_id, safe='')}/artifacts/{_artifact_path(path)}"
                )
            ).content
        except UsageError as exc:
            if "artifact_not_found" in str(exc):
                return None
            raise

    def session(
        self,
        *,
        profile: str = "data",
        limits: Limits | Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        files: Mapping[str, FileSource] | None = None,
        idle_timeout_s: float = 600.0,
        max_lifetime_s: float = 3600.0,
        secrets: Iterable[str] = (),
    ) -> RemoteSession:
        """Start a session on the server (a stateful interpreter with its own workspace)."""
        body = _session_body(
            profile=profile,
            limits=limits,
            env=env,
            files=files,
            idle_timeout_s=idle_timeout_s,
            max_lifetime_s=max_lifetime_s,
            secrets=secrets,
        )
        info = self._call(_Request("POST", "/v1/sessions", json_body=body)).json()
        return RemoteSession(self, info["session_id"])

    def get_session(self, session_id: str) -> RemoteSession:
        """An existing session of yours, by id."""
        self._call(_Request("GET", f"/v1/sessions/{quote(session_id, safe='')}"))
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
            _Request("PUT", self._s._path(f"/files/{_artifact_path(path)}"), content=bytes(data))
        )
        return Artifact.model_validate_json(response.content)

    def read(self, path: str) -> bytes:
        return self._s._client._call(
            _Request("GET", self._s._path(f"/files/{_artifact_path(path)}"))
        ).content

    def list(self) -> list[Artifact]:
        response = self._s._client._call(_Request("GET", self._s._path("/files")))
        return [Artifact.model_validate(a) for a in response.json()]

    def remove(self, path: str) -> None:
        self._s._client._call(_Request("DELETE", self._s._path(f"/files/{_artifact_path(path)}")))


class RemoteSession:
    """A session on the server, with the local Session's methods."""

    def __init__(self, client: Client, session_id: str) -> None:
        self._client = client
        self.id = session_id
        self.files = RemoteFiles(self)

    def _path(self, suffix: str = "") -> str:
        return f"/v1/sessions/{quote(self.id, safe='')}{suffix}"

    def _info(self) -> dict[str, Any]:
        info: dict[str, Any] = self._client._call(_Request("GET", self._path())).json()
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
                self._client._call(_Request("POST", self._path("/cells"), json_body=body)).content
            )
        return Client._with_data(result, lambda a: self.files.read(a.path))

    def close(self) -> None:
        self._client._call(_Request("DELETE", self._path()))

    def __enter__(self) -> RemoteSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# ---- asynchronous --------------------------------------------------------------------------


class AsyncClient:
    """`Client` for asyncio code: the same methods, awaited."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s, transport=transport
        )

    async def _call(self, request: _Request) -> httpx.Response:
        try:
            response = await self._http.request(request.method, request.path, **request.kwargs())
        except httpx.TransportError as exc:
            raise SandboxUnavailable(f"cannot reach the execbox server: {exc}") from exc
        return _check(response)

    async def _stream(
        self,
        path: str,
        body: dict[str, Any],
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
    ) -> RunResult:
        try:
            async with self._http.stream("POST", path, json=body) as response:
                if response.is_error:
                    raise _stream_error(response, await response.aread())
                events = _Events()
                async for line in _lines(response):
                    event = events.feed(line)
                    result = event and _dispatch(event, on_stdout, on_stderr)
                    if result is not None:
                        return result
        except httpx.TransportError as exc:
            raise SandboxUnavailable(f"lost the execbox server mid-run: {exc}") from exc
        raise SandboxError("the server ended the stream without a result")

    async def run(
        self,
        code: str,
        *,
        language: str = "python",
        stdin: bytes | str | None = None,
        files: Mapping[str, FileSource] | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        profile: str = "data",
        cache: bool | None = None,
        secrets: Iterable[str] = (),
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> RunResult:
        """Run `code` on the server; the result has its artifacts' bytes in `.data`."""
        body = _run_body(
            code,
            language=language,
            stdin=stdin,
            files=files,
            limits=limits,
            env=env,
            profile=profile,
            cache=cache,
            secrets=secrets,
        )
        if on_stdout is not None or on_stderr is not None:
            result = await self._stream("/v1/runs/stream", body, on_stdout, on_stderr)
        else:
            result = RunResult.model_validate_json(
                (await self._call(_Request("POST", "/v1/runs", json_body=body))).content
            )
        arts = [
            a.model_copy(update={"data": await self.artifact(result.run_id, a.path)})
            for a in result.artifacts
        ]
        return result.model_copy(update={"artifacts": arts}) if arts else result

    async def get(self, run_id: str) -> dict[str, Any]:
        """The stored record of one of your runs."""
        response = await self._call(_Request("GET", f"/v1/runs/{quote(run_id, safe='')}"))
        record: dict[str, Any] = response.json()
        return record

    async def artifact(self, run_id: str, path: str) -> bytes | None:
        """The bytes of a run's artifact; None when the server did not keep them."""
        try:
            response = await self._call(
                _Request(
                    "GET", f"/v1/runs/{quote(run_id, safe='')}/artifacts/{_artifact_path(path)}"
                )
            )
        except UsageError as exc:
            if "artifact_not_found" in str(exc):
                return None
            raise
        return response.content

    async def session(
        self,
        *,
        profile: str = "data",
        limits: Limits | Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        files: Mapping[str, FileSource] | None = None,
        idle_timeout_s: float = 600.0,
        max_lifetime_s: float = 3600.0,
        secrets: Iterable[str] = (),
    ) -> AsyncRemoteSession:
        """Start a session on the server."""
        body = _session_body(
            profile=profile,
            limits=limits,
            env=env,
            files=files,
            idle_timeout_s=idle_timeout_s,
            max_lifetime_s=max_lifetime_s,
            secrets=secrets,
        )
        info = (await self._call(_Request("POST", "/v1/sessions", json_body=body))).json()
        return AsyncRemoteSession(self, info["session_id"])

    async def get_session(self, session_id: str) -> AsyncRemoteSession:
        await self._call(_Request("GET", f"/v1/sessions/{quote(session_id, safe='')}"))
        return AsyncRemoteSession(self, session_id)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


async def _lines(response: httpx.Response) -> AsyncIterator[str]:
    async for line in response.aiter_lines():
        yield line


class AsyncRemoteFiles:
    def __init__(self, session: AsyncRemoteSession) -> None:
        self._s = session

    async def write(self, path: str, data: bytes) -> Artifact:
        response = await self._s._client._call(
            _Request("PUT", self._s._path(f"/files/{_artifact_path(path)}"), content=bytes(data))
        )
        return Artifact.model_validate_json(response.content)

    async def read(self, path: str) -> bytes:
        return (
            await self._s._client._call(
                _Request("GET", self._s._path(f"/files/{_artifact_path(path)}"))
            )
        ).content

    async def list(self) -> list[Artifact]:
        response = await self._s._client._call(_Request("GET", self._s._path("/files")))
        return [Artifact.model_validate(a) for a in response.json()]

    async def remove(self, path: str) -> None:
        await self._s._client._call(
            _Request("DELETE", self._s._path(f"/files/{_artifact_path(path)}"))
        )


class AsyncRemoteSession:
    """A session on the server, for asyncio code."""

    def __init__(self, client: AsyncClient, session_id: str) -> None:
        self._client = client
        self.id = session_id
        self.files = AsyncRemoteFiles(self)

    def _path(self, suffix: str = "") -> str:
        return f"/v1/sessions/{quote(self.id, safe='')}{suffix}"

    async def info(self) -> dict[str, Any]:
        """`{session_id, closed, end_reason}` as the server sees it now."""
        info: dict[str, Any] = (await self._client._call(_Request("GET", self._path()))).json()
        return info

    async def run(
        self,
        code: str,
        *,
        timeout_s: float | None = None,
        secrets: Iterable[str] = (),
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> RunResult:
        body = {"code": code, "timeout_s": timeout_s, "secrets": list(secrets)}
        if on_stdout is not None or on_stderr is not None:
            result = await self._client._stream(
                self._path("/cells/stream"), body, on_stdout, on_stderr
            )
        else:
            result = RunResult.model_validate_json(
                (
                    await self._client._call(_Request("POST", self._path("/cells"), json_body=body))
                ).content
            )
        arts = [
            a.model_copy(update={"data": await self.files.read(a.path)}) for a in result.artifacts
        ]
        return result.model_copy(update={"artifacts": arts}) if arts else result

    async def close(self) -> None:
        await self._client._call(_Request("DELETE", self._path()))

    async def __aenter__(self) -> AsyncRemoteSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
