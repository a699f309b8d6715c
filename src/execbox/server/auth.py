"""API keys and tenancy: who is calling, and which runs belong to whom.

A key is `ebx_` plus 32 random bytes (URL-safe base64). Only its SHA-256 is stored: a random
256-bit key needs no slow hash, and a leaked table yields no usable key. The key's name is the
tenant: a tenant sees only the runs it started (table `tenant_runs`). An admin key (role
`admin`) reads the server's global metrics and nothing else: it runs no code and owns no runs. The
tables live on the run store's engine under their own metadata, beside the run records.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

import sqlalchemy as sa

from ..errors import UsageError

KEY_PREFIX = "ebx_"
TENANT, ADMIN = "tenant", "admin"  # a key's role: runs code as its tenant, or reads metrics
# The tenants of the local socket and of --no-auth's keyless callers: a key of either name
# would share their runs.
LOCAL_NAME, ANONYMOUS_NAME = "local", "anonymous"
RESERVED_NAMES = (LOCAL_NAME, ANONYMOUS_NAME)

# A key given by the deployment (a secret), not made here: long enough to be unguessable when
# random, and characters a shell and an Authorization header carry as they are.
GIVEN_KEY = re.compile(r"[A-Za-z0-9_\-.~+/=]{32,512}")

_meta = sa.MetaData()

api_keys = sa.Table(
    "api_keys",
    _meta,
    sa.Column("name", sa.String(100), primary_key=True),
    sa.Column("key_sha256", sa.String(64), nullable=False, unique=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("revoked_at", sa.Float),
    sa.Column("max_concurrent", sa.Integer, nullable=False),
    sa.Column("max_sessions", sa.Integer, nullable=False),
    sa.Column("rpm", sa.Integer, nullable=False),
    sa.Column("role", sa.String(16), nullable=False, server_default=TENANT),
    # Sessions the key may have starting at once; NULL: the server's --session-starts-per-key.
    sa.Column("session_starts", sa.Integer),
)

tenant_runs = sa.Table(
    "tenant_runs",
    _meta,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("tenant", sa.String(100), nullable=False, index=True),
    sa.Column("created_at", sa.Float, nullable=False),
)


@dataclass(frozen=True)
class Tenant:
    """An authenticated caller and its limits."""

    name: str
    max_concurrent: int
    max_sessions: int
    rpm: int
    role: str = TENANT
    session_starts: int | None = None
    """Sessions it may have starting at once (None: the server's setting)."""


@dataclass(frozen=True)
class KeyInfo:
    name: str
    created_at: float
    revoked_at: float | None
    max_concurrent: int
    max_sessions: int
    rpm: int
    role: str
    session_starts: int | None


class KeyRevoked(Exception):
    """The key was valid once and has been revoked."""


def key_digest(key: str) -> str:
    """A key as stored: its SHA-256, in hex."""
    return hashlib.sha256(key.encode()).hexdigest()


class KeyStore:
    """API keys and the run -> tenant map, on a SQLAlchemy engine (the run store's)."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        _meta.create_all(engine)
        _add_columns(engine)

    def create(
        self,
        name: str,
        *,
        max_concurrent: int = 8,
        max_sessions: int = 4,
        rpm: int = 600,
        role: str = TENANT,
        session_starts: int | None = None,
        key: str | None = None,
    ) -> str:
        """Store a new key and return it; it is shown once and never stored in clear. `key`:
        this one (a deployment's secret) instead of a random one."""
        if not name or len(name) > 100 or not name.isprintable():
            raise UsageError("a key name is 1 to 100 printable characters")
        if name in RESERVED_NAMES:
            raise UsageError(
                f"the key name {name!r} is reserved: it names the runs of the server's "
                "local socket ('local') or of --no-auth's keyless callers ('anonymous')"
            )
        if role not in (TENANT, ADMIN):
            raise UsageError(f"a key's role is {TENANT!r} or {ADMIN!r}, not {role!r}")
        if min(max_concurrent, max_sessions, rpm) < 0:
            raise UsageError("key limits must be >= 0")
        if session_starts is not None and session_starts < 1:
            raise UsageError(f"a key's session starts at once are >= 1, not {session_starts}")
        if key is None:
            key = KEY_PREFIX + secrets.token_urlsafe(32)
        elif not GIVEN_KEY.fullmatch(key):
            raise UsageError(
                "a given key is 32 to 512 characters from A-Z a-z 0-9 and _-.~+/= "
                "(make one with `openssl rand -base64 32`)"
            )
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    api_keys.insert().values(
                        name=name,
                        key_sha256=key_digest(key),
                        created_at=time.time(),
                        max_concurrent=max_concurrent,
                        max_sessions=max_sessions,
                        rpm=rpm,
                        role=role,
                        session_starts=session_starts,
                    )
                )
        except sa.exc.IntegrityError as exc:
            with self.engine.connect() as conn:
                taken = conn.execute(
                    sa.select(api_keys.c.name).where(api_keys.c.name == name)
                ).first()
            if taken is None:  # the name is free: the key itself is another name's
                raise UsageError(
                    "that key is already stored under another name; give each tenant its own"
                ) from exc
            raise UsageError(f"a key named {name!r} already exists") from exc
        return key

    def revoke(self, name: str) -> None:
        with self.engine.begin() as conn:
            done = conn.execute(
                api_keys.update()
                .where(api_keys.c.name == name, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=time.time())
            )
        if not done.rowcount:
            raise UsageError(f"no active key named {name!r}")

    def list(self) -> list[KeyInfo]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(api_keys).order_by(api_keys.c.name)).mappings().all()
        return [KeyInfo(**{k: v for k, v in row.items() if k != "key_sha256"}) for row in rows]

    def authenticate(self, key: str) -> Tenant | None:
        """The tenant of `key`; None when unknown; KeyRevoked when revoked."""
        return self.by_digest(key_digest(key))

    def by_digest(self, digest: str) -> Tenant | None:
        """The tenant of the key whose `key_digest` is `digest`; None when unknown;
        KeyRevoked when revoked."""
        with self.engine.connect() as conn:
            row = (
                conn.execute(sa.select(api_keys).where(api_keys.c.key_sha256 == digest))
                .mappings()
                .first()
            )
        if row is None or not hmac.compare_digest(row["key_sha256"], digest):
            return None
        if row["revoked_at"] is not None:
            raise KeyRevoked(row["name"])
        if row["name"] in RESERVED_NAMES:  # stored before the name was reserved
            return None
        return Tenant(
            row["name"],
            row["max_concurrent"],
            row["max_sessions"],
            row["rpm"],
            row["role"],
            row["session_starts"],
        )

    def session_quotas(self) -> dict[str, int]:
        """Each active tenant key's session quota, by name (how a server shares its sessions)."""
        query = sa.select(api_keys.c.name, api_keys.c.max_sessions).where(
            api_keys.c.revoked_at.is_(None), api_keys.c.role == TENANT
        )
        with self.engine.connect() as conn:
            return {name: int(n) for name, n in conn.execute(query)}

    # ---- tenancy ----------------------------------------------------------------------------

    def claim_run(self, run_id: str, tenant: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                tenant_runs.insert().values(run_id=run_id, tenant=tenant, created_at=time.time())
            )

    def owner_of(self, run_id: str) -> str | None:
        with self.engine.connect() as conn:
            owner: str | None = conn.scalar(
                sa.select(tenant_runs.c.tenant).where(tenant_runs.c.run_id == run_id)
            )
        return owner

    def runs_of(self, tenant: str) -> sa.Select[tuple[str]]:
        """A query of the ids of the runs `tenant` owns (to filter the records by)."""
        return sa.select(tenant_runs.c.run_id).where(tenant_runs.c.tenant == tenant)

    def count_runs(self, tenant: str | None = None) -> int:
        query = sa.select(sa.func.count()).select_from(tenant_runs)
        if tenant is not None:
            query = query.where(tenant_runs.c.tenant == tenant)
        with self.engine.connect() as conn:
            return int(conn.scalar(query) or 0)


def _add_columns(engine: sa.Engine) -> None:
    """Databases made before keys had roles (every key there is a tenant's) or their own
    session-start caps (each takes the server's)."""
    for name, ddl in (
        ("role", f"VARCHAR(16) NOT NULL DEFAULT '{TENANT}'"),
        ("session_starts", "INTEGER"),
    ):
        if name in {c["name"] for c in sa.inspect(engine).get_columns("api_keys")}:
            continue
        try:
            with engine.begin() as conn:
                conn.execute(sa.text(f"ALTER TABLE api_keys ADD COLUMN {name} {ddl}"))
        except sa.exc.DBAPIError:  # another process added it first
            if name not in {c["name"] for c in sa.inspect(engine).get_columns("api_keys")}:
                raise
