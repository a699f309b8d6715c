"""`pip install` inside a run whose policy allows an internal package index: a static simple
index on loopback (HTTPS, the test CA) serving a wheel made here, pip from an environment
built with it (the default runtime image has no pip), the install written under /workspace,
capped by the run's egress limits like any other traffic."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import execbox
from execbox import environments
from tests.network.conftest import MIRROR_ENV
from tests.network.servers import Upstream
from tests.wheels import make_wheel

INSTALL = """
import subprocess, sys
done = subprocess.run(
    [sys.executable, "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check",
     "--no-input", "--target", "/workspace/site", "mirrordemo"],
    capture_output=True, text=True,
)
print(done.stderr[-2000:], file=sys.stderr)
if done.returncode == 0:
    sys.path.insert(0, "/workspace/site")
    import mirrordemo
    print("installed", mirrordemo.ANSWER)
else:
    print("pip failed", done.returncode)
"""


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        pass


@pytest.fixture(scope="module")
def index(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A PEP 503 simple index over HTTPS on 127.0.0.1 (certificate for pypi.test from the
    test CA) with one project, mirrordemo; its port."""
    root = tmp_path_factory.mktemp("mirror")
    (root / "files").mkdir()
    wheel = make_wheel(root / "files", "mirrordemo", {"mirrordemo/__init__.py": "ANSWER = 7\n"})
    project = root / "simple" / "mirrordemo"
    project.mkdir(parents=True)
    link = f'<a href="../../files/{wheel.name}">{wheel.name}</a>'
    (project / "index.html").write_text(f"<!DOCTYPE html><html><body>{link}</body></html>\n")
    (root / "simple" / "index.html").write_text('<a href="mirrordemo/">mirrordemo</a>\n')
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    server.daemon_threads = True
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    upstream.ca.issue_cert("pypi.test").configure_cert(context)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def pip_environment(net: execbox.Executor) -> str:
    """An environment with pip (from the index pip itself is configured with here)."""
    requirements = Path(__file__).with_name("mirror-requirements.txt")
    environments.build(MIRROR_ENV, requirements=requirements, log=False)
    return MIRROR_ENV


def install(
    net: execbox.Executor, upstream: Upstream, port: int, network: list[str], **limits: int
) -> execbox.RunResult:
    return net.run(
        INSTALL,
        profile="net",
        environment=MIRROR_ENV,
        network=network,
        files={"ca.pem": upstream.ca_pem},
        # How an operator points pip at a mirror: its URL, and its CA when it is internal.
        env={
            "PIP_INDEX_URL": f"https://pypi.test:{port}/simple/",
            "PIP_CERT": "/workspace/ca.pem",
        },
        limits={"timeout_s": 60, **limits},
    )


def test_pip_installs_from_the_allowed_index(
    net: execbox.Executor, upstream: Upstream, index: int, pip_environment: str
) -> None:
    result = install(net, upstream, index, [f"pypi.test:{index}"])
    assert result.status == "ok" and result.stdout == "installed 7\n", result.stderr
    assert {(e.method, e.host, e.verdict) for e in result.network_log} == {
        ("CONNECT", "pypi.test", "allowed")
    }


def test_pip_without_the_index_on_the_allowlist_installs_nothing(
    net: execbox.Executor, upstream: Upstream, index: int, pip_environment: str
) -> None:
    result = install(net, upstream, index, [f"api.test:{index}"])
    assert result.stdout.startswith("pip failed"), result.stderr
    assert {(e.host, e.verdict, e.rule) for e in result.network_log} == {
        ("pypi.test", "denied", "network.host")
    }


def test_pip_install_is_capped_by_the_egress_bytes(
    net: execbox.Executor, upstream: Upstream, index: int, pip_environment: str
) -> None:
    result = install(net, upstream, index, [f"pypi.test:{index}"], network_bytes=3000)
    assert result.status == "network_limit", result.stderr
    assert result.error is not None and "network_bytes" in result.error.message
