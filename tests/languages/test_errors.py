"""Error shapes of JavaScript and bash runs read like Python's: type, message, the user's line
and column, a stack that starts at the user's code; exit codes."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from execbox import Executor, Status
from execbox.cli import language_of
from execbox.contract import RunRequest
from execbox.policy import check, load_profiles


def test_uncaught_type_error_names_the_users_line_and_column(executor: Executor) -> None:
    result = executor.run("const a = 1\nfunction f() { return null.x }\nf()", language="javascript")
    assert result.status is Status.error
    assert result.exit_code == 1
    error = result.error
    assert error is not None
    assert error.type == "TypeError"
    assert "reading 'x'" in error.message
    assert (error.line, error.column) == (2, 28)
    assert error.traceback is not None
    frames = [ln for ln in error.traceback.splitlines() if ln.strip().startswith("at ")]
    assert frames and all("main.js" in ln for ln in frames), error.traceback
    assert "[eval]" not in result.stderr and "node:internal" not in result.stderr


def test_user_error_class_is_the_type(executor: Executor) -> None:
    code = "class QuotaError extends Error {}\n\nthrow new QuotaError('over')"
    result = executor.run(code, language="javascript")
    assert result.error is not None
    assert (result.error.type, result.error.message, result.error.line) == ("QuotaError", "over", 3)


def test_syntax_error_has_line_and_column(executor: Executor) -> None:
    result = executor.run("let x = 1\nx y\n", language="javascript")
    assert result.status is Status.error
    assert result.error is not None
    assert result.error.type == "SyntaxError"
    assert (result.error.line, result.error.column) == (2, 3)


def test_unhandled_rejection_is_reported_with_its_line(executor: Executor) -> None:
    code = "async function go() {\n  throw new RangeError('late')\n}\ngo()"
    result = executor.run(code, language="javascript")
    assert result.status is Status.error
    assert result.error is not None
    assert (result.error.type, result.error.message, result.error.line) == ("RangeError", "late", 2)
    assert "Unhandled promise rejection" in (result.error.traceback or "")


@pytest.mark.parametrize(("code", "status"), [("process.exit(7)", 7), ("process.exitCode = 3", 3)])
def test_process_exit_code_is_the_exit_code(executor: Executor, code: str, status: int) -> None:
    result = executor.run(code, language="javascript")
    assert result.exit_code == status
    assert result.status is Status.error


def test_bash_exit_code_and_set_e_line(executor: Executor) -> None:
    result = executor.run("echo one\nexit 4", language="bash")
    assert (result.exit_code, result.stdout) == (4, "one\n")
    result = executor.run("set -e\ntrue\nfalse || true\nls /nonexistent\necho no", language="bash")
    assert result.status is Status.error
    assert "no" not in result.stdout
    assert result.error is not None
    assert (result.error.type, result.error.line) == ("CommandFailed", 4)
    assert "main.sh" not in result.error.message
    result = executor.run("nosuchcommand", language="bash")
    assert result.exit_code == 127
    assert "main.sh: line 1: nosuchcommand: command not found" in result.stderr


@pytest.mark.parametrize(
    ("code", "exit_code", "line"),
    [("set -eu; true", 0, None), ("set -u; exit 3", 3, None), ("set -eu\n\nfalse", 1, 3)],
)
def test_bash_set_u_leaves_the_exit_status_and_set_e_line_alone(
    executor: Executor, code: str, exit_code: int, line: int | None
) -> None:
    # The runner's traps read only variables they set: the code's nounset does not end them.
    result = executor.run(code, language="bash")
    assert (result.exit_code, result.stderr) == (exit_code, "")
    assert (result.error.line if result.error else None) == line


def test_bash_set_x_traces_the_code_and_not_the_runners_traps(executor: Executor) -> None:
    code = "set -x\nfalse || true\nset -e\necho on\nfalse\necho no"
    result = executor.run(code, language="bash")
    assert result.stderr == "+ false\n+ true\n+ set -e\n+ echo on\n+ false\n"
    assert result.error is not None
    assert (result.error.type, result.error.line) == ("CommandFailed", 5)


def test_bash_has_the_tools_agents_use(executor: Executor) -> None:
    code = "printf 'b\\na\\n' | sort | wc -l; echo '{\"k\": [1,2]}' | jq '.k | length';"
    code += "echo x,y | awk -F, '{print $2}' | sed s/y/z/ | grep z"
    result = executor.run(code, language="bash")
    assert result.status is Status.ok, result.stderr
    assert result.stdout.split() == ["2", "2", "z"]


def test_stdin_files_and_artifacts_work_in_javascript(executor: Executor) -> None:
    code = (
        "const fs = require('fs');"
        "const text = fs.readFileSync(0, 'utf8') + fs.readFileSync('in.txt', 'utf8');"
        "fs.writeFileSync('out.txt', text.toUpperCase())"
    )
    result = executor.run(code, language="javascript", stdin="ab", files={"in.txt": b"cd"})
    assert result.status is Status.ok, result.stderr
    assert [(a.path, a.data) for a in result.artifacts] == [("out.txt", b"ABCD")]


def test_language_is_validated_and_part_of_the_cache_key() -> None:
    from execbox.cache import cache_key

    with pytest.raises(ValueError, match="'python', 'javascript' or 'bash'"):
        RunRequest(code="1", language="ruby")
    keys = {
        cache_key(RunRequest(code="echo 1", language=lang), "img", None, b"k" * 32, ())
        for lang in ("python", "javascript", "bash")
    }
    assert len(keys) == 3


@pytest.mark.parametrize(
    ("name", "language"),
    [
        ("a.js", "javascript"),
        ("a.mjs", "javascript"),
        ("x/b.sh", "bash"),
        ("c.py", "python"),
        ("-", "python"),
        ("noext", "python"),
    ],
)
def test_cli_infers_the_language_from_the_extension(name: str, language: str) -> None:
    assert language_of(name) == language


def test_cli_runs_a_js_file_by_its_extension(tmp_path: object, executor: Executor) -> None:
    from pathlib import Path

    from execbox.cli import main

    path = Path(str(tmp_path)) / "hello.js"
    path.write_text("console.log(typeof require, 6 * 7)")
    out = CliRunner().invoke(main, ["run", "--json", str(path)])
    assert '"stdout":"function 42\\n"' in out.output, out.output


def test_bash_is_allowed_only_by_profiles_that_list_it() -> None:
    profiles = load_profiles()
    allowed = check(RunRequest(code="ls", language="bash", profile="data"), profiles)
    assert allowed.decision == "allow"
    denied = check(RunRequest(code="ls", language="bash", profile="minimal"), profiles)
    assert (denied.decision, denied.rule) == ("deny", "language.not_allowed")
    denied = check(RunRequest(code="ls", language="bash", profile="extended"), profiles)
    assert denied.decision != "deny"


@pytest.mark.parametrize(
    ("code", "rule", "line"),
    [
        ("const x = 1\nconst cp = require('child_process')", "js.module_denied", 2),
        ("import { Worker } from 'node:worker_threads'", "js.module_denied", 1),
        ("const s = require(`net`)", "js.module_denied", 1),
        ("async function f() {\n  await import('http')\n}", "js.module_denied", 2),
        ("const r = require\nr('child_process')", "js.dynamic", 1),
        ("require('child' + '_process')", "js.dynamic", 1),
        ("process.binding('spawn_sync')", "js.dynamic", 1),
        ("module.require('child_process')", "js.dynamic", 1),
        ("globalThis.process.binding('spawn_sync')", "js.dynamic", 1),
        ("const f = (() => {}).constructor\nf('return process')()", "js.dynamic", 1),
        ("eval(\"require('child_process')\")", "js.dynamic", 1),
        ("Reflect.get(process, 'binding')", "js.dynamic", 1),
        # Plain names that reach process or the Function constructor without a member access.
        ("const {getBuiltinModule: g} = globalThis.process\ng('child_process')", "js.dynamic", 1),
        ("const {constructor: F} = () => 0\nF('return process')()", "js.dynamic", 1),
        ("const {'binding': b} = require('fs')", "js.dynamic", 1),
        ("with (Math) { max(1, 2) }", "js.dynamic", 1),
        ("this['req' + 'uire']('child_process')", "js.dynamic", 1),
        ("const g = () => this\ng()['req' + 'uire']", "js.dynamic", 1),
        (
            "this.x = 1\nfunction f() { return this }\nclass A { y = this; m() { return this } }",
            None,
            None,
        ),
        ("const p = globalThis.process\np.env", "js.dynamic", 1),
        ("console.log(globalThis.process.env.HOME, Math.max(1, 2))", None, None),
        ("const { readFileSync } = require('fs')\nconst { a, ...rest } = { a: 1 }", None, None),
        # The process module is the process global as a value: its binding spawns programs.
        ("const { binding } = require('process')\nbinding('spawn_sync')", "js.module_denied", 1),
        ("import P from 'node:process'\nReflect.get(P, 'bind' + 'ing')", "js.module_denied", 1),
        ("console.log(process.env.HOME, process.argv)", None, None),
        ("require('fs').writeFileSync('a.js', 'x')\nrequire('./a.js')", "js.dynamic", 2),
        ("arguments[1]('child_process')", "js.dynamic", 1),
        ("import 'data:text/javascript,import cp from \"child_process\"'", "js.dynamic", 1),
        ("require('evil')", "js.dynamic", 1),
        ("require('#x')", "js.dynamic", 1),
        ("new.target\nrequire('child_process')", "js.module_denied", 2),
        ("require('child_process')\nvar x = " + "+".join(["1"] * 8000), "js.syntax", None),
        ("let x = 1\nx y", "js.syntax", 2),
        ("// require('child_process')\nconst s = \"require('net')\"", None, None),
        ("const fs = require('fs')\nconsole.log(fs.readdirSync('.'))", None, None),
    ],
)
def test_minimal_checks_javascript_modules_with_a_parser(
    code: str, rule: str | None, line: int | None
) -> None:
    verdict = check(
        RunRequest(code=code, language="javascript", profile="minimal"), load_profiles()
    )
    assert verdict.rule == rule, verdict.message
    assert verdict.decision == ("deny" if rule else "allow")
    if rule != "js.syntax" or line is not None:
        assert verdict.line == line


@pytest.mark.parametrize("name", ["NODE_OPTIONS", "NODE_PATH", "LD_PRELOAD", "LD_LIBRARY_PATH"])
def test_minimal_refuses_env_that_steers_node_before_the_code(name: str) -> None:
    request = RunRequest(code="1", language="javascript", profile="minimal", env={name: "x"})
    verdict = check(request, load_profiles())
    assert (verdict.decision, verdict.rule) == ("deny", "js.env")


def test_bash_code_may_start_with_a_dash(executor: Executor) -> None:
    result = executor.run("-x\necho hi", language="bash")
    assert result.stdout == "hi\n"
    assert "main.sh: line 1: -x: command not found" in result.stderr


def test_dynamic_import_works_in_commonjs_code(executor: Executor) -> None:
    code = "import('node:os').then((os) => console.log(typeof os.platform()))\n"
    code += "import('./lib.mjs').then((m) => console.log(m.x))"
    result = executor.run(code, language="javascript", files={"lib.mjs": b"export const x = 42\n"})
    assert result.status is Status.ok, (result.error, result.stderr)
    assert sorted(result.stdout.split()) == ["42", "string"]
    assert "ExperimentalWarning" not in result.stderr


def test_es_module_code_runs_as_a_module_and_errors_name_its_line(executor: Executor) -> None:
    code = (
        "import { readdirSync } from 'node:fs'\n"
        "const n = await Promise.resolve(readdirSync('/workspace').length)\n"
        "console.log('entries', n)\n"
        "throw new RangeError('esm')\n"
    )
    result = executor.run(code, language="javascript")
    assert result.stdout == "entries 0\n"
    assert result.error is not None
    assert (result.error.type, result.error.message, result.error.line) == ("RangeError", "esm", 4)


@pytest.mark.parametrize(
    ("code", "line", "column"),
    [
        ("import fs from 'node:fs'\nconst a = 1\nconst b = a +* 2\n", 3, 14),
        ("#!/usr/bin/env node\nexport const x = 1\n\n  let y = (;\n", 4, 12),
        ("const v = await Promise.resolve(1)\nlet v = 2\n", 2, 5),
    ],
)
def test_es_module_syntax_error_names_its_line_and_column(
    executor: Executor, code: str, line: int, column: int
) -> None:
    # V8 keeps a module's syntax error position where no JavaScript reads it: the runner
    # finds it again with the parser Node bundles, as a CommonJS syntax error gives it.
    result = executor.run(code, language="javascript")
    assert result.status is Status.error
    error = result.error
    assert error is not None
    assert error.type == "SyntaxError"
    assert (error.line, error.column) == (line, column), error.traceback
    assert error.traceback is not None
    assert error.traceback.startswith(f"file:///workspace/main.mjs:{line}\n")
    assert "node:internal" not in result.stderr


def test_syntax_error_in_an_imported_module_is_not_put_on_the_users_lines(
    executor: Executor,
) -> None:
    code = "import { x } from './lib.mjs'\nconsole.log(x)\n"
    result = executor.run(code, language="javascript", files={"lib.mjs": b"export const x = ;\n"})
    assert result.error is not None
    assert result.error.type == "SyntaxError"
    assert (result.error.line, result.error.column) == (None, None)


def test_the_module_error_path_never_calls_what_the_code_planted(executor: Executor) -> None:
    # The code ran, then imported a broken module: the runner's parser path used to call the
    # vm.compileFunction the code had put in place.
    code = (
        "import vm from 'vm'\n"
        "vm.compileFunction = () => () => console.log('PLANTED')\n"
        "await import('./lib.mjs')\n"
    )
    result = executor.run(code, language="javascript", files={"lib.mjs": b"let x = ;\n"})
    assert result.error is not None
    assert (result.error.type, result.stdout) == ("SyntaxError", "")


@pytest.mark.parametrize("code", ["echo a\0b", "echo big\n" + "#" * 200_000])
def test_bash_code_no_argument_can_carry_still_runs_as_a_script(
    executor: Executor, code: str
) -> None:
    # A NUL ends an exec argument and the kernel refuses one past 128 KiB: such code goes in a
    # file; it is the code's result either way, never a sandbox error.
    result = executor.run(code, language="bash")
    assert result.status in (Status.ok, Status.error), result.error
    assert result.status is Status.ok or result.exit_code == 126


@pytest.mark.serial
@pytest.mark.parametrize(
    ("code", "stdout", "exit_code"),
    [
        ("(exit 3); x=$(exit 4); bash -c 'exit 6'; echo after; exit 5", "after\n", 5),
        ("trap 'echo mine' EXIT; echo body; exit 2", "body\nmine\n", 2),
        ("echo before; exec /usr/bin/sh -c 'echo replaced; exit 9'", "before\nreplaced\n", 9),
        ("sleep 30 & echo started", "started\n", 0),
    ],
)
def test_bash_ends_with_its_own_exit_status_whatever_its_children_do(
    executor: Executor, code: str, stdout: str, exit_code: int
) -> None:
    # The shell's own exit report ends the run at once; a subshell's exit, a script's own EXIT
    # trap or an exec must neither end it early nor lose its status.
    result = executor.run(code, language="bash", limits={"timeout_s": 5})
    assert (result.stdout, result.exit_code) == (stdout, exit_code), result.stderr
    assert result.metrics.wall_ms < 3000


def test_es_module_imports_resolve_in_the_workspace_and_nothing_is_written(
    executor: Executor,
) -> None:
    code = "import { x } from './lib.mjs'\nconsole.log(x, import.meta.url)\n"
    result = executor.run(code, language="javascript", files={"lib.mjs": b"export const x = 42\n"})
    assert result.status is Status.ok, (result.error, result.stderr)
    assert result.stdout == "42 file:///workspace/main.mjs\n"
    assert result.artifacts == []
