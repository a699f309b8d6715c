"""A run as it crosses to a node's host: its id, its code, and only what differs from the
defaults (the limits' fields and the RunSpec's options). Its callbacks, cancel token and spool
directory stay with the caller. A tuple of plain values pickles in a fraction of the time a
RunSpec holding a pydantic `Limits` does, on both sides. This module imports no Ray.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..backend import RunSpec
from ..contract import Limits

CALLER_ONLY = frozenset({"on_stdout", "on_stderr", "cancel", "spool_dir"})
DEFAULT_LIMITS = Limits()
# The options a run may leave at their defaults, with those defaults.
OPTIONS = tuple(
    (f.name, f.default)
    for f in dataclasses.fields(RunSpec)
    if f.name not in CALLER_ONLY and f.name not in ("run_id", "code", "limits")
)
assert all(default is not dataclasses.MISSING for _, default in OPTIONS)

Packed = tuple[str, str, dict[str, Any], dict[str, Any]]


def pack(spec: RunSpec) -> Packed:
    """What of `spec` a host needs, compactly."""
    options = {}
    for name, default in OPTIONS:
        value = getattr(spec, name)
        if value != default:
            options[name] = value
    limits = {} if spec.limits == DEFAULT_LIMITS else spec.limits.model_dump(exclude_defaults=True)
    return (spec.run_id, spec.code, limits, options)


def unpack(packed: Packed) -> RunSpec:
    """The RunSpec `pack` was given, without what stays with the caller."""
    run_id, code, limits, options = packed
    return RunSpec(
        run_id=run_id,
        code=code,
        limits=Limits(**limits) if limits else DEFAULT_LIMITS,
        **options,
    )
