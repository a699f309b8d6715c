"""Each plug runs over the real sandbox, in this process (an `execbox.Executor`) or through a
real `execbox serve` on loopback (an `execbox.Client`)."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import execbox
from tests.server.conftest import Api, api_over

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "integrations"


@pytest.fixture(scope="session")
def execbox_api(executor: execbox.Executor) -> Iterator[Api]:
    with api_over(executor) as api:
        yield api


@pytest.fixture(params=["local", "remote"])
def backend(
    request: pytest.FixtureRequest, executor: execbox.Executor, execbox_api: Api
) -> Iterator[Any]:
    """An `Executor` in this process, or a `Client` of a server over the same executor."""
    if request.param == "local":
        yield executor
        return
    with execbox.Client(execbox_api.url, execbox_api.key("plug")[1]) as client:
        yield client


def example(name: str) -> ModuleType:
    """One of examples/integrations, loaded as a module."""
    spec = spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
