"""Errors as JSON: every failure the API returns is `{"error": {"code", "message"}}` with a
stable `code`, translated from execbox's exceptions in one place."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import (
    ExecboxError,
    Overloaded,
    RecordsError,
    SandboxUnavailable,
    SessionClosed,
    UsageError,
)

log = logging.getLogger(__name__)


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable machine-readable error code, e.g. 'rate_limited'.")
    message: str = Field(description="What went wrong and what to do about it.")


class ErrorBody(BaseModel):
    """The body of every error response."""

    error: ErrorDetail


class ApiError(Exception):
    """An error response: HTTP status, stable code, message, optional Retry-After seconds."""

    def __init__(
        self, status: int, code: str, message: str, *, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after


def translate(exc: ExecboxError) -> ApiError:
    """The API error for an execbox exception."""
    if isinstance(exc, SessionClosed):
        return ApiError(409, "session_closed", str(exc))
    if isinstance(exc, Overloaded):
        return ApiError(503, "overloaded", str(exc), retry_after=1)
    if isinstance(exc, SandboxUnavailable):
        return ApiError(503, "sandbox_unavailable", str(exc))
    if isinstance(exc, UsageError):
        return ApiError(400, "bad_request", str(exc))
    if isinstance(exc, RecordsError):
        return ApiError(500, "records_error", str(exc))
    return ApiError(500, "sandbox_error", str(exc))


def _error_response(err: ApiError) -> JSONResponse:
    headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else None
    if err.status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    return JSONResponse(
        {"error": {"code": err.code, "message": err.message}},
        status_code=err.status,
        headers=headers,
    )


_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "request_too_large",
    415: "unsupported_media_type",
}


def install(app: FastAPI, count: Callable[[str], None] = lambda _code: None) -> None:
    """Register the handlers that turn every failure into an ErrorBody; `count(code)` is
    called for each (metrics)."""

    def error_response(err: ApiError) -> JSONResponse:
        count(err.code)
        return _error_response(err)

    async def on_api_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc)

    async def on_execbox_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ExecboxError)
        return error_response(translate(exc))

    async def on_validation(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        parts = []
        for item in exc.errors()[:5]:
            where = ".".join(str(p) for p in item.get("loc", ()))
            parts.append(f"{where}: {item.get('msg', 'invalid')}")
        return error_response(ApiError(422, "invalid_request", "; ".join(parts) or "invalid"))

    async def on_http(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
        return error_response(ApiError(exc.status_code, code, str(exc.detail)))

    async def on_unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return error_response(ApiError(500, "internal_error", "internal server error"))

    for kind, handler in (
        (ApiError, on_api_error),
        (ExecboxError, on_execbox_error),
        (RequestValidationError, on_validation),
        (StarletteHTTPException, on_http),
        (Exception, on_unexpected),
    ):
        app.add_exception_handler(kind, _releasing(handler))


Handler = Callable[[Request, Exception], Awaitable[JSONResponse]]


def _releasing(handler: Handler) -> Handler:
    """`handler`, then the failed frames' locals let go: an exception and its traceback's frames
    form a cycle only the collector frees, and those frames hold the request's body (raw and
    parsed, up to the request cap each); 16 invalid 32 MiB bodies held the server 600 MiB
    larger until a collection came."""

    async def releasing(request: Request, exc: Exception) -> JSONResponse:
        try:
            return await handler(request, exc)
        finally:
            traceback.clear_frames(exc.__traceback__)
            if isinstance(exc, RequestValidationError):
                exc.body = None  # FastAPI keeps the parsed body on the error too

    return releasing


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for error statuses a route can return."""
    return {s: {"model": ErrorBody, "description": "error"} for s in statuses}
