"""The plugs run against both faces with the same interface: the local Executor over the real
sandbox, and `execbox.Client` talking to a real `execbox serve` app (uvicorn on loopback) over
that same Executor."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import execbox
from execbox.server import Settings, create_app
from execbox.server.background import serving

# CI sets this: a framework missing there fails the collection instead of skipping its tests.
if os.environ.get("EXECBOX_REQUIRE_INTEGRATIONS"):
    for _framework in ("langchain", "langchain_core", "pydantic_ai", "agents", "smolagents"):
        importlib.import_module(_framework)


@pytest.fixture(scope="package")
def served(executor: execbox.Executor) -> Iterator[tuple[str, str]]:
    """A real server over the real sandbox: (url, a tenant's key)."""
    app = create_app(executor, Settings())
    # A name of its own: xdist workers and earlier runs share the home's key store.
    key = app.state.execbox.keys.create(f"integrations-{uuid.uuid4().hex[:8]}", max_sessions=8)
    with serving(app) as url:
        yield url, key


def _face(request: pytest.FixtureRequest, executor: execbox.Executor) -> Iterator[Any]:
    if request.param == "local":
        yield executor
        return
    url, key = request.getfixturevalue("served")
    with execbox.Client(url, key) as client:
        yield client


@pytest.fixture(params=["local", "remote"])
def backend(request: pytest.FixtureRequest, executor: execbox.Executor) -> Iterator[Any]:
    """The Executor, or a Client of a server over it."""
    yield from _face(request, executor)


@pytest.fixture(params=["local", "remote"])
def jailed_backend(request: pytest.FixtureRequest, jailed: execbox.Executor) -> Iterator[Any]:
    """`backend`, after the jail is proven: for hostile code."""
    yield from _face(request, jailed)


ONE_BOX = """
import sys
import execbox
from execbox import tools
from execbox.testing import FakeResult, FakeSandbox

with execbox.Executor(backend=FakeSandbox(lambda run: FakeResult(stdout="6\\n"))) as ex:
    assert ex.run("print(6)").stdout == "6\\n"
    with ex.session() as s:
        s.run("x = 1")
    tools.execute_tool_call(ex, {"code": "print(6)"})
from execbox import cli
import json
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in sys.argv[1:])))
"""


def modules_the_one_box_path_imports(tmp_path: Path, *roots: str) -> list[str]:
    """Which modules under `roots` running, a session and a tool call import (in a child)."""
    out = subprocess.run(
        [sys.executable, "-c", ONE_BOX, *roots],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "EXECBOX_HOME": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    found: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def docs_example(page: str, replacements: dict[str, str]) -> str:
    """The first Python example of docs/integrations/`page`, with `replacements` made (each
    must be found: an example that changed shape fails its test, not silently passes)."""
    text = (Path(__file__).parents[2] / "docs" / "integrations" / page).read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    for old, new in replacements.items():
        assert old in code, f"{old!r} is no longer in the example of {page}"
        code = code.replace(old, new)
    return code
