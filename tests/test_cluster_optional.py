"""Ray is an optional extra: the one-box path never imports it, and a cluster without a shared
run store is refused before any cluster is dialled (no Ray needed to see either)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from execbox import Executor
from execbox.errors import UsageError

ONE_BOX = """
import sys
import execbox
from execbox.testing import FakeResult, FakeSandbox

with execbox.Executor(backend=FakeSandbox(lambda run: FakeResult(stdout="6\\n"))) as ex:
    assert ex.run("print(6)").stdout == "6\\n"
    with ex.session() as s:
        s.run("x = 1")
    dict(ex.map(["print(1)"] * 4))
from execbox import cli  # the CLI registers `execbox cluster` without importing Ray
print(sorted(m for m in sys.modules if m == "ray" or m.startswith("ray.")))
"""


def test_the_one_box_path_never_imports_ray(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", ONE_BOX],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        # Its cache entries stay out of the shared home, where they were other tests' hits.
        env={**os.environ, "EXECBOX_HOME": str(tmp_path)},
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_cluster_without_a_shared_store_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="shared run store"):
        Executor(cluster="127.0.0.1:1", records=f"sqlite:///{tmp_path}/runs.db")


def test_a_cluster_and_a_backend_are_refused_together(tmp_path: Path) -> None:
    from execbox.testing import FakeResult, FakeSandbox

    with pytest.raises(UsageError, match="not more than one"):
        Executor(cluster="auto", backend=FakeSandbox(lambda run: FakeResult()))


def test_serve_takes_the_cluster_from_its_flag_or_the_environment(tmp_path: Path) -> None:
    execbox_cli = str(Path(sys.executable).parent / "execbox")
    base = [execbox_cli, "serve", "--db", f"sqlite:///{tmp_path}/runs.db", "--no-socket"]
    for argv, env in (
        ([*base, "--cluster", "127.0.0.1:1"], {}),
        (base, {"EXECBOX_CLUSTER": "127.0.0.1:1"}),
    ):
        out = subprocess.run(
            [*argv, "--port", "0"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert out.returncode != 0
        assert "a cluster needs a shared run store" in out.stderr, out.stderr[-2000:]
