"""`execbox setup`: the host's checks, then the runtime image, then a sandboxed run; a host that
cannot sandbox gets each failed check's fix, exit 2, and nothing built."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from execbox.image import Image, home
from execbox.sandbox.host import capabilities
from execbox.sandbox.inside import linux
from tests.conftest import _host_can_sandbox, sandbox_missing

EXECBOX = [sys.executable, "-m", "execbox.cli"]


def _setup(
    home: Path, preexec: Callable[[], None] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EXECBOX, "setup"],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "EXECBOX_HOME": str(home)},
        preexec_fn=preexec,
    )


def _without_required_capabilities() -> None:
    """A preexec_fn: root whose bounding set lacks what the sandbox needs, as in a container
    started without --cap-add."""
    for cap in capabilities.REQUIRED:
        linux.prctl(linux.PR_CAPBSET_DROP, cap.number)


def test_a_host_that_cannot_sandbox_is_told_why_and_nothing_is_built(tmp_path: Path) -> None:
    home = tmp_path / "home"
    # As root, the container case (capabilities missing); as anyone else, not being root.
    preexec = _without_required_capabilities if os.geteuid() == 0 else None
    result = _setup(home, preexec)
    assert result.returncode == 2, result.stdout + result.stderr
    failed = "capabilities" if os.geteuid() == 0 else "root"
    assert any(line.startswith(f"FAIL {failed}") for line in result.stdout.splitlines())
    assert "fix:" in result.stdout
    assert result.stderr.startswith(f"execbox: this host cannot sandbox ({failed}")
    assert "Traceback" not in result.stderr
    assert "building the runtime image" not in result.stdout
    assert not (home / "envs").exists()


def test_setup_builds_or_reuses_the_image_and_runs_in_it() -> None:
    reason = _host_can_sandbox()
    if reason:
        sandbox_missing(reason)
    image = Image.load()  # the tests' image: setup finds it identical and reuses it
    result = _setup(home())
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert f"ok   runtime image  {image.digest} at {image.root}" in lines
    assert any(line.startswith("ok   smoke run") for line in lines)
    assert any(line.startswith("ok   numpy run") for line in lines)
