"""JavaScript and bash through the MCP face: one tool per language the profile runs."""

from __future__ import annotations

from typing import Any

import anyio
from mcp import Client
from mcp_types import TextContent

from execbox import Executor
from execbox.mcp.server import build_server


def _text(result: Any) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def _session(executor: Executor, profile: str, calls: list[tuple[str, dict[str, Any]]]) -> Any:
    async def main() -> tuple[dict[str, Any], list[str]]:
        async with Client(build_server(executor, profile=profile), read_timeout_seconds=60) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            return tools, [_text(await c.call_tool(name, args)) for name, args in calls]

    return anyio.run(main)


def test_mcp_offers_run_javascript_and_run_bash_and_they_run(executor: Executor) -> None:
    tools, (js, sh, bad) = _session(
        executor,
        "data",
        [
            ("run_javascript", {"code": "console.log([1, 2, 3].map((x) => x * 2).join(','))"}),
            ("run_bash", {"code": "echo $((6 * 7)) | wc -c"}),
            ("run_javascript", {"code": "null.x"}),
        ],
    )
    assert {"run_python", "run_javascript", "run_bash"} <= set(tools)
    assert "Node.js" in tools["run_javascript"].description
    assert "jq" in tools["run_bash"].description
    assert "2,4,6" in js
    assert "3" in sh
    assert "TypeError" in bad


def test_mcp_offers_only_the_languages_its_profile_runs(executor: Executor) -> None:
    tools, _ = _session(executor, "minimal", [])
    assert "run_python" in tools and "run_javascript" in tools
    assert "run_bash" not in tools
