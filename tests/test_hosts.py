"""Sandbox hosts replaced on a schedule, and hosts per tenant: a run's memory layout (library
and heap addresses, the str hash secret, and by fork the stack canary and pointer guard) is its
zygote's, so a new host must give a new one; runs and sessions in flight keep their host, and
a retired or idle host leaves nothing behind."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from execbox import Executor, RunResult, UsageError
from execbox.sandbox.host.zygotes import ZygoteProcess
from execbox.sandbox.inside.cgroup import Hierarchy
from tests.probes import alive, host_internals, host_stats, wait_until

# What fork copies from the zygote: where libc is mapped, where the `sys` module object
# lives on the heap, and the interpreter's str hash secret.
LAYOUT = """
import sys
libc = next(line.split("-")[0] for line in open("/proc/self/maps") if "libc" in line)
print(libc, id(sys), hash("execbox"))
"""


def layout(ex: Executor, tenant: str | None = None) -> str:
    r = ex.run(LAYOUT, tenant=tenant)
    assert r.ok, r
    return r.stdout


def host_gone(host: ZygoteProcess) -> bool:
    """Whether the host has closed and nothing of it runs or stays: its zygotes (and so what
    they forked) and its run cgroups."""
    if not host.closed or any(alive(p) for p in (host.pid, host.light_pid, host.heavy_pid)):
        return False
    prefix = host._prefix
    return not any(
        n.startswith(prefix)
        for parent in Hierarchy.discover().parent_paths.values()
        for n in os.listdir(parent)
    )


@pytest.fixture
def rotating() -> Iterator[Executor]:
    """An executor whose host is replaced after every two slots taken (runs or sessions)."""
    with Executor(cache=False, pool_size=1, rotate_after_runs=2, rotate_after_s=None) as ex:
        yield ex


def replaced(ex: Executor, old: ZygoteProcess) -> ZygoteProcess:
    assert wait_until(lambda: ex._hosts.current() is not old, 60, every_s=0.1), (
        "the host was not replaced"
    )
    new = ex._hosts.current()
    assert new is not None
    return new


def test_a_replaced_host_gives_later_runs_a_new_memory_layout(rotating: Executor) -> None:
    first = host_internals(rotating)
    before = [layout(rotating) for _ in range(2)]  # the second is the host's last
    assert before[0] == before[1], "control: runs of one zygote share its layout"
    second = replaced(rotating, first)
    after = layout(rotating)
    assert after.split()[0] != before[0].split()[0], "libc at the same address"
    assert after.split()[1] != before[0].split()[1], "the heap at the same address"
    assert after.split()[2] != before[0].split()[2], "the same str hash secret"
    assert wait_until(lambda: host_gone(first), 30), "the retired host stayed"
    assert rotating._hosts.current() is second
    assert rotating.stats().replacements == 1
    assert host_stats(rotating).zygote_pid != first.pid


def test_runs_and_sessions_in_flight_keep_their_host_across_a_replacement(
    rotating: Executor,
) -> None:
    first = host_internals(rotating)
    session = rotating.session()
    assert session.run("x = 41").ok
    slow: list[RunResult] = []
    # The second slot taken makes the host due; its run is still in flight at the swap.
    thread = threading.Thread(
        target=lambda: slow.append(
            rotating.run("import time; time.sleep(6); print('done')", limits={"timeout_s": 30})
        )
    )
    thread.start()
    replaced(rotating, first)
    in_flight = thread.is_alive()
    thread.join()
    assert slow[0].stdout == "done\n", f"the run in flight was cut short: {slow[0]}"
    assert first.retired and in_flight, "control: the run was not in flight at the swap"
    r = session.run("print(x + 1)")
    assert r.ok and r.stdout == "42\n", r
    assert not first.closed and alive(first.heavy_pid), "closed under an open session"
    session.close()
    assert wait_until(lambda: host_gone(first), 30), "the retired host stayed"


def test_tenants_get_hosts_of_their_own_and_idle_ones_close() -> None:
    with Executor(
        cache=False,
        pool_size=1,
        zygotes_per_tenant=True,
        tenant_idle_s=2.0,
        rotate_after_runs=None,
        rotate_after_s=None,
    ) as ex:
        a, b = layout(ex, "a"), layout(ex, "b")
        hosts = ex._hosts.current("a"), ex._hosts.current("b")
        assert hosts[0] is not None and hosts[1] is not None and hosts[0] is not hosts[1]
        assert not hosts[0].closed and not hosts[1].closed, "not at the same moment"
        assert layout(ex, "a") == a, "control: one tenant's runs share its host's layout"
        for i, what in enumerate(("libc", "the heap", "the str hash secret")):
            assert a.split()[i] != b.split()[i], f"two tenants share {what}"
        assert ex._hosts.current(None) is None, "the shared host was started"
        assert wait_until(lambda: all(host_gone(h) for h in hosts if h is not None), 30), (
            "idle tenant hosts stayed"
        )
        assert ex._hosts.current("a") is None


@pytest.mark.parametrize(
    "options",
    [
        {"rotate_after_runs": -1},
        {"rotate_after_runs": 2.5},
        {"rotate_after_runs": True},
        {"rotate_after_s": -1},
        {"rotate_after_s": float("nan")},
        {"rotate_after_s": "60"},
        {"tenant_idle_s": float("inf")},
        {"zygotes_per_tenant": "yes"},
        {"zygotes_per_tenant": True, "tenant_idle_s": 0},
        {"environment_idle_s": 0},
        {"environment_idle_s": float("inf")},
    ],
)
def test_bad_host_settings_are_a_usage_error(options: dict[str, object]) -> None:
    with pytest.raises(UsageError, match=next(iter(options))):
        Executor(**options)  # type: ignore[arg-type]
