"""The records' tables (SQLAlchemy Core), and the columns added since the first release."""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("created_at", sa.Float, nullable=False, index=True),
    sa.Column("kind", sa.String(16), nullable=False),  # run | replay | approval | cache_hit
    # Indexed only where a query looks: each index is one more page written per record.
    sa.Column("source_run_id", sa.String(64)),
    sa.Column("session_id", sa.String(64), index=True),
    sa.Column("language", sa.String(32), nullable=False),
    sa.Column("profile", sa.String(64), nullable=False),
    sa.Column("code", sa.Text, nullable=False),
    sa.Column("code_sha256", sa.String(64), nullable=False),
    sa.Column("stdin_sha256", sa.String(64), nullable=False),
    sa.Column("inputs", sa.JSON, nullable=False),  # [{name, size, sha256}]
    sa.Column("env", sa.JSON, nullable=False),  # values redacted
    sa.Column("policy", sa.JSON, nullable=False),  # {decision, rule, message, line}
    sa.Column("limits", sa.JSON, nullable=False),
    sa.Column("image_digest", sa.String(80), nullable=False),
    sa.Column("status", sa.String(32), nullable=False, index=True),
    sa.Column("result", sa.JSON, nullable=False),  # the RunResult as returned (redacted)
    sa.Column("cache_key", sa.String(64)),
    sa.Column("approved_at", sa.Float),
    sa.Column("approved_by", sa.String(200)),
    sa.Column("sealed", sa.JSON),  # what was redacted before storing (`atrest`), or null
    sa.Column("network", sa.JSON),  # the request's network: "none" or its allowlist
    # The top-level module a ModuleNotFoundError named (`execbox env requests`), or null.
    sa.Column("missing_module", sa.String(200)),
    sa.Column("environment", sa.String(32)),  # the environment it named; null: the default
    # A held run turned down (it never runs): when, and by whom.
    sa.Column("rejected_at", sa.Float),
    sa.Column("rejected_by", sa.String(200)),
)
# Columns added after the first release: a database made before gets them on opening.
ADDED_COLUMNS = (
    "sealed",
    "network",
    "missing_module",
    "environment",
    "rejected_at",
    "rejected_by",
)

blobs = sa.Table(
    "blobs",
    metadata,
    sa.Column("sha256", sa.String(64), primary_key=True),
    sa.Column("data", sa.LargeBinary, nullable=False),
)

artifact_blobs = sa.Table(
    "artifact_blobs",
    metadata,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("path", sa.Text, primary_key=True),
    sa.Column("sha256", sa.String(64), nullable=False),
)

cache = sa.Table(
    "cache",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False, index=True),
)
INSERT_RUN = runs.insert()  # one statement object: SQLAlchemy compiles it once


def add_columns(engine: sa.Engine) -> None:
    """Add to an existing `runs` table the columns of `ADDED_COLUMNS` it lacks (nullable)."""
    have = {c["name"] for c in sa.inspect(engine).get_columns("runs")}
    for name in ADDED_COLUMNS:
        if name in have:
            continue
        column = runs.c[name]
        ddl = f"ALTER TABLE runs ADD COLUMN {name} {column.type.compile(engine.dialect)}"
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(ddl)
        except sa.exc.SQLAlchemyError:  # another process added it first
            again = {c["name"] for c in sa.inspect(engine).get_columns("runs")}
            if name not in again:
                raise
