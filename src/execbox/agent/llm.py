"""The model seam: which LLM answers, how a stage asks it, and what each call cost.

Models come from pydantic-ai, chosen by a model string: `openai:gpt-4o`,
`anthropic:claude-sonnet-4-5`, any pydantic-ai model id, or a bare model name served by an
OpenAI-compatible server (vLLM, Ollama, llama.cpp) at `base_url`, spoken to over Chat
Completions. Settings come from the call, then the environment (`EXECBOX_MODEL`,
`EXECBOX_BASE_URL` or `OPENAI_BASE_URL`), then the config file (`EXECBOX_AGENT_CONFIG`, default
`$EXECBOX_HOME/agent.toml`).

`ScriptedModel` is the fake for tests: it answers each stage from a per-stage script.
"""

from __future__ import annotations

import json
import os
import time
import tomllib
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, Field, ValidationError

from ..errors import UsageError

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage, ModelResponse
    from pydantic_ai.models import Model
    from pydantic_ai.models.function import AgentInfo

T = TypeVar("T", bound=BaseModel)

NO_MODEL = (
    "no model configured for `execbox ask`: pass --model (e.g. 'openai:gpt-4o', "
    "'anthropic:claude-sonnet-4-5'), set EXECBOX_MODEL, or write `model = \"...\"` "
    "in {path}; for an OpenAI-compatible server (vLLM, Ollama, llama.cpp) also set "
    "EXECBOX_BASE_URL (or base_url in the file) and use the served model's name"
)


# The providers whose key execbox checks before the model library does: its message would be
# about its own API (`OpenAIProvider(api_key=...)`), not about execbox's settings.
PROVIDER_KEYS = {
    "openai": "OPENAI_API_KEY",
    "openai-chat": "OPENAI_API_KEY",
    "openai-responses": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
}


class ModelConfig(BaseModel):
    """Which model the agent uses. The same fields are read from the config file."""

    model: str | None = Field(None, description="A pydantic-ai model id or a served model name.")
    base_url: str | None = Field(
        None, description="An OpenAI-compatible server's base URL (…/v1) for a bare model name."
    )
    api_key_env: str = Field(
        "OPENAI_API_KEY", description="Environment variable holding the key for base_url."
    )


def config_path() -> Path:
    explicit = os.environ.get("EXECBOX_AGENT_CONFIG")
    if explicit:
        return Path(explicit)
    from ..image import home

    return home() / "agent.toml"


def load_config(model: str | None = None, base_url: str | None = None) -> ModelConfig:
    """The effective model settings: arguments, then environment, then the config file."""
    path = config_path()
    file_values: dict[str, Any] = {}
    if path.is_file():
        try:
            file_values = tomllib.loads(path.read_text())
            file_values = file_values.get("agent", file_values)
            ModelConfig.model_validate(file_values)
        except (tomllib.TOMLDecodeError, ValidationError) as exc:
            raise UsageError(f"invalid agent config {path}: {exc}") from exc
    cfg = ModelConfig.model_validate(file_values)
    return cfg.model_copy(
        update={
            "model": model or os.environ.get("EXECBOX_MODEL") or cfg.model,
            "base_url": (
                base_url
                or os.environ.get("EXECBOX_BASE_URL")
                or cfg.base_url
                or os.environ.get("OPENAI_BASE_URL")
            ),
        }
    )


def resolve_model(model: Model | str | None = None, *, base_url: str | None = None) -> Model:
    """A pydantic-ai Model from an object, a model string or the configuration."""
    from pydantic_ai.exceptions import UserError as PaiUserError
    from pydantic_ai.models import Model as ModelBase
    from pydantic_ai.models import infer_model

    if isinstance(model, ModelBase):
        return model
    cfg = load_config(model, base_url)
    if not cfg.model:
        raise UsageError(NO_MODEL.format(path=config_path()))
    name = cfg.model
    if cfg.base_url is not None:
        _check_base_url(cfg.base_url)
    if ":" not in name or name.startswith("openai-compatible:"):
        if not cfg.base_url:
            raise UsageError(
                f"model {name!r} names no provider: use e.g. 'openai:{name}' or "
                f"'anthropic:{name}', or set EXECBOX_BASE_URL to the OpenAI-compatible server "
                "that serves it"
            )
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        key = os.environ.get(cfg.api_key_env) or "not-needed"
        provider = OpenAIProvider(base_url=cfg.base_url, api_key=key)
        return OpenAIChatModel(name.removeprefix("openai-compatible:"), provider=provider)
    prefix = name.partition(":")[0]
    needed = PROVIDER_KEYS.get(prefix)
    if needed is not None and not os.environ.get(needed):
        raise UsageError(
            f"model {name!r} needs an API key: set {needed} (or, for a model served by an "
            "OpenAI-compatible server, pass its name with --base-url)"
        )
    try:
        return infer_model(name)
    except (PaiUserError, ValueError) as exc:
        # The library's words name its own API; ours name the settings.
        raise UsageError(
            f"cannot use model {name!r}: {prefix!r} is not a provider execbox can set up "
            "here (e.g. 'openai:gpt-4o', 'anthropic:claude-sonnet-4-5', or a served model's "
            f"name with --base-url); the model library said: {_first_line(exc)}"
        ) from exc


def _check_base_url(url: str) -> None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(
            f"base URL {url!r} is not an http(s) URL: give the OpenAI-compatible server's "
            "API root, e.g. http://localhost:8000/v1 (--base-url, EXECBOX_BASE_URL, "
            "OPENAI_BASE_URL or base_url in the agent config)"
        )


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class ModelUnreachable(UsageError):
    """The configured model cannot be used at all: its server does not answer or refuses the
    key. A setting to fix, not a failure of the ask: `execbox ask` exits 2."""


class ModelFailure(Exception):
    """A model call failed (transport, refusal, or output that never validated)."""


@dataclass
class ModelCall:
    """One stage's model call: what it cost."""

    stage: str
    model: str
    input_tokens: int
    output_tokens: int
    requests: int
    duration_ms: float
    ok: bool
    error: str | None = None


class LLM:
    """Asks the model for one stage's structured output and reports every call."""

    def __init__(
        self,
        model: Model,
        on_call: Callable[[ModelCall], None] | None = None,
        output_retries: int = 2,
    ) -> None:
        self.model = model
        self.on_call = on_call
        self.output_retries = output_retries

    @property
    def name(self) -> str:
        return f"{self.model.system}:{self.model.model_name}"

    def ask(self, stage: str, output_type: type[T], instructions: str, prompt: str) -> T:
        from pydantic_ai import Agent, ToolOutput
        from pydantic_ai.exceptions import (
            AgentRunError,
            ModelAuthenticationError,
            ModelConnectionError,
        )

        output = ToolOutput(output_type, name=f"submit_{stage}", max_retries=self.output_retries)
        agent = Agent(self.model, output_type=output, instructions=instructions)
        start = time.monotonic()
        try:
            result = agent.run_sync(prompt)
        except (ModelConnectionError, ModelAuthenticationError) as exc:
            unusable = self._unusable(exc)
            self._failed(stage, start, unusable)
            raise unusable from exc
        except AgentRunError as exc:
            self._report(
                ModelCall(
                    stage,
                    self.name,
                    0,
                    0,
                    1,
                    (time.monotonic() - start) * 1000,
                    False,
                    f"{type(exc).__name__}: {exc}",
                )
            )
            raise ModelFailure(f"{stage}: {type(exc).__name__}: {exc}") from exc
        usage = result.usage
        self._report(
            ModelCall(
                stage,
                self.name,
                usage.input_tokens,
                usage.output_tokens,
                usage.requests,
                (time.monotonic() - start) * 1000,
                True,
            )
        )
        out: T = result.output
        return out

    def _unusable(self, exc: Exception) -> ModelUnreachable:
        from pydantic_ai.exceptions import ModelAuthenticationError

        where = getattr(self.model, "base_url", None) or f"{self.model.system}'s API"
        model = f"model {self.model.model_name!r} at {where}"
        if isinstance(exc, ModelAuthenticationError):
            return ModelUnreachable(
                f"{model} refused the API key: check the key's environment variable "
                "(api_key_env in the agent config, OPENAI_API_KEY by default)"
            )
        cause: BaseException = exc
        while cause.__cause__ is not None:  # the transport's own error says what failed
            cause = cause.__cause__
        detail = _first_line(cause)
        return ModelUnreachable(
            f"cannot reach the {model} ({detail}): start the model server, or correct "
            "--base-url / EXECBOX_BASE_URL"
        )

    def _failed(self, stage: str, start: float, exc: Exception) -> None:
        elapsed = (time.monotonic() - start) * 1000
        self._report(ModelCall(stage, self.name, 0, 0, 1, elapsed, False, str(exc)))

    def _report(self, call: ModelCall) -> None:
        if self.on_call is not None:
            self.on_call(call)


Reply = BaseModel | Mapping[str, Any] | Callable[[str], BaseModel | Mapping[str, Any]]


class ScriptedModel:
    """A fake model for tests: each stage answers from its own queue of replies, in order.

    A reply is the stage's output (a model or a dict), or a function of the prompt that returns
    one. Every call reports `tokens_per_call` tokens (split 2:1 into input and output) so the
    circuit breakers and the trace can be tested. `prompts` keeps (stage, prompt) of every call.
    """

    def __init__(
        self, script: Mapping[str, Iterable[Reply]], *, tokens_per_call: int = 150
    ) -> None:
        from pydantic_ai.models.function import FunctionModel

        self.queues = {stage: deque(replies) for stage, replies in script.items()}
        self.tokens_per_call = tokens_per_call
        self.prompts: list[tuple[str, str]] = []
        self.model: Model = FunctionModel(self._respond, model_name="scripted")

    def calls(self, stage: str) -> list[str]:
        return [prompt for s, prompt in self.prompts if s == stage]

    def _respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, UserPromptPart
        from pydantic_ai.usage import RequestUsage

        stage = info.output_tools[0].name.removeprefix("submit_")
        prompt = ""
        for message in messages:
            if isinstance(message, ModelRequest):
                for part in message.parts:
                    if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                        prompt = part.content
        self.prompts.append((stage, prompt))
        queue = self.queues.get(stage)
        if not queue:
            raise AssertionError(f"the script has no reply left for stage {stage!r}")
        reply = queue.popleft()
        if callable(reply):
            reply = reply(prompt)
        args = reply.model_dump(mode="json") if isinstance(reply, BaseModel) else dict(reply)
        third = self.tokens_per_call // 3
        return ModelResponse(
            parts=[ToolCallPart(info.output_tools[0].name, json.dumps(args))],
            usage=RequestUsage(input_tokens=self.tokens_per_call - third, output_tokens=third),
            model_name="scripted",
        )
