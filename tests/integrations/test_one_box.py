"""The plugs are optional: the one-box path never imports an agent framework."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ONE_BOX = """
import sys
import execbox
import execbox.integrations
from execbox.testing import FakeResult, FakeSandbox

with execbox.Executor(backend=FakeSandbox(lambda run: FakeResult(stdout="6\\n"))) as ex:
    assert ex.run("print(6)").stdout == "6\\n"
    with ex.session() as s:
        s.run("x = 1")
from execbox import cli, server, mcp
frameworks = ("agents", "smolagents")
print(sorted(m for m in sys.modules if m.split(".")[0] in frameworks))
"""


def test_the_one_box_path_never_imports_an_agent_framework(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", ONE_BOX],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "EXECBOX_HOME": str(tmp_path)},
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
