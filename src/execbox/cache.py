"""The result cache: the same code, inputs, stdin, limits, environment and image give the same
stored result, marked `cached: true`, without running anything.

The key is a keyed hash (HMAC-SHA256 under the records key) over exactly what can change a
run's outcome. A program that reads the clock or random numbers gives a different answer each
time; caching it is the caller's choice
(`cache=False` per request, `--no-cache` on the CLI, `Executor(cache=False)` for all).
`sandbox_error` results are never cached, nor are results whose artifact bytes were not kept.
Entries live in the records database and expire after a TTL.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable

from .contract import RunRequest, RunResult, Status

DEFAULT_TTL_S = 3600.0


def cache_key(
    request: RunRequest,
    image_digest: str,
    scope: str | None,
    key: bytes,
    secrets: Iterable[str] = (),
) -> str:
    """HMAC-SHA256 under `key` (the records key) over language, code, input names and hashes,
    stdin, limits, env and image, the registered `secrets` (a result stored redacted for one
    set of them would answer a caller with another set with the wrong text), and the `scope`
    when given (a tenant: one tenant's results never answer another's runs). Keyed, as records keep it: a plain hash of code holding a
    short secret would let their reader test guesses of it."""
    material = {
        "v": 3,  # 2: results carry inputs_read; 3: keyed
        "language": request.language,
        "code": request.code,
        "inputs": sorted((f.name, hashlib.sha256(f.data).hexdigest()) for f in request.files),
        "stdin": hashlib.sha256(request.stdin).hexdigest(),
        "limits": request.limits.model_dump(mode="json"),
        "env": sorted(request.env.items()),
        "network": request.network,
        "image": image_digest,
        "secrets": sorted(set(secrets)),
    }
    if scope is not None:
        material["scope"] = scope
    blob = json.dumps(material, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, blob, hashlib.sha256).hexdigest()


def cacheable(result: RunResult) -> bool:
    """Only outcomes of the code itself: never our own failures or pre-run verdicts (nor a
    cancelled run: the executor, which holds its token, leaves those out)."""
    return result.status not in (
        Status.sandbox_error,
        Status.policy_denied,
        Status.needs_approval,
        Status.budget_exceeded,
    )
