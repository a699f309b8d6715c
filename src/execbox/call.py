"""What travels with a request through the pipeline's stages (`executor.Executor._pipeline`):
why it runs (`Origin`), how its caller wants it run (`Options`), and the request as the stages
leave it (`Call`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import policy as policy_mod
from .atrest import SealedCode
from .budget import Budget
from .cancel import Cancel
from .contract import RunRequest, RunResult
from .network.secrets import Binding
from .records import PolicyInfo
from .redact import Redactor

if TYPE_CHECKING:
    from .sessions import Session

__all__ = ["Call", "Options", "Origin"]


@dataclass(frozen=True)
class Origin:
    """Why a request runs: what its record calls it (run, cell, approval, replay), the run an
    approval or replay repeats, whether a hold is released, the session of a cell."""

    kind: str = "run"
    source: str | None = None
    approved: bool = False
    session: Session | None = None


@dataclass(frozen=True)
class Options:
    """How the caller wants it run (see `Executor.run_request`)."""

    cache: bool | None = None
    budget: Budget | None = None
    cache_scope: str | None = None
    cancel: Cancel | None = None
    spool_dir: str | None = None
    tenant: str | None = None
    bound: tuple[Binding, ...] = ()  # secrets bound to hosts, placeholders made


@dataclass
class Call:
    """One request on its way through the pipeline's stages."""

    request: RunRequest
    origin: Origin
    verdict: policy_mod.Verdict
    policy: PolicyInfo
    redactor: Redactor
    base: RunResult  # what every stage's result starts from
    session_id: str | None
    code: SealedCode  # the request's code as its record keeps it; base.code_sha256 is its digest
