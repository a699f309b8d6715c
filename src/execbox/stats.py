"""A read-only snapshot of what an executor's sandbox host holds (`Executor.stats()`): for
operators' dashboards, and for tests that watch the pool instead of sleeping."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .hosts import Hosts
from .sandbox.host.pool import SLOT_KINDS
from .sandbox.host.zygotes import ZygoteProcess


@dataclass(frozen=True)
class HostStats:
    """One sandbox host (its zygote processes and slot pool) at one moment."""

    zygote_pid: int  # the supervisors' zygote, the parent of every slot's supervisor
    light_zygote_pid: int  # forks the programs of light (standard library) runs
    heavy_zygote_pid: int  # forks the programs of numpy and pandas runs, and sessions'
    heavy_ready: bool  # whether the heavy zygote has started and serves
    # Forks the programs of runs importing what only the full preload has (sklearn, ...), in
    # an environment whose tree has more than the data stack, once one such run came; or None.
    full_zygote_pid: int | None
    full_ready: bool  # whether the full zygote has started and serves
    alive: bool  # whether its zygotes still run
    slot_prefix: str  # its slots' cgroups are named with this prefix
    staged: Mapping[str, int]  # slots staged and waiting for a run, by kind
    taken_by_kind: Mapping[str, int]  # slots handed out for runs and sessions, by kind
    idle_slots: frozenset[str]  # cgroup names of the slots running nothing: staged or staging
    in_use: int  # runs in flight plus sessions open on this host
    taken: int  # runs and sessions it has served (slots handed out)
    warm_pages: Mapping[str, int]  # pages each program zygote has warmed, by zygote kind
    warm_base_pages: Mapping[str, int]  # of those, the ones every program writes
    preloaded: tuple[str, ...]  # modules the heavy zygote imported before forking
    full_preloaded: tuple[str, ...]  # those the full zygote imported (empty: none started)


@dataclass(frozen=True)
class ExecutorStats:
    """What an executor holds at one moment (see `Executor.stats`)."""

    host: HostStats | None  # the host serving the tenant asked for; None when none runs
    # The tenant's hosts running in other environments than the default, by environment name.
    environments: Mapping[str, HostStats]
    replacements: int  # hosts replaced on schedule (rotation) since the executor started
    sessions_open: int
    runs_waiting: int  # callers waiting for a turn (max_concurrency runs go at once)
    pool_size: int  # slots of each kind kept staged


def host_stats(host: ZygoteProcess) -> HostStats:
    """A snapshot of `host`; each field is read once, so fields may be a moment apart."""
    return HostStats(
        zygote_pid=host.pid,
        light_zygote_pid=host.light_pid,
        heavy_zygote_pid=host.heavy_pid,
        heavy_ready=host.heavy_ready(),
        full_zygote_pid=host.full_pid,
        full_ready=host.program_ready("full"),
        alive=host.alive(),
        slot_prefix=host.slot_prefix,
        staged=MappingProxyType({k: host.pool.ready_count(k) for k in SLOT_KINDS}),
        taken_by_kind=MappingProxyType(dict(host.pool.taken_by_kind)),
        idle_slots=frozenset(host.unused_slot_names()),
        in_use=host.in_use(),
        taken=host.taken,
        warm_pages=MappingProxyType(dict(host.info.get("warm_pages", {}))),
        warm_base_pages=MappingProxyType(dict(host.info.get("warm_base_pages", {}))),
        preloaded=tuple(host.info.get("preloaded", ())),
        full_preloaded=tuple(host.info.get("full_preloaded", ())),
    )


def executor_stats(
    hosts: Hosts | None,
    tenant: str | None,
    *,
    sessions_open: int,
    runs_waiting: int,
    pool_size: int,
    environment_names: Mapping[str, str] | None = None,
) -> ExecutorStats:
    """`environment_names`: the name of each environment by its image digest."""
    host = hosts.current(tenant) if hosts is not None else None
    names = environment_names or {}
    others = hosts.running(tenant) if hosts is not None else {}
    return ExecutorStats(
        host=host_stats(host) if host is not None else None,
        environments=MappingProxyType(
            {
                names.get(digest, digest): host_stats(h)
                for digest, h in sorted(others.items(), key=lambda i: i[0])
            }
        ),
        replacements=hosts.replacements if hosts is not None else 0,
        sessions_open=sessions_open,
        runs_waiting=runs_waiting,
        pool_size=pool_size,
    )
