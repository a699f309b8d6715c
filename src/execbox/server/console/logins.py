"""Console logins: the login cookie holds a random token, never the API key.

A login is a row of `console_logins`, beside the keys: the SHA-256 of its token, the SHA-256
of the key it was opened with, a form token of its own (against cross-site forms), when it
began and when it was last used. Every page view finds the login by its token's digest and then
the key by its digest, so a login ends with its key (revoked, or its name given a new key) at
the next request, on every server of the database; at logout; or after `idle_s` without a page
view. A cookie that leaks (a log, a proxy) gives neither the key nor, once it ends, anything.

A key holds at most `PER_KEY` logins (its least recently used goes first), and expired ones are
removed at every login, so the table stays bounded by the keys.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa

from ..auth import KeyRevoked, KeyStore, Tenant, key_digest

PER_KEY = 32
TOKEN_BYTES = 32
TOUCH_S = 60.0  # a page view records its time at most this often (one write, not one a view)

_meta = sa.MetaData()

console_logins = sa.Table(
    "console_logins",
    _meta,
    sa.Column("token_sha256", sa.String(64), primary_key=True),
    sa.Column("key_sha256", sa.String(64), nullable=False, index=True),
    sa.Column("csrf", sa.String(64), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("seen_at", sa.Float, nullable=False, index=True),
)


@dataclass(frozen=True)
class Login:
    """A live login: whose it is, and the token its forms carry."""

    tenant: Tenant
    csrf: str


def _token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Logins:
    """The console's logins, on the key store's database."""

    def __init__(
        self, keys: KeyStore, idle_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.keys = keys
        self.idle_s = idle_s
        self.clock = clock
        self._touch_s = min(TOUCH_S, idle_s / 4)
        try:
            _meta.create_all(keys.engine)
        except sa.exc.DBAPIError:  # another server made it first
            if not sa.inspect(keys.engine).has_table(console_logins.name):
                raise

    def open(self, key: str) -> str:
        """A new login for `key` (already authenticated); its token, for the cookie."""
        token = secrets.token_urlsafe(TOKEN_BYTES)
        now, digest = self.clock(), key_digest(key)
        table = console_logins
        with self.keys.engine.begin() as conn:
            conn.execute(table.delete().where(table.c.seen_at < now - self.idle_s))
            conn.execute(
                table.insert().values(
                    token_sha256=_token_digest(token),
                    key_sha256=digest,
                    csrf=secrets.token_hex(32),
                    created_at=now,
                    seen_at=now,
                )
            )
            over = conn.scalars(
                sa.select(table.c.token_sha256)
                .where(table.c.key_sha256 == digest)
                .order_by(table.c.seen_at.desc(), table.c.created_at.desc())
                .offset(PER_KEY)
            ).all()
            if over:
                conn.execute(table.delete().where(table.c.token_sha256.in_(over)))
        return token

    def find(self, token: str) -> Login | None:
        """The login of `token`; None when there is none, it expired or its key is gone."""
        table, digest, now = console_logins, _token_digest(token), self.clock()
        with self.keys.engine.connect() as conn:
            row = conn.execute(sa.select(table).where(table.c.token_sha256 == digest)).first()
        if row is None:
            return None
        try:
            tenant = (
                self.keys.by_digest(row.key_sha256) if now - row.seen_at <= self.idle_s else None
            )
        except KeyRevoked:
            tenant = None
        if tenant is None:
            self.close(token)
            return None
        if now - row.seen_at >= self._touch_s:
            with self.keys.engine.begin() as conn:
                conn.execute(
                    table.update().where(table.c.token_sha256 == digest).values(seen_at=now)
                )
        return Login(tenant, row.csrf)

    def close(self, token: str) -> None:
        """End the login of `token` (logout); nothing if there is none."""
        table = console_logins
        with self.keys.engine.begin() as conn:
            conn.execute(table.delete().where(table.c.token_sha256 == _token_digest(token)))


_made: weakref.WeakKeyDictionary[KeyStore, Logins] = weakref.WeakKeyDictionary()
_made_lock = threading.Lock()


def logins_for(keys: KeyStore, idle_s: float) -> Logins:
    """The logins on `keys`' database (its table made on first use). Blocking."""
    with _made_lock:
        found = _made.get(keys)
        if found is None:
            found = _made[keys] = Logins(keys, idle_s)
        return found
