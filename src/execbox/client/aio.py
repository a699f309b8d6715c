"""The asyncio client: `AsyncClient`, its `AsyncRemoteSession` and `AsyncRemoteFiles`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
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

    async def _call(self, request: Request) -> httpx.Response:
        try:
            response = await self._http.request(request.method, request.path, **request.kwargs())
        except httpx.TransportError as exc:
            raise SandboxUnavailable(f"cannot reach the execbox server: {exc}") from exc
        return check(response)

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
                    raise stream_error(response, await response.aread())
                events = Events()
                async for line in _lines(response):
                    event = events.feed(line)
                    result = event and dispatch(event, on_stdout, on_stderr)
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
            result = await self._stream("/v1/runs/stream", body, on_stdout, on_stderr)
        else:
            result = RunResult.model_validate_json(
                (await self._call(Request("POST", "/v1/runs", json_body=body))).content
            )
        arts = [
            a.model_copy(update={"data": await self.artifact(result.run_id, a.path)})
            for a in result.artifacts
        ]
        return result.model_copy(update={"artifacts": arts}) if arts else result

    async def get(self, run_id: str) -> dict[str, Any]:
        """The stored record of one of your runs."""
        response = await self._call(Request("GET", f"/v1/runs/{quote(run_id, safe='')}"))
        record: dict[str, Any] = response.json()
        return record

    async def artifact(self, run_id: str, path: str) -> bytes | None:
        """The bytes of a run's artifact; None when the server did not keep them."""
        try:
            response = await self._call(
                Request("GET", f"/v1/runs/{quote(run_id, safe='')}/artifacts/{artifact_path(path)}")
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
        environment: str | None = None,
        limits: Limits | Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        files: Mapping[str, FileSource] | None = None,
        idle_timeout_s: float = 600.0,
        max_lifetime_s: float = 3600.0,
        secrets: Iterable[str] = (),
        network: str | Sequence[str] = "none",
        language: str = "python",
    ) -> AsyncRemoteSession:
        """Start a session on the server."""
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
        info = (await self._call(Request("POST", "/v1/sessions", json_body=body))).json()
        return AsyncRemoteSession(self, info["session_id"])

    async def get_session(self, session_id: str) -> AsyncRemoteSession:
        await self._call(Request("GET", f"/v1/sessions/{quote(session_id, safe='')}"))
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
            Request("PUT", self._s._path(f"/files/{artifact_path(path)}"), content=bytes(data))
        )
        return Artifact.model_validate_json(response.content)

    async def read(self, path: str) -> bytes:
        return (
            await self._s._client._call(
                Request("GET", self._s._path(f"/files/{artifact_path(path)}"))
            )
        ).content

    async def list(self) -> list[Artifact]:
        response = await self._s._client._call(Request("GET", self._s._path("/files")))
        return [Artifact.model_validate(a) for a in response.json()]

    async def remove(self, path: str) -> None:
        await self._s._client._call(
            Request("DELETE", self._s._path(f"/files/{artifact_path(path)}"))
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
        info: dict[str, Any] = (await self._client._call(Request("GET", self._path()))).json()
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
                    await self._client._call(Request("POST", self._path("/cells"), json_body=body))
                ).content
            )
        arts = [
            a.model_copy(update={"data": await self.files.read(a.path)}) for a in result.artifacts
        ]
        return result.model_copy(update={"artifacts": arts}) if arts else result

    async def close(self) -> None:
        await self._client._call(Request("DELETE", self._path()))

    async def __aenter__(self) -> AsyncRemoteSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
