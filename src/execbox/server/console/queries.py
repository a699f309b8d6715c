"""The console's own queries: sessions as their recorded cells group them, and runs as the
runs list and the overview show them (a few columns, never a run's output)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from ...records import runs


@dataclass(frozen=True)
class SessionRow:
    session_id: str
    cells: int
    first_at: float
    last_at: float


def sessions(
    engine: sa.Engine, within: sa.Select[Any] | None, limit: int = 100
) -> list[SessionRow]:
    """Sessions with recorded cells, the most recently active first."""
    c = runs.c
    last = sa.func.max(c.created_at)
    query = (
        sa.select(c.session_id, sa.func.count(), sa.func.min(c.created_at), last)
        .where(c.session_id.is_not(None))
        .group_by(c.session_id)
        .order_by(last.desc())
        .limit(limit)
    )
    if within is not None:
        query = query.where(c.run_id.in_(within))
    with engine.connect() as conn:
        return [SessionRow(r[0], int(r[1]), float(r[2]), float(r[3])) for r in conn.execute(query)]


@dataclass(frozen=True)
class RunRow:
    """A run as a list shows it: what a row needs, without the result's output."""

    run_id: str
    created_at: float
    kind: str
    status: str
    language: str
    profile: str
    code_head: str
    wall_ms: float
    error_type: str | None


CODE_HEAD = 80


def run_rows(
    engine: sa.Engine,
    within: sa.Select[Any] | None,
    *,
    limit: int,
    offset: int = 0,
    status: str | None = None,
    language: str | None = None,
    profile: str | None = None,
    environment: str | None = None,
    since: float | None = None,
    code_contains: str | None = None,
) -> list[RunRow]:
    """Runs, newest first, that match every filter given. Only these columns are read: a run's
    recorded output can be megabytes, and a list of them would load it all on every poll."""
    c = runs.c
    query = (
        sa.select(
            c.run_id,
            c.created_at,
            c.kind,
            c.status,
            c.language,
            c.profile,
            sa.func.substr(c.code, 1, CODE_HEAD),
            c.result[("metrics", "wall_ms")].as_float(),
            c.result[("error", "type")].as_string(),
        )
        .order_by(c.created_at.desc())
        .limit(limit)
        .offset(offset)
    )
    for column, value in (
        (c.status, status),
        (c.language, language),
        (c.profile, profile),
        (c.environment, environment),
    ):
        if value:
            query = query.where(column == value)
    if since is not None:
        query = query.where(c.created_at >= since)
    if code_contains:
        query = query.where(c.code.contains(code_contains, autoescape=True))
    if within is not None:
        query = query.where(c.run_id.in_(within))
    with engine.connect() as conn:
        return [
            RunRow(r[0], float(r[1]), r[2], r[3], r[4], r[5], r[6], float(r[7] or 0.0), r[8])
            for r in conn.execute(query)
        ]
