"""A caller's arguments made into a validated `RunRequest`, and the counts they give checked;
a bad value is a UsageError that says what is wrong."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .contract import BoundSecret, Limits, RunRequest
from .errors import UsageError
from .network.egress import NO_PROXY_VARS, PROXY_VARS
from .network.secrets import BUNDLE_NAME, CA_VARS, Binding, bind

__all__ = [
    "FileSource",
    "bind_secrets",
    "check_count",
    "check_settings",
    "make_request",
    "new_run_id",
]

FileSource = bytes | str | os.PathLike[str]


def new_run_id() -> str:
    """A random UUID (version 4) as 32 hex digits, as `uuid.uuid4().hex` makes it, without
    building a `UUID` object (its Python constructor is most of uuid4's cost, every run)."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # RFC 4122 variant
    return raw.hex()


def make_request(
    code: str | bytes,
    *,
    language: str = "python",
    stdin: bytes | str | None = None,
    files: Mapping[str, FileSource] | None = None,
    limits: Limits | Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    profile: str = "data",
    network: str | Sequence[str] = "none",
    environment: str | None = None,
) -> RunRequest:
    """Build and validate a RunRequest; UsageError says what is wrong. `code` given as bytes is
    decoded as CPython decodes a source file (see `RunRequest`). `environment`: the named
    environment it runs in (None: the executor's default)."""
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
        return RunRequest.model_validate(
            {
                "language": language,
                "code": code,
                "stdin": stdin.encode() if isinstance(stdin, str) else (stdin or b""),
                "files": inputs,
                "limits": limits if limits is not None else Limits(),
                "env": dict(env or {}),
                "profile": profile,
                "network": network if isinstance(network, str) else list(network),
                "environment": environment,
            }
        )
    except ValidationError as exc:
        raise UsageError(str(exc)) from exc


def bind_secrets(
    bound: Sequence[BoundSecret | Mapping[str, Any]], request: RunRequest
) -> tuple[Binding, ...]:
    """The bindings of `request`'s secrets bound to hosts, each with a fresh placeholder;
    UsageError says what is wrong (see `network.secrets.bind`)."""
    if not bound:
        return ()
    items = [b.model_dump() if isinstance(b, BoundSecret) else dict(b) for b in bound]
    if any(f.name == BUNDLE_NAME for f in request.files):
        raise UsageError(f"input file name {BUNDLE_NAME!r} is the run CA bundle's")
    for item in items:
        if item.get("name") in (*PROXY_VARS, *NO_PROXY_VARS, *CA_VARS):
            raise UsageError(f"bound secret {item['name']}: the proxy sets that variable")
    try:
        return bind(items, request.network, request.env)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def check_count(name: str, value: object, least: int) -> None:
    """UsageError unless `value` is an integer of at least `least` (a bool is no count)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise UsageError(f"{name} must be an integer >= {least}, got {value!r}")


def check_settings(
    *,
    max_concurrency: int | None,
    pool_size: int | None,
    max_queue: int,
    queue_timeout_s: float,
    max_sessions: int,
    rotate_after_runs: int | None,
    rotate_after_s: float | None,
    zygotes_per_tenant: bool,
    tenant_idle_s: float,
    environment_idle_s: float = 300.0,
) -> None:
    """UsageError unless the `Executor`'s settings of these names are in range."""
    for name, value, least in (
        ("max_concurrency", max_concurrency, 1),
        ("pool_size", pool_size, 1),
    ):
        if value is not None:
            check_count(name, value, least)
    check_count("max_queue", max_queue, 0)
    check_count("max_sessions", max_sessions, 0)
    if rotate_after_runs is not None:
        check_count("rotate_after_runs", rotate_after_runs, 0)
    for name, seconds in (
        ("rotate_after_s", rotate_after_s),
        ("tenant_idle_s", tenant_idle_s),
        ("environment_idle_s", environment_idle_s),
    ):
        if seconds is not None and (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not 0 <= seconds < float("inf")
        ):
            raise UsageError(f"{name} must be a number of seconds >= 0, got {seconds!r}")
    if not isinstance(zygotes_per_tenant, bool):
        raise UsageError(f"zygotes_per_tenant must be True or False, got {zygotes_per_tenant!r}")
    if zygotes_per_tenant and not tenant_idle_s:
        raise UsageError("tenant_idle_s must be > 0 with zygotes_per_tenant")
    if not environment_idle_s:
        raise UsageError("environment_idle_s must be > 0 (a host per environment must close)")
    if (
        isinstance(queue_timeout_s, bool)
        or not isinstance(queue_timeout_s, (int, float))
        or not 0 <= queue_timeout_s < float("inf")
    ):
        raise UsageError(
            f"queue_timeout_s must be a number of seconds >= 0, got {queue_timeout_s!r}"
        )
