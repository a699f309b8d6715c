"""The checks around JavaScript and bash runs: variables the runner owns, profiles whose rules
cannot read JavaScript, and the cost of the `minimal` profile's JavaScript parse."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from execbox import RunRequest
from execbox.contract import RUNNER_ENV
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
