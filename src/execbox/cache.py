"""The result cache: the same code, inputs, stdin, limits, environment and image give the same
stored result, marked `cached: true`, without running anything.

The key is a sha256 over exactly what can change a run's outcome. A program that reads the clock
or random numbers gives a different answer each time; caching it is the caller's choice
(`cache=False` per request, `--no-cache` on the CLI, `Executor(cache=False)` for all).
`sandbox_error` results are never cached, nor are results whose artifact bytes were not kept.
Entries live in the records database and expire after a TTL.
"""

from __future__ import annotations

import hashlib
import json

from .contract import RunRequest, RunResult, Status

DEFAULT_TTL_S = 3600.0


def cache_key(request: RunRequest, image_digest: str, scope: str | None = None) -> str:
    """sha256 over language, code, input names and hashes, stdin, limits, env and image, and
    the `scope` when given (a tenant: one tenant's results never answer another's runs)."""
    material = {
        "v": 2,  # 2: results carry inputs_read
        "language": request.language,
        "code": request.code,
        "inputs": sorted((f.name, hashlib.sha256(f.data).hexdigest()) for f in request.files),
        "stdin": hashlib.sha256(request.stdin).hexdigest(),
        "limits": request.limits.model_dump(mode="json"),
        "env": sorted(request.env.items()),
        "network": request.network,
        "image": image_digest,
    }
    if scope is not None:
        material["scope"] = scope
    blob = json.dumps(material, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def cacheable(result: RunResult) -> bool:
    """Only outcomes of the code itself: never our own failures or pre-run verdicts (nor a
    cancelled run: the executor, which holds its token, leaves those out)."""
    return result.status not in (
        Status.sandbox_error, Status.policy_denied, Status.needs_approval, Status.budget_exceeded
    )
