"""The executor is ready once its light and supervisors' zygotes are: the heavy zygote (numpy,
pandas, matplotlib, sessions) keeps starting in the background, and what needs it waits for it.
"""

from __future__ import annotations

import os
import signal

import pytest

from execbox import Executor, SandboxError, Status
from execbox.sandbox.host.errors import HostError
from tests.probes import host_internals, host_stats


def test_heavy_work_right_after_start_waits_for_the_heavy_zygote() -> None:
    with Executor(cache=False) as ex:
        # Issued at once, each before the heavy zygote has necessarily said it is ready.
        numpy = ex.run("import numpy as np\nprint(int(np.arange(4).sum()))")
        pandas = ex.run("import pandas as pd\nprint(pd.Series([1, 2]).sum())")
        with ex.session() as s:
            cell = s.run("x = 41\nx + 1")
        light = ex.run("print(1)")
        assert numpy.status is Status.ok and numpy.stdout == "6\n", numpy
        assert pandas.status is Status.ok and pandas.stdout == "3\n", pandas
        assert cell.status is Status.ok and cell.outputs, cell
        assert light.status is Status.ok and light.stdout == "1\n", light
        assert host_stats(ex).heavy_ready  # ready by now, without failure
        assert "numpy" in host_stats(ex).preloaded, host_stats(ex)
        assert host_stats(ex).warm_pages["heavy"] > 0, host_stats(ex)


def test_a_heavy_zygote_that_dies_while_starting_is_replaced_by_the_next_call() -> None:
    """A death like any other zygote's: its waiters get its error, and the next call starts a
    new host, where every kind of run works."""
    with Executor(cache=False) as ex:
        host = host_internals(ex)
        if host._late[
            "heavy"
        ].done.is_set():  # pragma: no cover - the heavy zygote takes over a second
            pytest.skip("the heavy zygote was ready before it could be killed")
        os.kill(host.heavy_pid, signal.SIGKILL)
        with pytest.raises(HostError, match=r"the zygote \(heavy\) failed to start"):
            host.wait_heavy(30)
        r = ex.run("import pandas as pd\nprint(pd.Series([1, 2]).sum())")
        assert r.status is Status.ok and r.stdout == "3\n", r
        assert host_internals(ex) is not host
        assert ex.run("print(1)").stdout == "1\n"


def test_a_heavy_zygote_that_reports_a_failed_start_fails_its_runs_for_good(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One that says why it could not start would say it again: no restart loop. What needs
    it fails with its error, the rest keeps running. (Its report is replaced here: the real
    zygote started fine, and is killed as a failed one is.)"""
    from execbox.sandbox.host import zygotes as host_mod

    ready = host_mod._Starting.ready

    def heavy_fails(self: host_mod._Starting, timeout_s: float) -> dict[str, object]:
        info = ready(self, timeout_s)
        if "numpy" in info.get("preloaded", []):
            return {"ready": False, "role": "programs", "error": "numpy: broken (test)"}
        return info

    monkeypatch.setattr(host_mod._Starting, "ready", heavy_fails)
    with Executor(cache=False) as ex:
        host = host_internals(ex)
        with pytest.raises(HostError, match=r"failed to start: numpy: broken \(test\)"):
            host.wait_heavy(60)
        light = ex.run("print(1)")
        assert light.status is Status.ok and light.stdout == "1\n", light
        r = ex.run("import pandas as pd\nprint(pd.Series([1, 2]).sum())")
        assert r.status is Status.sandbox_error and r.error is not None, r
        assert "numpy: broken (test)" in r.error.message, r.error
        with pytest.raises(SandboxError, match=r"numpy: broken \(test\)"):
            ex.session()
        assert host_internals(ex) is host, "the host was restarted"
        assert host._starting["heavy"].proc.poll() is not None, "the failed zygote still runs"
        assert host.pool.ready_count("heavy") == host.pool.ready_count("pandas") == 0
        assert ex.run("print(2)").stdout == "2\n"
