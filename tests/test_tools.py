"""Tool schemas for agent frameworks and the observation a model gets back from a tool call."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
from pydantic import BaseModel

import execbox
from execbox import tools
from execbox.contract import Limits, RunResult, Status

REQUIREMENTS_IN = Path(tools.__file__).parent / "runtime" / "requirements.in"


def _pins() -> dict[str, str]:
    pins = {}
    for line in REQUIREMENTS_IN.read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith("#"):
            pins[name.strip()] = version.strip()
    return pins


# --- schemas -------------------------------------------------------------------------------


def test_openai_and_anthropic_schemas_carry_the_same_parameters_derived_from_the_model() -> None:
    openai = tools.openai_tool()
    anthropic = tools.anthropic_tool()
    assert openai["type"] == "function"
    params = openai["function"]["parameters"]
    assert anthropic["input_schema"] == params
    assert openai["function"]["name"] == anthropic["name"] == "run_python"
    assert set(params["properties"]) == set(tools.RunPython.model_fields)
    assert params["required"] == ["code"]
    assert params["additionalProperties"] is False
    text = json.dumps(params)
    assert "$ref" not in text and "$defs" not in text and '"title"' not in text
    jsonschema.Draft202012Validator.check_schema(params)
    validator = jsonschema.Draft202012Validator(params)
    assert validator.is_valid({"code": "print(1)", "files": {"a.csv": "x\n"}, "timeout_s": 3})
    assert not validator.is_valid({"files": {}})  # code is required
    assert not validator.is_valid({"code": "print(1)", "network": "on"})
    assert not validator.is_valid({"code": "print(1)", "timeout_s": 10_000})  # over the max


def test_responses_api_format_puts_the_function_fields_at_the_top_level() -> None:
    tool = tools.openai_tool(api="responses", name="python")
    assert tool["type"] == "function" and tool["name"] == "python"
    assert tool["parameters"] == tools.parameters_schema()
    assert "function" not in tool


def test_description_names_the_installed_packages_with_their_pinned_versions() -> None:
    description = tools.anthropic_tool()["description"]
    pins = _pins()
    for name in ("numpy", "pandas", "matplotlib", "scipy"):
        assert f"{name} {pins[name]}" in description
    assert re.search(r"Python 3\.\d+", description)


def test_description_says_no_network_where_files_are_and_the_limits_in_force() -> None:
    description = tools.openai_tool(Limits(timeout_s=7, memory_mib=300, pids=32))["function"][
        "description"
    ]
    assert "no network" in description
    assert "/workspace" in description and "read-only" in description
    assert "7 s wall time" in description and "300 MiB memory" in description
    assert "32 processes" in description
    default = tools.anthropic_tool()["description"]
    assert f"{Limits().memory_mib} MiB memory" in default


# --- observations (no sandbox needed) ------------------------------------------------------


def _cut_count(text: str) -> int:
    match = re.search(r"\[\.\.\. ([\d,]+) characters cut \.\.\.\]", text)
    assert match, text
    return int(match[1].replace(",", ""))


def test_long_output_is_cut_in_the_middle_with_a_note_saying_how_much() -> None:
    stdout = "HEAD" + "x" * 10_000 + "TAIL"
    result = RunResult(run_id="r", status=Status.ok, exit_code=0, stdout=stdout)
    text = tools.format_observation(result, max_output_chars=300)
    assert "HEAD" in text and "TAIL" in text
    cut = len(stdout) - 300
    assert _cut_count(text) == cut
    assert f"{len(stdout):,} characters, {cut:,} cut from the middle" in text
    assert len(text) < 600


def test_long_output_is_cut_on_line_boundaries() -> None:
    stdout = "".join(f"row {i:04d}\n" for i in range(1000))
    result = RunResult(run_id="r", status=Status.ok, exit_code=0, stdout=stdout)
    body = tools.format_observation(result, max_output_chars=500).split(":\n", 1)[1]
    kept = [line for line in body.splitlines() if not line.startswith("[...")]
    assert kept[0] == "row 0000" and kept[-1] == "row 0999"
    assert all(re.fullmatch(r"row \d{4}", line) for line in kept)
    assert len("".join(f"{line}\n" for line in kept)) + _cut_count(body) == len(stdout)


def test_short_output_is_shown_whole_without_a_note() -> None:
    result = RunResult(run_id="r", status=Status.ok, exit_code=0, stdout="42\n")
    assert tools.format_observation(result) == "status: ok\nstdout:\n42"


def test_cell_outputs_show_plain_text_and_name_images_without_repeating_html() -> None:
    from execbox.contract import Output

    png = "iVBORw0KGgo" + "A" * 400  # base64 of ~300 bytes
    result = RunResult(
        run_id="r",
        status=Status.ok,
        exit_code=0,
        outputs=[
            Output(mime_type="text/plain", data="   a\n0  1"),
            Output(mime_type="text/html", data="<table>...</table>"),
            Output(mime_type="image/png", data=png),
        ],
    )
    text = tools.format_observation(result)
    assert "output:\n   a\n0  1" in text
    assert "text/html" not in text
    assert "output: image/png (308 B)" in text
    html_only = RunResult(
        run_id="r",
        status=Status.ok,
        exit_code=0,
        outputs=[Output(mime_type="text/html", data="<b>hi</b>")],
    )
    assert "output: text/html (9 B)" in tools.format_observation(html_only)


# --- tool calls against the real sandbox ---------------------------------------------------


def test_openai_chat_tool_call_runs_and_returns_stdout(executor: execbox.Executor) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "run_python", "arguments": json.dumps({"code": "print(6*7)"})},
    }
    assert tools.execute_tool_call(executor, call) == "status: ok\nstdout:\n42"


def test_anthropic_tool_use_block_gets_its_files_read_only_in_the_workspace(
    executor: execbox.Executor,
) -> None:
    block = {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "run_python",
        "input": {
            "code": "import os, pandas as pd\n"
            "print(os.getcwd(), pd.read_csv('data/t.csv').b.sum(), input())\n"
            "open('data/t.csv', 'w')\n",
            "files": {"data/t.csv": "a,b\n1,2\n3,4\n"},
            "stdin": "hello\n",
        },
    }
    text = tools.execute_tool_call(executor, block)
    assert "stdout:\n/workspace 6 hello" in text
    assert text.startswith("status: error, exit code 1")
    assert "error: PermissionError (line 3)" in text


def test_sdk_objects_and_plain_arguments_are_accepted(executor: execbox.Executor) -> None:
    class Function(BaseModel):
        name: str
        arguments: str

    class ToolCall(BaseModel):  # the shape of openai's ChatCompletionMessageToolCall
        id: str
        type: str
        function: Function

    call = ToolCall(
        id="c",
        type="function",
        function=Function(name="run_python", arguments='{"code": "print(1)"}'),
    )
    assert tools.execute_tool_call(executor, call).endswith("stdout:\n1")
    assert tools.execute_tool_call(executor, {"code": "print(2)"}).endswith("stdout:\n2")
    assert tools.execute_tool_call(executor, '{"code": "print(3)"}').endswith("stdout:\n3")


def test_an_exception_is_reported_with_its_type_and_the_users_line(
    executor: execbox.Executor,
) -> None:
    text = tools.execute_tool_call(executor, {"code": "x = 1\nprint('before')\ny = x / 0\n"})
    lines = text.splitlines()
    assert lines[0] == "status: error, exit code 1"
    assert lines[1] == "error: ZeroDivisionError (line 3): division by zero"
    assert "stdout:\nbefore" in text
    assert "y = x / 0" in text  # the traceback on stderr shows the failing line


def test_a_syntax_error_is_reported_with_line_and_column(executor: execbox.Executor) -> None:
    text = tools.execute_tool_call(executor, {"code": "a = 1\ndef f(:\n    pass\n"})
    assert "error: SyntaxError (line 2, column 7): invalid syntax" in text


def test_long_real_output_is_truncated_for_the_model_and_says_so(
    executor: execbox.Executor,
) -> None:
    code = "print('FIRST')\nfor i in range(5000):\n    print(f'line {i:05d}')\nprint('LAST')\n"
    text = tools.execute_tool_call(executor, {"code": code}, max_output_chars=1000)
    assert "FIRST" in text and "LAST" in text and "line 02500" not in text
    total = len("FIRST\n") + 5000 * len("line 00000\n") + len("LAST\n")
    cut = _cut_count(text)
    assert total - 1000 <= cut < total - 800
    assert f"{total:,} characters, {cut:,} cut from the middle" in text
    assert len(text) < 1400


def test_output_past_the_sandbox_cap_says_the_limit_and_how_to_avoid_it(
    executor: execbox.Executor,
) -> None:
    text = tools.execute_tool_call(
        executor, {"code": "print('y' * 50_000)"}, limits=Limits(output_bytes=4096)
    )
    assert text.startswith("status: output_limit")
    assert "the sandbox stopped collecting it at 4 KiB" in text
    assert "hint: The output passed the cap (4096 bytes per stream)" in text


def test_a_timeout_names_the_limit_and_the_argument_that_raises_it(
    executor: execbox.Executor,
) -> None:
    text = tools.execute_tool_call(executor, {"code": "while True:\n    pass\n", "timeout_s": 1})
    assert text.startswith("status: timeout")
    assert "wall-time limit (1 s)" in text and "timeout_s" in text


def test_artifacts_are_listed_with_type_and_size(executor: execbox.Executor) -> None:
    code = (
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.savefig('chart.png')\n"
        "open('out.csv', 'w').write('a\\n1\\n')\n"
    )
    text = tools.execute_tool_call(executor, {"code": code})
    assert text.startswith("status: ok")
    assert re.search(
        r"artifacts: (chart\.png \(image/png, [\d.]+ KiB\), out\.csv \(text/csv, "
        r"4 B\)|out\.csv \(text/csv, 4 B\), chart\.png \(image/png, [\d.]+ KiB\))",
        text,
    ), text


def test_bad_arguments_come_back_as_an_observation_and_nothing_runs(
    executor: execbox.Executor,
) -> None:
    before = executor.store.count()
    text = tools.execute_tool_call(
        executor, {"type": "tool_use", "name": "run_python", "input": {"cod": "print(1)"}}
    )
    assert text.startswith("status: invalid_arguments")
    assert "code: Field required" in text and "cod: Extra inputs are not permitted" in text
    broken = tools.execute_tool_call(executor, '{"code": "print(1)"')  # truncated JSON
    assert broken.startswith("status: invalid_arguments")
    assert executor.store.count() == before  # nothing ran, nothing was recorded


def test_a_bad_file_name_from_the_model_is_an_observation_not_an_exception(
    executor: execbox.Executor,
) -> None:
    text = tools.execute_tool_call(executor, {"code": "print(1)", "files": {"../up.txt": "x"}})
    assert text.startswith("status: invalid_arguments")
    assert "'../up.txt'" in text and "clean relative path" in text


def test_a_timeout_past_the_contracts_bound_is_an_observation_with_limits_or_a_session(
    executor: execbox.Executor,
) -> None:
    before = executor.store.count()
    too_long = {"code": "print(1)", "timeout_s": 10_000}
    with_limits = tools.execute_tool_call(executor, too_long, limits=execbox.Limits(pids=32))
    with executor.session() as session:
        in_session = tools.execute_tool_call(executor, too_long, session=session)
    for text in (with_limits, in_session):
        assert text.startswith("status: invalid_arguments") and "3600" in text
    assert executor.store.count() == before


def test_the_callers_limits_stay_when_the_model_sets_a_timeout(
    executor: execbox.Executor,
) -> None:
    outcome = tools.perform_tool_call(
        executor, {"code": "print(1)", "timeout_s": 7}, limits=execbox.Limits(memory_mib=300)
    )
    assert outcome.result is not None and outcome.result.ok
    assert (outcome.result.limits.timeout_s, outcome.result.limits.memory_mib) == (7, 300)
    over = tools.perform_tool_call(executor, {"code": "print(1)", "timeout_s": 600})
    assert over.result is not None and over.result.status is Status.policy_denied


def test_a_call_of_another_tool_is_a_usage_error(executor: execbox.Executor) -> None:
    with pytest.raises(execbox.UsageError, match="'web_search'"):
        tools.execute_tool_call(
            executor, {"type": "tool_use", "name": "web_search", "input": {"code": "print(1)"}}
        )


def test_stateful_schema_says_state_persists_and_drops_stdin() -> None:
    tool = tools.anthropic_tool(stateful=True)
    assert "persist" in tool["description"] and "clean state" not in tool["description"]
    assert "stdin" not in tool["input_schema"]["properties"]
    assert (
        "earlier calls are still there" in tool["input_schema"]["properties"]["code"]["description"]
    )
    assert "clean state" in tools.anthropic_tool()["description"]


def test_tool_calls_in_a_session_keep_variables_and_files_between_calls(
    executor: execbox.Executor,
) -> None:
    with executor.session() as session:
        first = tools.execute_tool_call(
            executor, {"code": "x = 21", "files": {"notes.txt": "hi"}}, session=session
        )
        assert first.startswith("status: ok")
        second = tools.execute_tool_call(
            executor, {"code": "print(open('notes.txt').read())\nx * 2"}, session=session
        )
    assert second.startswith("status: ok")
    assert "stdout:\nhi" in second and "output: 42" in second


# --- languages -----------------------------------------------------------------------------


@pytest.mark.parametrize("language", ["javascript", "bash"])
def test_each_language_gets_its_own_name_description_and_code_field_in_both_apis(
    language: str,
) -> None:
    openai = tools.openai_tool(language=language)["function"]
    anthropic = tools.anthropic_tool(language=language)
    assert openai["name"] == anthropic["name"] == f"run_{language}"
    assert openai["description"] == anthropic["description"]
    assert openai["parameters"] == anthropic["input_schema"]
    params = anthropic["input_schema"]
    assert set(params["properties"]) == set(tools.RunPython.model_fields)
    assert params["required"] == ["code"] and params["additionalProperties"] is False
    jsonschema.Draft202012Validator.check_schema(params)
    code = params["properties"]["code"]["description"]
    description = anthropic["description"]
    python = tools.anthropic_tool()
    assert "Python" not in code and "Python" not in description
    assert code != python["input_schema"]["properties"]["code"]["description"]
    assert ("Node.js" in description) == (language == "javascript")
    assert ("bash" in description) == (language == "bash")
    assert "numpy" not in description  # Python's packages are not this runtime's
    assert description.count("clean state") == 1
    # The wall-time argument is named as the tool spells it, with the profile's maximum.
    assert "(timeout_s, at most 60 s)" in description
    assert params["properties"]["timeout_s"]["anyOf"][0]["maximum"] == 60


def test_a_language_no_tool_runs_or_a_stateful_javascript_tool_is_a_usage_error() -> None:
    for make in (tools.openai_tool, tools.anthropic_tool, tools.parameters_schema):
        with pytest.raises(execbox.UsageError, match="unknown language 'ruby'.*javascript"):
            make(language="ruby")
        with pytest.raises(execbox.UsageError, match="sessions run Python only"):
            make(language="javascript", stateful=True)
    with pytest.raises(execbox.UsageError, match="unknown language 'js'"):
        tools.describe_language("js")


def test_a_javascript_tool_call_runs_in_node_through_the_sandbox(
    executor: execbox.Executor,
) -> None:
    code = (
        "const fs = require('fs');\n"
        "console.log(fs.readFileSync('n.txt', 'utf8').trim() * 2, process.version);\n"
        "null.x;\n"
    )
    call = {
        "type": "tool_use",
        "name": "run_javascript",
        "input": {"code": code, "files": {"n.txt": "21\n"}},
    }
    text = tools.execute_tool_call(executor, call, language="javascript")
    assert text.startswith("status: error, exit code 1"), text
    assert re.search(r"^42 v\d+\.", text, re.M), text
    assert "error: TypeError (line 3, column 6): Cannot read properties of null" in text
    # The same call through the Python tool is Python's syntax error: the language decides.
    as_python = tools.execute_tool_call(executor, {"code": code})
    assert "SyntaxError" in as_python


def test_a_bash_tool_call_runs_in_bash_through_the_sandbox(executor: execbox.Executor) -> None:
    call = {
        "type": "function",
        "function": {
            "name": "run_bash",
            "arguments": json.dumps(
                {
                    "code": "set -e\nwc -l < rows.txt\necho $BASH_VERSION | cut -c1\nfalse\n",
                    "files": {"rows.txt": "a\nb\nc\n"},
                }
            ),
        },
    }
    text = tools.execute_tool_call(executor, call, language="bash")
    assert text.startswith("status: error, exit code 1"), text
    assert re.search(r"stdout:\n3\n\d$", text, re.M), text
    assert "error: CommandFailed (line 4)" in text


def test_bad_javascript_arguments_come_back_as_an_observation_and_nothing_runs(
    executor: execbox.Executor,
) -> None:
    before = executor.store.count()
    text = tools.execute_tool_call(
        executor,
        {"type": "tool_use", "name": "run_javascript", "input": {"script": "1"}},
        language="javascript",
    )
    assert text.startswith("status: invalid_arguments")
    assert "code: Field required" in text and "script: Extra inputs are not permitted" in text
    assert executor.store.count() == before
    with pytest.raises(execbox.UsageError, match="'run_python', not 'run_javascript'"):
        tools.execute_tool_call(
            executor,
            {"type": "tool_use", "name": "run_python", "input": {"code": "1"}},
            language="javascript",
        )
    with pytest.raises(execbox.UsageError, match="unknown language"):
        tools.execute_tool_call(executor, {"code": "1"}, language="ruby")
