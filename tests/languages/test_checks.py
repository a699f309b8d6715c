"""The checks around JavaScript and bash runs: variables the runner owns, profiles whose rules
cannot read JavaScript, and the cost of the `minimal` profile's JavaScript parse."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
from pydantic import ValidationError

from execbox import RunRequest
from execbox.contract import RUNNER_ENV
from execbox.errors import UsageError
from execbox.policy import javascript
from execbox.policy.profiles import _parse_profiles
from execbox.sandbox.inside import interpreters


@pytest.mark.parametrize(
    ("language", "name"), [("javascript", "UV_THREADPOOL_SIZE"), ("bash", "BASH_ENV")]
)
def test_a_request_may_not_set_the_runners_own_variables(language: str, name: str) -> None:
    with pytest.raises(ValidationError, match=f"{name} is set by execbox for {language} runs"):
        RunRequest(code="true", language=language, env={name: "/workspace/x.sh"})
    # Only the language whose runner sets it: a Python run's environment is its own.
    assert RunRequest(code="1", env={name: "1"}).env == {name: "1"}


@pytest.mark.parametrize("language", ["javascript", "bash"])
def test_the_refused_names_are_those_the_runner_sets(language: str) -> None:
    if interpreters.find("node" if language == "javascript" else "bash") is None:
        pytest.skip(f"no interpreter for {language}")
    args, extra = interpreters.argv(language, "1", 2, 256 << 20)
    # Close the memfd argv made: node's code, bash's prelude.
    os.close(int(args[-2] if language == "javascript" else extra["BASH_ENV"].rsplit("/")[-1]))
    assert set(extra) == set(RUNNER_ENV[language])


def _profile(languages: str, rules: str) -> bytes:
    return f"""
[profiles.p]
description = "x"
{rules}
languages = {languages}
max_code_bytes = 1000
max_input_bytes = 1000
max_input_files = 1
max_csv_rows = 1
[profiles.p.limits]
[profiles.p.max_limits]
""".encode()


def test_a_profile_with_python_rules_and_javascript_but_no_javascript_rules_is_refused() -> None:
    with pytest.raises(UsageError) as caught:
        _parse_profiles(_profile('["python", "javascript"]', 'imports_deny = ["os"]'), "f.toml")
    message = str(caught.value)
    assert "profile 'p'" in message and "imports_deny" in message
    assert "javascript_modules_deny" in message
    # Each way out loads: JavaScript rules, no JavaScript, or no rules about the code.
    no_writes = 'writes_outside_workspace = "allow"'
    for languages, rules in [
        ('["python", "javascript"]', 'imports_deny = ["os"]\njavascript_modules_deny = ["fs"]'),
        ('["python"]', 'imports_deny = ["os"]'),
        ('["python", "javascript", "bash"]', no_writes),
    ]:
        assert list(_parse_profiles(_profile(languages, rules), "f.toml")) == ["p"]


def _counting_node(tmp_path: Path, node: str) -> tuple[str, Path]:
    """A `node` that logs its start and end around the real one: (its path, the log)."""
    log = tmp_path / "starts.log"
    wrapper = tmp_path / "node"
    wrapper.write_text(
        f'#!/bin/sh\necho start >> "{log}"\n"{node}" "$@"\nstatus=$?\n'
        f'echo end >> "{log}"\nexit $status\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper), log


def test_the_javascript_check_starts_node_once_per_code_and_two_at_most(tmp_path: Path) -> None:
    node = interpreters.find("node")
    if node is None:
        pytest.skip("no node")
    counting, log = _counting_node(tmp_path, node)
    code = "const fs = require('fs')\n// " + tmp_path.name
    first = javascript.analyse(code, counting)
    assert javascript.analyse(code, counting) == first
    assert first.modules == [("fs", 1)]
    assert log.read_text().split() == ["start", "end"]  # the repeat cost no node
    log.write_text("")
    threads = [
        threading.Thread(target=javascript.analyse, args=(f"{code} {i}", counting))
        for i in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    events = log.read_text().split()
    assert events.count("start") == 6
    running = peak = 0
    for event in events:
        running += 1 if event == "start" else -1
        peak = max(peak, running)
    assert peak <= javascript.MAX_PARSES == 2
