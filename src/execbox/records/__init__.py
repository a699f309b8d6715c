"""Run records: every run, allowed or denied, is stored, committed as its result returns.

A record holds what is needed to explain and replay a run: the code and its sha256, the input
files (names, sizes, sha256, and the bytes, deduplicated in a blob table), stdin, language,
profile, policy verdict, the limits that applied, the image digest, and the outcome (status,
exit code, error, metrics, redacted stdout/stderr, artifact metadata; artifact bytes up to a cap).
Secrets in the code, stdin, environment or input files are stored redacted, with keyed
digests of the originals (see `atrest`; the key is `records_key`, kept outside the database).

Storage is SQLAlchemy Core: SQLite by default, a file under the user's data directory in WAL
mode with a busy timeout (safe for concurrent writers: threads of one process and several
processes); any SQLAlchemy URL (PostgreSQL: `postgresql+psycopg://...`) when configured with
`EXECBOX_DB_URL` or `RunStore(url)`. The result cache shares the store (table `cache`).
"""

from .schema import artifact_blobs, blobs, cache, runs
from .store import KEY_BYTES, PolicyInfo, RunRecord, RunStore, default_url, records_key, sha256

__all__ = [
    "KEY_BYTES",
    "PolicyInfo",
    "RunRecord",
    "RunStore",
    "artifact_blobs",
    "blobs",
    "cache",
    "default_url",
    "records_key",
    "runs",
    "sha256",
]
