"""`execbox run` says on stderr what its own executor cost when that passes the threshold, so
that `wall=4ms` after a second's wait is explained, with the way to avoid it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from execbox import cli
from tests.conftest import _host_can_sandbox, sandbox_missing

NOTE = re.compile(
    r"^\[execbox\] this command took (\d+\.\d) s, the run (\d+) ms: the rest \((\d+\.\d) s\)"
)


@pytest.fixture
def program(tmp_path: Path) -> Path:
    reason = _host_can_sandbox()
    if reason:
        sandbox_missing(reason)
    path = tmp_path / "one.py"
    path.write_text("print(1)\n")
    return path


def _run(program: Path, *args: str) -> tuple[str, list[str]]:
    # `--server none`: the note is about this process's own executor, never a serve's socket.
    argv = ["run", str(program), "--no-cache", "--server", "none", *args]
    result = CliRunner().invoke(cli.main, argv)
    assert result.exit_code == 0, result.output
    return result.stdout, result.stderr.splitlines()


def test_the_start_cost_is_said_once_with_the_way_around_it(
    program: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "START_NOTE_S", 0.0)
    stdout, stderr = _run(program)
    assert stdout == "1\n"
    notes = [line for line in stderr if NOTE.match(line)]
    assert len(notes) == 1, stderr
    took, run_ms, rest = NOTE.match(notes[0]).groups()  # type: ignore[union-attr]
    wall = re.search(r"wall=(\d+)ms", stderr[0])
    assert wall is not None and run_ms == wall.group(1)
    assert float(took) >= float(rest) > 0
    assert "`execbox serve`" in notes[0] and "execbox.Executor" in notes[0]


def test_no_note_below_the_threshold_or_under_json(
    program: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "START_NOTE_S", 1e9)
    _stdout, stderr = _run(program)
    assert stderr and not any(NOTE.match(line) for line in stderr)
    monkeypatch.setattr(cli, "START_NOTE_S", 0.0)
    stdout, stderr = _run(program, "--json")
    assert json.loads(stdout)["status"] == "ok"
    assert not any(NOTE.match(line) for line in stderr)
