"""The checks around JavaScript and bash runs: variables the runner owns, profiles whose rules
cannot read JavaScript, and the cost of the `minimal` profile's JavaScript parse."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from execbox import RunRequest
from execbox.contract import RUNNER_ENV
from execbox.errors import UsageError
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
