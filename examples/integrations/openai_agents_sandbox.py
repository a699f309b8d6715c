"""The OpenAI Agents SDK's sandbox example with execbox as the sandbox.

The SDK's own example (a SandboxAgent that inspects a small project through its shell tool)
with one change: the sandbox client is `ExecboxSandboxClient` instead of Docker's or Modal's.

    pip install 'execbox[openai-agents]'
    OPENAI_API_KEY=... python examples/integrations/openai_agents_sandbox.py
    # against a remote `execbox serve`:
    OPENAI_API_KEY=... python examples/integrations/openai_agents_sandbox.py \
        --server http://127.0.0.1:8000 --api-key "$EXECBOX_API_KEY"
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from agents import ModelSettings, Runner
from agents.models.interface import Model
from agents.run import RunConfig
from agents.sandbox import Manifest, SandboxAgent, SandboxRunConfig
from agents.sandbox.entries import File

import execbox
from execbox.integrations.openai_agents import ExecboxSandboxClient

QUESTION = "Summarize this sandbox project in 2 sentences."


def build_manifest() -> Manifest:
    return Manifest(
        entries={
            "README.md": File(
                content=b"# Demo Project\n\nThis sandbox contains a tiny demo project.\n"
            ),
            "src/app.py": File(
                content=b'def greet(name: str) -> str:\n    return f"Hello, {name}!"\n'
            ),
            "docs/notes.md": File(content=b"# Notes\n\n- The example is intentionally minimal.\n"),
        }
    )


def build_agent(model: str | Model, manifest: Manifest) -> SandboxAgent[Any]:
    return SandboxAgent(
        name="Sandbox Assistant",
        model=model,
        instructions=(
            "Answer questions about the sandbox workspace. Inspect the project before "
            "answering, and keep the response concise."
        ),
        default_manifest=manifest,
        model_settings=ModelSettings(tool_choice="required"),
    )


async def main(model: str | Model, question: str, backend: Any) -> str:
    manifest = build_manifest()
    agent = build_agent(model, manifest)
    # The one line that chooses the sandbox: execbox, in this process or on a server.
    client = ExecboxSandboxClient(backend)
    session = await client.create(manifest=manifest)
    try:
        async with session:
            result = await Runner.run(
                agent, question, run_config=RunConfig(sandbox=SandboxRunConfig(session=session))
            )
            return str(result.final_output)
    finally:
        await client.delete(session)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gpt-5.4")
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument("--server", help="an `execbox serve` URL (default: run in-process)")
    parser.add_argument("--api-key")
    args = parser.parse_args()
    backend = execbox.Client(args.server, args.api_key) if args.server else execbox.Executor()
    with backend:
        print(asyncio.run(main(args.model, args.question, backend)))
