"""`execbox ask` when the model cannot be used: an unreachable server names its URL and the model
and exits 2; configuration mistakes exit 2 in execbox's own words, never the model library's
hints about its own API."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

import execbox
from execbox.agent import ModelUnreachable, ask
from execbox.agent.trace import TraceStore
from execbox.cli import main


@pytest.fixture
def closed_url() -> Iterator[str]:
    """A loopback URL nothing listens on: a port bound and never listened on, so no other
    process can take it while the test runs."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{holder.getsockname()[1]}/v1"


def test_an_unreachable_model_names_its_url_and_model_and_exits_2(
    executor: execbox.Executor, no_model_env: None, closed_url: str
) -> None:
    result = CliRunner().invoke(
        main, ["ask", "What is 2 + 2?", "--model", "served-model", "--base-url", closed_url]
    )
    assert result.exit_code == 2, result.output
    message = result.stderr
    assert message.startswith("execbox: cannot reach the model 'served-model' at ")
    assert closed_url in message
    assert "--base-url" in message
    assert "Connection error." not in message


def test_the_python_api_raises_with_the_url_and_records_the_ask(
    executor: execbox.Executor, no_model_env: None, closed_url: str
) -> None:
    with pytest.raises(ModelUnreachable, match="cannot reach the model 'served-model'") as caught:
        ask("What is 2 + 2?", executor=executor, model="served-model", base_url=closed_url)
    assert isinstance(caught.value, execbox.UsageError)
    store = TraceStore(executor.store.engine)
    latest = store.get(store.list(1)[0]["ask_id"])
    assert latest is not None and latest.status == "error"
    (call,) = latest.model_calls
    assert not call.ok and call.error is not None and closed_url in call.error


@pytest.mark.parametrize(
    ("args", "env", "expected", "foreign"),
    [
        (
            ["--model", "openai:gpt-4o"],
            {"OPENAI_API_KEY": ""},
            "model 'openai:gpt-4o' needs an API key: set OPENAI_API_KEY",
            "OpenAIProvider(",
        ),
        (
            ["--model", "anthropic:claude-sonnet-4-5"],
            {"ANTHROPIC_API_KEY": ""},
            "needs an API key: set ANTHROPIC_API_KEY",
            "AnthropicProvider(",
        ),
        (
            ["--model", "served-model", "--base-url", "localhost:8000"],
            {},
            "base URL 'localhost:8000' is not an http(s) URL",
            "Traceback",
        ),
        (
            ["--model", "nosuch:thing"],
            {},
            "cannot use model 'nosuch:thing': 'nosuch' is not a provider execbox can set up",
            "Traceback",
        ),
    ],
)
def test_configuration_errors_exit_2_in_execboxs_words(
    no_model_env: None,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: dict[str, str],
    expected: str,
    foreign: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # No sandbox is needed: the model is resolved before the executor starts.
    result = CliRunner().invoke(main, ["ask", "Anything?", *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("execbox: ")
    assert expected in result.stderr
    assert foreign not in result.stderr
    assert "Agent('test')" not in result.stderr
