"""A network allowlist through each face: the CLI's --allow-net, the HTTP body, the MCP
server's and tool helpers' `network` (which the tool's description names to the model)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

import execbox
from execbox.mcp.server import build_server
from execbox.tools import describe_environment, execute_tool_call
from tests.faces.test_cli import cli
from tests.network.servers import Upstream
from tests.server.conftest import own_server

FETCH_HELLO = (
    "import urllib.request\n"
    "print(urllib.request.urlopen('http://{host}:{port}/hello', timeout=10).read().decode())\n"
)


def test_cli_allow_net_reaches_the_named_host(
    net: execbox.Executor, upstream: Upstream, tmp_path: Path
) -> None:
    """The CLI has no resolver map: it names the server by its address, which an entry
    naming it exactly lets the proxy dial although it is loopback."""
    port = upstream.http_port
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(
        '[profiles.net]\ndescription = "test"\nnetwork_allow = ["127.0.0.1/32:*"]\n'
        "max_code_bytes = 65536\nmax_input_bytes = 65536\nmax_input_files = 4\n"
        "max_csv_rows = 10\n[profiles.net.limits]\n[profiles.net.max_limits]\n"
    )
    env = {**os.environ, "EXECBOX_PROFILES": str(profiles)}
    code = FETCH_HELLO.format(host="127.0.0.1", port=port).encode()
    upstream.clear()
    args = ["run", "-", "--json", "--profile", "net", "--allow-net", f"127.0.0.1:{port}"]
    proc = cli(*args, stdin=code, env=env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["stdout"] == f"hello host=127.0.0.1:{port}\n"
    assert [e["verdict"] for e in result["network_log"]] == ["allowed"]
    # without the flag, the same program has no network
    proc = cli("run", "-", "--json", "--profile", "net", stdin=code, env=env)
    assert json.loads(proc.stdout)["status"] == "error"
    assert len(upstream.seen()) == 1


def test_http_body_network_reaches_the_named_host(
    net: execbox.Executor, upstream: Upstream
) -> None:
    port = upstream.http_port
    with own_server(net) as (url, state):
        assert state.keys is not None
        key = state.keys.create("net-tenant", max_concurrent=4, max_sessions=1, rpm=1000)
        body = {
            "code": FETCH_HELLO.format(host="api.test", port=port),
            "network": [f"api.test:{port}"],
            "profile": "net",
        }
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as client:
            result = client.post("/v1/runs", json=body, timeout=60).json()
            refused = client.post("/v1/runs", json={**body, "profile": "data"}, timeout=60)
    assert result["stdout"] == f"hello host=api.test:{port}\n", result
    assert result["network_log"][0]["entry"] == f"api.test:{port}"
    assert refused.json()["status"] == "policy_denied"
    assert refused.json()["error"]["rule"] == "network.not_allowed"


def test_http_body_bound_secret_reaches_its_host_only(
    net: execbox.Executor, upstream: Upstream
) -> None:
    port = upstream.https_port
    value = "tok-" + os.urandom(16).hex()
    code = (
        "import os, urllib.request\n"
        f"r = urllib.request.Request('https://api.test:{port}/hello', "
        "headers={'X-Token': os.environ['TOKEN']})\n"
        "print(urllib.request.urlopen(r, timeout=10).status, value_seen := "
        f"{value[:10]!r} + {value[10:]!r} in os.environ.values())\n"
    )
    bound = [
        {"name": "TOKEN", "value": value, "hosts": [f"api.test:{port}"], "headers": ["X-Token"]}
    ]
    with own_server(net) as (url, state):
        assert state.keys is not None
        key = state.keys.create("net-tenant-2", max_concurrent=4, max_sessions=1, rpm=1000)
        body = {"code": code, "network": [f"api.test:{port}"], "profile": "net"}
        upstream.clear()
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as client:
            result = client.post("/v1/runs", json={**body, "bound_secrets": bound}, timeout=60)
            bad = client.post(
                "/v1/runs", json={**body, "bound_secrets": [{**bound[0], "hosts": ["x.test"]}]}
            )
    assert result.json()["stdout"] == "200 False\n", result.json()
    assert f"x-token: {value}" in upstream.https.heads[0]
    assert bad.status_code == 400 and "not on the run's network allowlist" in bad.text


def test_cli_secret_for_reads_the_value_from_the_environment(tmp_path: Path) -> None:
    """--secret-for NAME=HOST: the value comes from the caller's environment (not argv);
    the program's NAME holds a placeholder."""
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(
        '[profiles.net]\ndescription = "test"\nnetwork_allow = ["*"]\n'
        "max_code_bytes = 65536\nmax_input_bytes = 65536\nmax_input_files = 4\n"
        "max_csv_rows = 10\n[profiles.net.limits]\n[profiles.net.max_limits]\n"
    )
    value = "tok-" + os.urandom(16).hex()
    env = {**os.environ, "EXECBOX_PROFILES": str(profiles), "GH_TOKEN": value}
    code = (
        "import os\nt = os.environ['GH_TOKEN']\n"
        f"print(t.startswith('execbox-placeholder-'), {value[:10]!r} + {value[10:]!r} == t)\n"
    ).encode()
    args = ["run", "-", "--json", "--profile", "net", "--allow-net", "api.example.com"]
    proc = cli(*args, "--secret-for", "GH_TOKEN=api.example.com", stdin=code, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["stdout"] == "True False\n"
    missing = cli(*args, "--secret-for", "NO_SUCH_VAR=api.example.com", stdin=code, env=env)
    assert missing.returncode == 2 and b"no variable NO_SUCH_VAR" in missing.stderr


def test_tool_helpers_pass_the_operators_hosts_and_tell_the_model(
    net: execbox.Executor, upstream: Upstream
) -> None:
    port = upstream.http_port
    hosts = [f"api.test:{port}"]
    assert "There is no network access" in describe_environment()
    told = describe_environment(network=hosts)
    assert f"api.test:{port}" in told and "no network access" not in told
    call = {"code": FETCH_HELLO.format(host="api.test", port=port)}
    observation = execute_tool_call(net, call, profile="net", network=hosts)
    assert f"hello host=api.test:{port}" in observation
    assert "status: error" in execute_tool_call(net, call, profile="net")


def test_mcp_run_python_tells_the_model_the_operators_hosts(net: execbox.Executor) -> None:
    async def main() -> Any:
        with_net = {t.name: t for t in await build_server(net, network=["api.test"]).list_tools()}
        without = {t.name: t for t in await build_server(net).list_tools()}
        return with_net["run_python"], without["run_python"]

    tool, plain = asyncio.run(main())
    assert "api.test" in (tool.description or "")
    assert tool.annotations is not None and tool.annotations.open_world_hint is True
    assert "no network" in (plain.description or "")
    assert plain.annotations is not None and plain.annotations.open_world_hint is False


def test_the_http_client_passes_network_bound_secrets_and_a_sessions_network(
    net: execbox.Executor, upstream: Upstream
) -> None:
    """`execbox.client.Client`: a run's allowlist and bound secrets, a session's allowlist."""
    from execbox.client import Client

    value = "tok-" + os.urandom(16).hex()
    https, http = upstream.https_port, upstream.http_port
    code = (
        "import os, urllib.request\n"
        f"r = urllib.request.Request('https://api.test:{https}/hello', "
        "headers={'Authorization': 'Bearer ' + os.environ['TOKEN']})\n"
        "print(urllib.request.urlopen(r, timeout=10).status)\n"
    )
    bound = {"name": "TOKEN", "value": value, "hosts": [f"api.test:{https}"]}
    with own_server(net) as (url, state):
        assert state.keys is not None
        key = state.keys.create("net-client", max_concurrent=4, max_sessions=1, rpm=1000)
        with Client(url, key) as client:
            upstream.clear()
            result = client.run(
                code, profile="net", network=[f"api.test:{https}"], bound_secrets=[bound]
            )
            assert (result.status, result.stdout) == ("ok", "200\n"), result
            assert f"authorization: Bearer {value}" in upstream.https.heads[0]
            assert value not in result.model_dump_json()
            without = client.run(code, profile="net")  # no network asked: none given
            assert without.status == "error" and not without.network_log
            with pytest.raises(execbox.UsageError, match="bound_secrets"):
                client.run(code, profile="net", bound_secrets=[{"name": "TOKEN"}])
            session = client.session(profile="net", network=[f"api.test:{http}"])
            try:
                cell = session.run(FETCH_HELLO.format(host="api.test", port=http))
            finally:
                session.close()
            assert cell.stdout == f"hello host=api.test:{http}\n", cell
            assert [e.verdict for e in cell.network_log] == ["allowed"]


def test_the_mcp_command_allow_net_reaches_the_named_host_and_refuses_a_bad_entry(
    upstream: Upstream, tmp_path: Path
) -> None:
    """`execbox mcp --allow-net`: over stdio, run_python's description names the host and a
    run reaches it; a malformed entry stops the server at its start, exit 2."""
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp.types import TextContent

    port = upstream.http_port
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(
        '[profiles.net]\ndescription = "test"\nnetwork_allow = ["127.0.0.1/32:*"]\n'
        "max_code_bytes = 65536\nmax_input_bytes = 65536\nmax_input_files = 4\n"
        "max_csv_rows = 10\n[profiles.net.limits]\n[profiles.net.max_limits]\n"
    )
    env = {**os.environ, "EXECBOX_PROFILES": str(profiles)}
    entry = f"127.0.0.1:{port}"
    args = ["-m", "execbox.cli", "mcp", "--profile", "net", "--allow-net", entry]

    async def main() -> tuple[Any, Any]:
        params = StdioServerParameters(command=sys.executable, args=args, env=env)
        with (tmp_path / "server.log").open("w") as log:
            async with (
                stdio_client(params, errlog=log) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                tools = {t.name: t for t in (await session.list_tools()).tools}
                code = FETCH_HELLO.format(host="127.0.0.1", port=port)
                return tools["run_python"], await session.call_tool("run_python", {"code": code})

    upstream.clear()
    tool, ran = anyio.run(main)
    assert entry in (tool.description or "")
    text = "\n".join(c.text for c in ran.content if isinstance(c, TextContent))
    assert f"hello host={entry}" in text, text
    assert len(upstream.seen()) == 1
    bad = cli("mcp", "--allow-net", "not a host!", stdin=b"", env=env)
    assert bad.returncode == 2 and b"not a host name" in bad.stderr


def test_mcp_bound_secret_reaches_its_host_and_the_model_sees_a_placeholder(
    net: execbox.Executor, upstream: Upstream
) -> None:
    """The operator's secret bound to a host (`execbox mcp --secret-for`): run_python's
    request to the host carries the value; the tool's answer carries none of it."""
    from mcp import Client
    from mcp.types import TextContent

    port = upstream.https_port
    value = "tok-" + os.urandom(16).hex()
    code = (
        "import os, urllib.request\n"
        f"r = urllib.request.Request('https://api.test:{port}/hello', "
        "headers={'Authorization': 'Bearer ' + os.environ['TOKEN']})\n"
        "print(urllib.request.urlopen(r, timeout=10).status, os.environ['TOKEN'])\n"
    )
    bound = [{"name": "TOKEN", "value": value, "hosts": [f"api.test:{port}"]}]
    server = build_server(net, profile="net", network=[f"api.test:{port}"], bound_secrets=bound)

    async def main() -> Any:
        async with Client(server, read_timeout_seconds=60) as client:
            return await client.call_tool("run_python", {"code": code})

    upstream.clear()
    ran = asyncio.run(main())
    text = "\n".join(c.text for c in ran.content if isinstance(c, TextContent))
    assert text.endswith("200 [REDACTED:secret]"), text  # the placeholder, redacted too
    assert value not in text and value not in json.dumps(ran.structured_content)
    assert f"authorization: Bearer {value}" in upstream.https.heads[0]
    env = {**os.environ, "GH_TOKEN": value}
    for net_args in ((), ("--allow-net", "other.example.com")):  # the host must be allowed
        args = ("mcp", *net_args, "--secret-for", "GH_TOKEN=api.example.com")
        unlisted = cli(*args, stdin=b"", env=env)
        assert unlisted.returncode == 2 and b"allowlist" in unlisted.stderr, unlisted.stderr
