"""Model configuration, output clean-up and model failures (no sandbox needed for most)."""

from __future__ import annotations

from pathlib import Path

import pytest

import execbox
from execbox.agent import ScriptedModel, ask, load_config, resolve_model
from execbox.agent.models import Program
from tests.agent.agent_scripts import plan


def test_code_in_a_markdown_fence_is_unwrapped() -> None:
    prog = Program(code="```python\nprint(1)\n```", cells=["```\nx = 1\n```", "y = 2"])
    assert prog.code == "print(1)\n"
    assert prog.cells == ["x = 1\n", "y = 2"]
    assert Program(code="print('```')").code == "print('```')"


def test_config_file_names_the_model_and_server(
    no_model_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pydantic_ai.models.openai import OpenAIChatModel

    path = tmp_path / "agent.toml"
    path.write_text('model = "qwen2.5-coder"\nbase_url = "http://127.0.0.1:9/v1"\n')
    monkeypatch.setenv("EXECBOX_AGENT_CONFIG", str(path))
    cfg = load_config()
    assert (cfg.model, cfg.base_url) == ("qwen2.5-coder", "http://127.0.0.1:9/v1")
    model = resolve_model()
    assert isinstance(model, OpenAIChatModel)
    assert model.model_name == "qwen2.5-coder"
    assert model.base_url.startswith("http://127.0.0.1:9/v1")
    monkeypatch.setenv("EXECBOX_MODEL", "other-model")  # the environment beats the file
    assert load_config().model == "other-model"
    assert load_config("cli-model").model == "cli-model"  # and the call beats both


def test_invalid_config_file_is_a_usage_error(
    no_model_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "agent.toml"
    path.write_text("model = [1, 2]\n")
    monkeypatch.setenv("EXECBOX_AGENT_CONFIG", str(path))
    with pytest.raises(execbox.UsageError, match="invalid agent config"):
        load_config()


def test_provider_model_strings_go_through_pydantic_ai(
    no_model_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-used")
    model = resolve_model("anthropic:claude-sonnet-4-5")
    assert (model.system, model.model_name) == ("anthropic", "claude-sonnet-4-5")
    with pytest.raises(execbox.UsageError, match="cannot use model"):
        resolve_model("nosuchprovider:model")


def test_output_that_never_validates_ends_in_a_model_error_failure(
    executor: execbox.Executor,
) -> None:
    model = ScriptedModel({"plan": [plan("x")], "generate": [{"notes": "no code"}] * 5})
    answer = ask("Anything?", executor=executor, model=model.model)
    assert answer.status == "failed"
    assert answer.failure is not None and answer.failure.kind == "model_error"
    assert "generate" in answer.failure.message
    assert len(model.calls("generate")) == 3  # the first try and pydantic-ai's 2 output retries
