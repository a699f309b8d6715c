"""smolagents' secure-execution example with execbox as the executor.

smolagents' documented E2B example (`CodeAgent(..., executor_type="e2b")` asked for the 100th
Fibonacci number) with one change: `executor=ExecboxExecutor(...)` chooses the sandbox.

    pip install 'execbox[smolagents]' 'smolagents[openai]'
    OPENAI_API_KEY=... python examples/integrations/smolagents_executor.py
    # against a remote `execbox serve`:
    python examples/integrations/smolagents_executor.py --server URL --api-key KEY
"""

from __future__ import annotations

import argparse
from typing import Any

from smolagents import CodeAgent
from smolagents.models import Model

import execbox
from execbox.integrations.smolagents import ExecboxExecutor

QUESTION = "Can you give me the 100th Fibonacci number?"


def main(model: Model, question: str, backend: Any) -> Any:
    with CodeAgent(model=model, tools=[], executor=ExecboxExecutor(backend)) as agent:
        return agent.run(question)


if __name__ == "__main__":
    from smolagents import OpenAIServerModel

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gpt-4.1-mini")
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument("--server", help="an `execbox serve` URL (default: run in-process)")
    parser.add_argument("--api-key")
    args = parser.parse_args()
    backend = execbox.Client(args.server, args.api_key) if args.server else execbox.Executor()
    with backend:
        print(main(OpenAIServerModel(model_id=args.model), args.question, backend))
