"""The web console at /console: runs, held runs, sessions, agent answers and an overview,
as server-rendered pages over the same records, keys and tenancy as the API.

A tenant's key sees only its own runs; an admin key sees every run and every agent answer.
The key comes as `Authorization: Bearer KEY` or from the console's login form, which keeps it
in an HttpOnly, SameSite=Strict cookie (Secure over TLS). Everything recorded is hostile text:
templates escape it all, pages carry a strict Content-Security-Policy, and artifacts that a
browser could run are only ever downloads.
"""

from .routes import mount

__all__ = ["mount"]
