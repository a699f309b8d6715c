"""execbox on a Ray cluster: `Executor(cluster="ray://HEAD:10001" | "HOST:PORT" | "auto")`.

Ray is an optional extra (`pip install 'execbox[cluster]'`); nothing here is imported by the
one-box path. The executor keeps its pipeline (policy, budget, cache, redaction, records) on
the caller's machine and sends the sandbox stage to the nodes (`backend.RayBackend`), each
served by one long-lived host actor (`host.NodeHost`). See docs/cluster.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backend import RayBackend

ENV = "EXECBOX_CLUSTER"  # the cluster address when neither the caller nor `--cluster` gives one


def connect(address: str, settings: dict[str, Any]) -> RayBackend:
    """A backend on the Ray cluster at `address`; UsageError when Ray is not installed."""
    try:
        from .backend import RayBackend
    except ImportError as exc:
        from ..errors import UsageError

        raise UsageError(f"a cluster needs Ray ({exc}): pip install 'execbox[cluster]'") from exc
    return RayBackend(address, settings)
