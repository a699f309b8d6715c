"""Registered secrets as bash and Node show them: quoted, escaped, in octal (issue 38, item 2)."""

from __future__ import annotations

import json
import re

import pytest

from execbox import Executor

# A password with what each display escapes: a blank, both quotes, $ and `, a backslash, a
# non-ASCII character (octal in bash's C locale), control characters (named or \xNN in Node).
SECRET = "pa ss\"w'rd$Zq`7x\\-\u20acnd"
CONTROLS = "ab\x0bcd\x08ef\"gh'ij`kl\x7fmn\x1bop"

# Every line of the output is the secret redacted whole, with at most the display's quoting
# and prefix around it.
WHOLE = re.compile(r"(declare -x S=|S=|\+ : |.*line 1: )?\$?['\"]?\[REDACTED:secret\]['\"]?(: .*)?")


@pytest.mark.parametrize(
    "code",
    [
        'printf "%q\\n" "$S"',
        'echo "${S@Q}"',
        "declare -p S",
        'set -x\n: "$S"',
        "set | grep ^S=",
        '"$S"',
    ],
)
@pytest.mark.parametrize("value", [SECRET, CONTROLS])
def test_bash_quoting_of_a_registered_secret_is_redacted(
    executor: Executor, code: str, value: str
) -> None:
    result = executor.run(code, language="bash", env={"S": value}, secrets=[value], cache=False)
    lines = (result.stdout + result.stderr).splitlines()
    assert lines, (result.status, result.error)
    for line in lines:
        assert WHOLE.fullmatch(line), line


@pytest.mark.parametrize("value", [SECRET, CONTROLS])
def test_node_inspect_of_a_registered_secret_is_redacted(executor: Executor, value: str) -> None:
    code = f"const S = {json.dumps(value)}\nconsole.log({{ k: S }})\nconsole.error([S])"
    result = executor.run(code, language="javascript", secrets=[value], cache=False)
    assert result.stdout == "{ k: '[REDACTED:secret]' }\n", result.stdout
    assert result.stderr == "[ '[REDACTED:secret]' ]\n", result.stderr
