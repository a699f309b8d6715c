"""The one query of the console's own: sessions as their recorded cells group them."""

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
