"""`execbox run`, `doctor`, `schema` and `image`, as a user calls them: a real subprocess.
The `runs` commands that only read the records run in process (`cli_here`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from execbox import Executor
from execbox.cli import main

EXECBOX = [sys.executable, "-m", "execbox.cli"]


def cli(
    *args: str, stdin: bytes = b"", env: dict[str, str] | None = None, **kw: object
) -> subprocess.CompletedProcess[bytes]:
    done: subprocess.CompletedProcess[bytes] = subprocess.run(
        [*EXECBOX, *args], input=stdin, capture_output=True, timeout=120, env=env, **kw
    )  # type: ignore[call-overload]
    return done


def cli_here(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """The same command in this process: no interpreter start where the process is not the
    claim. An uncaught exception is exit code 1, as in a subprocess."""
    result = CliRunner().invoke(main, list(args), env=env)
    return subprocess.CompletedProcess(
        [*EXECBOX, *args], result.exit_code, result.stdout_bytes, result.stderr_bytes
    )


@pytest.fixture(scope="module")
def sandbox(executor: Executor) -> Executor:
    return executor  # skips the module loudly when the host cannot sandbox


def test_run_json_prints_exactly_one_result_and_exits_0(sandbox: Executor, tmp_path: Path) -> None:
    prog = tmp_path / "p.py"
    prog.write_text("print('hello')\n")
    proc = cli("run", str(prog), "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # one object and nothing else
    assert result["status"] == "ok" and result["stdout"] == "hello\n"


def test_failing_program_exits_1_with_status(sandbox: Executor) -> None:
    proc = cli("run", "-", "--json", stdin=b"raise SystemExit(4)\n")
    assert proc.returncode == 1
    result = json.loads(proc.stdout)
    assert result["status"] == "error" and result["exit_code"] == 4


def test_limit_status_exits_1_and_names_the_option(sandbox: Executor) -> None:
    proc = cli("run", "-", "--timeout", "0.5", stdin=b"while True: pass\n")
    assert proc.returncode == 1
    assert b"timeout" in proc.stderr and b"--timeout" in proc.stderr


def test_inputs_stdin_env_and_artifacts_reach_the_run(sandbox: Executor, tmp_path: Path) -> None:
    data = tmp_path / "numbers.csv"
    data.write_text("a\n1\n2\n")
    feed = tmp_path / "feed.txt"
    feed.write_text("from-stdin")
    prog = tmp_path / "p.py"
    prog.write_text(
        "import os, sys\n"
        "print(open('in.csv').read().split(), sys.stdin.read(), os.environ['GREETING'])\n"
        "open('out/result.txt', 'w').write('done') if os.makedirs('out') is None else None\n"
    )
    out_dir = tmp_path / "arts"
    proc = cli(
        "run",
        str(prog),
        "--input",
        f"{data}:in.csv",
        "--stdin",
        str(feed),
        "--env",
        "GREETING=hi",
        "--artifacts-dir",
        str(out_dir),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"['a', '1', '2'] from-stdin hi\n"
    assert (out_dir / "out" / "result.txt").read_text() == "done"
    assert b"artifact out/result.txt" in proc.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["run", "/nonexistent/prog.py"], b"cannot read"),
        (["run", "-", "--env", "NOEQUALS"], b"NAME=VALUE"),
        (["run", "-", "--timeout", "0"], b"timeout_s"),
        (["run", "-", "--input", "/nonexistent/data.csv"], b"cannot read input file"),
    ],
)
def test_usage_errors_exit_2_with_a_clear_message(
    sandbox: Executor, args: list[str], message: bytes
) -> None:
    proc = cli(*args, stdin=b"print(1)\n")
    assert proc.returncode == 2
    assert message in proc.stderr
    assert b"Traceback" not in proc.stderr


def test_undecodable_file_is_one_syntax_error_result_and_a_record(
    sandbox: Executor, tmp_path: Path
) -> None:
    prog = tmp_path / "p.py"
    prog.write_bytes("x = 'é'\nprint(x)\ny = '".encode() + b"\xff'\n")
    proc = cli("run", str(prog), "--json", "--no-cache")
    assert proc.returncode == 1, proc.stderr
    result = json.loads(proc.stdout)  # exactly one JSON result, as for any other code
    assert result["status"] == "error" and result["exit_code"] == 1
    error = result["error"]
    assert (error["type"], error["line"], error["column"]) == ("SyntaxError", 3, 6)
    assert "'\\xff'" in error["message"] and "line 3" in result["stderr"]
    assert result["stdout"] == ""  # CPython runs nothing of a file it cannot decode: nor do we
    shown = json.loads(cli_here("runs", "show", result["run_id"]).stdout)
    assert shown["status"] == "error" and shown["policy"]["rule"] == "code.encoding"
    assert shown["code"].endswith("y = '\\xff'\n")  # the bad byte, shown as an escape
    replay = cli_here("runs", "replay", result["run_id"])
    assert replay.returncode == 2 and b"run the file again" in replay.stderr


def test_undecodable_stdin_prints_cpythons_syntax_error(sandbox: Executor) -> None:
    proc = cli("run", "-", stdin=b"print('never')\n\n\xc3(\n")
    assert proc.returncode == 1
    assert proc.stdout == b""
    assert b'File "main.py", line 3' in proc.stderr
    assert b"SyntaxError: Non-UTF-8 code starting with '\\xc3'" in proc.stderr
    as_json = cli("run", "-", "--json", stdin=b"print('never')\n\n\xc3(\n")
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["error"]["line"] == 3


def test_coding_cookie_and_bom_are_read_as_cpython_reads_them(
    sandbox: Executor, tmp_path: Path
) -> None:
    latin = tmp_path / "latin.py"
    latin.write_bytes(b"# -*- coding: latin-1 -*-\nprint('caf\xe9')\n")
    proc = cli("run", str(latin))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "café\n".encode()
    proc = cli("run", "-", stdin=b"\xef\xbb\xbfprint('after a BOM')\n")
    assert proc.returncode == 0, proc.stderr  # not "invalid non-printable character U+FEFF"
    assert proc.stdout == b"after a BOM\n"


def test_missing_image_fails_clearly_and_never_runs_unsandboxed(tmp_path: Path) -> None:
    env = dict(os.environ, EXECBOX_HOME=str(tmp_path / "empty"))
    canary = tmp_path / "ran"
    proc = cli("run", "-", stdin=f"open({str(canary)!r}, 'w')\n".encode(), env=env)
    assert proc.returncode == 2
    assert b"execbox image build" in proc.stderr
    assert not canary.exists()


def test_doctor_reports_every_check_ok(sandbox: Executor) -> None:
    proc = cli("doctor")
    assert proc.returncode == 0, proc.stdout
    for check in (b"namespaces", b"cgroups", b"seccomp", b"runtime image", b"smoke run"):
        line = next(ln for ln in proc.stdout.splitlines() if check in ln)
        assert line.startswith(b"ok"), line


def test_schema_command_prints_the_contract() -> None:
    proc = cli("schema")
    assert proc.returncode == 0
    assert "RunResult" in json.loads(proc.stdout)


def test_cached_run_still_prints_its_output(sandbox: Executor) -> None:
    code = b"print('from the cache or not')\n"
    first = cli("run", "-", stdin=code)
    second = cli("run", "-", stdin=code)
    assert first.stdout == second.stdout == b"from the cache or not\n"
    assert b"(cached)" in second.stderr and b"(cached)" not in first.stderr


def test_runs_list_show_replay_and_approve(sandbox: Executor, tmp_path: Path) -> None:
    import execbox

    profiles = tmp_path / "profiles.toml"
    text = (Path(execbox.__file__).parent / "profiles.toml").read_text()
    text += (
        '\n[profiles.held]\ndescription = "holds shutil.rmtree"\ncalls_approval = ["shutil.rmtree"]\n'
        "max_code_bytes = 65536\nmax_input_bytes = 1048576\nmax_input_files = 4\n"
        "max_csv_rows = 1000\n[profiles.held.limits]\n[profiles.held.max_limits]\n"
    )
    profiles.write_text(text)
    env = dict(os.environ, EXECBOX_PROFILES=str(profiles))
    ran = cli("run", "-", "--json", "--no-cache", stdin=b"print('replay me')\n", env=env)
    run_id = json.loads(ran.stdout)["run_id"]
    listed = cli_here("runs", "list", "--json", env=env)
    assert run_id in listed.stdout.decode()
    shown = json.loads(cli_here("runs", "show", run_id, env=env).stdout)
    assert shown["code"] == "print('replay me')\n" and shown["status"] == "ok"
    replay = cli("runs", "replay", run_id, env=env)
    assert replay.returncode == 0 and b"matches" in replay.stdout
    held = cli(
        "run",
        "-",
        "--json",
        "--profile",
        "held",
        stdin=b"import shutil\nshutil.rmtree('x', ignore_errors=True)\nprint('released')\n",
        env=env,
    )
    held_result = json.loads(held.stdout)
    assert held.returncode == 1 and held_result["status"] == "needs_approval"
    approved = cli("runs", "approve", held_result["run_id"], "--by", "ops", "--json", env=env)
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["stdout"] == "released\n"
    again = cli_here("runs", "approve", held_result["run_id"], env=env)
    assert again.returncode == 2 and b"already released" in again.stderr
    missing = cli_here("runs", "show", "no-such-run", env=env)
    assert missing.returncode == 2 and b"no run" in missing.stderr
