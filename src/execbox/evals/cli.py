"""`execbox eval`: code-generation samples evaluated in the sandbox (HumanEval).

Only click is imported at module level: the CLI must start fast; the evaluation and the
executor load when the command runs.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click

from ..errors import ExecboxError, UsageError

EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


def _fail(message: str) -> NoReturn:
    click.echo(f"execbox: {message}", err=True)
    sys.exit(EXIT_USAGE)


@click.group("eval")
def eval_group() -> None:
    """Evaluate code-generation samples in the sandbox (HumanEval)."""


def _parse_ks(text: str) -> list[int]:
    try:
        ks = [int(part) for part in text.split(",")]
    except ValueError:
        ks = []
    if not ks or any(k < 1 for k in ks):
        raise UsageError(f"--k expects positive integers separated by commas, got {text!r}")
    return sorted(set(ks))


def _one_line(text: str, width: int = 100) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


@eval_group.command("humaneval")
@click.argument(
    "samples_path",
    metavar="[SAMPLES.jsonl]",
    required=False,
    type=click.Path(dir_okay=False, path_type=Path),
)
@click.option(
    "--canonical",
    is_flag=True,
    help="Evaluate the dataset's own solutions instead of a samples file.",
)
@click.option(
    "--k",
    "ks_text",
    default="1,10,100",
    show_default=True,
    metavar="K[,K...]",
    help="pass@k to report; a k is reported when every problem has at least k samples.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=3.0,
    show_default=True,
    help="Wall time limit per sample in seconds (as the reference).",
)
@click.option(
    "--concurrency", type=click.IntRange(min=1), help="Runs in flight at once (default: 4 per CPU)."
)
@click.option(
    "--profile",
    default="data",
    show_default=True,
    help="Policy profile of the runs (its maximums bound --timeout).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON summary on stdout (notes and progress go to stderr).",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Results JSONL (default: SAMPLES.jsonl_results.jsonl, as the reference "
    "harness names it; humaneval_canonical_results.jsonl with --canonical).",
)
def eval_humaneval(
    samples_path: Path | None,
    canonical: bool,
    ks_text: str,
    timeout: float,
    concurrency: int | None,
    profile: str,
    as_json: bool,
    out: Path | None,
) -> None:
    """Run HumanEval samples with their tests in the sandbox and report pass@k.

    SAMPLES.jsonl has the reference harness's format: one {"task_id", "completion"} object per
    line (several per task for pass@k, k > 1). Every run is uncached and recorded. Exit 0 when
    the evaluation completed (whatever the verdicts), 1 when some run hit a sandbox error or
    the policy refused a sample, 2 for usage errors, 130 when interrupted (Ctrl-C: the runs in
    flight are ended and the verdicts so far written to the results file).
    """
    import contextlib

    from ..executor import Executor
    from . import humaneval as he

    if canonical == (samples_path is not None):
        _fail("give a samples file or --canonical (exactly one)")
    try:
        ks = _parse_ks(ks_text)
        problems = he.load_problems()
        if samples_path is not None:
            samples = he.read_samples(samples_path, problems)
            target = out or he.results_path(samples_path)
        else:
            samples = he.canonical_samples(problems)
            target = out or Path("humaneval_canonical_results.jsonl")
        _check_writable(target)  # before the runs, not after them
        finished: dict[int, dict[str, Any]] = {}
        with contextlib.ExitStack() as stack:
            tick: Callable[[], None]
            if sys.stderr.isatty():  # --json stdout stays clean: progress goes to stderr
                bar = stack.enter_context(
                    click.progressbar(length=len(samples), label="humaneval", file=sys.stderr)
                )

                def tick() -> None:
                    bar.update(1)
            else:  # a bar in a log file is noise: a line now and then
                tick = _ProgressLines(len(samples), PROGRESS_EVERY_S).tick

            def on_result(index: int, row: dict[str, Any]) -> None:
                finished[index] = row
                tick()

            try:  # a Ctrl-C from here on, the executor's start included, exits 130
                executor = stack.enter_context(Executor(max_concurrency=concurrency))
                started = time.perf_counter()
                evaluation = he.evaluate(
                    executor,
                    samples,
                    problems,
                    timeout_s=timeout,
                    concurrency=concurrency,
                    profile=profile,
                    on_result=on_result,
                )
            except KeyboardInterrupt:
                stack.close()  # the executor is closed before the verdicts are written
                rows = [finished[i] for i in sorted(finished)]
                with contextlib.suppress(OSError):
                    he.write_results(target, rows)
                click.echo(
                    f"\nexecbox: interrupted after {len(rows)} of {len(samples)} "
                    f"samples; their verdicts are in {target}",
                    err=True,
                )
                sys.exit(EXIT_INTERRUPTED)
            wall_s = time.perf_counter() - started
    except ExecboxError as exc:
        _fail(str(exc))
    try:
        he.write_results(target, evaluation.rows)
    except OSError as exc:
        _fail(f"cannot write results to {target}: {exc}")

    groups = evaluation.by_problem()
    counts = evaluation.counts()
    scores = evaluation.pass_at_k(ks)
    fewest = min(n for n, _ in counts.values())
    not_reported = [k for k in ks if f"pass@{k}" not in scores]
    sandbox_errors = evaluation.sandbox_errors
    refused = evaluation.refused
    if as_json:
        click.echo(
            json.dumps(
                {
                    "dataset": he.DATASET,
                    "samples": len(evaluation.rows),
                    "problems": len(groups),
                    "passed": evaluation.passed,
                    "pass_at_k": scores,
                    "k_not_reported": not_reported,
                    "timeout_s": timeout,
                    "wall_s": round(wall_s, 3),
                    "sandbox_errors": sandbox_errors,
                    "refused": refused,
                    "results_path": str(target),
                    "per_problem": {
                        tid: {
                            "n": counts[tid][0],
                            "passed": counts[tid][1],
                            "results": [r["result"] for r in rows],
                        }
                        for tid, rows in groups.items()
                    },
                }
            )
        )
    else:
        width = max(len(tid) for tid in groups)
        for tid, rows in groups.items():
            n, c = counts[tid]
            first_failure = next((r["result"] for r in rows if not r["passed"]), he.PASSED)
            click.echo(f"{tid:<{width}}  {c:>3}/{n:<3} {_one_line(first_failure)}")
        click.echo(
            f"{len(groups)} of {len(problems)} problems, {len(evaluation.rows)} samples, "
            f"{evaluation.passed} passed; timeout {timeout:g} s; {wall_s:.1f} s "
            f"({len(evaluation.rows) / wall_s:.1f} samples/s)"
        )
        for name, value in scores.items():
            click.echo(f"{name} = {value:.4f}")
        if not_reported:
            click.echo(
                f"not reported: {', '.join(f'pass@{k}' for k in not_reported)} (needs "
                f"at least k samples of every problem; the fewest is {fewest})"
            )
        click.echo(f"results: {target}")
    if sandbox_errors:
        click.echo(
            f"execbox: {sandbox_errors} run(s) ended in sandbox_error (execbox's fault, "
            "not the completions'); their verdicts and pass@k are not reliable",
            err=True,
        )
    if refused:
        click.echo(
            f"execbox: the policy (profile {profile!r}) refused {refused} sample(s) "
            "(see their run records, e.g. code over max_code_bytes): they were not run, "
            "and count as failed in pass@k",
            err=True,
        )
    sys.exit(EXIT_RUN_FAILED if sandbox_errors or refused else EXIT_OK)


PROGRESS_EVERY_S = 10.0  # how often `eval` says how far it is when stderr is not a terminal


class _ProgressLines:
    """Progress for a log: one line on stderr at most every `every_s`, none for a short run."""

    def __init__(
        self, total: int, every_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.total, self.every_s, self.clock = total, every_s, clock
        self.done = 0
        self.started = self.last = clock()

    def tick(self) -> None:
        self.done += 1
        now = self.clock()
        if now - self.last >= self.every_s and self.done < self.total:
            self.last = now
            rate = self.done / max(now - self.started, 1e-9)
            click.echo(f"humaneval: {self.done}/{self.total} samples, {rate:.0f}/s", err=True)


def _check_writable(target: Path) -> None:
    """A usage error now if the results cannot be written to `target`."""
    parent = target.parent  # "." for a bare name
    if target.is_dir():
        _fail(f"cannot write results to {target}: it is a directory")
    if not parent.is_dir():
        _fail(f"cannot write results to {target}: no directory {parent}")
    if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        _fail(f"cannot write results to {target}: permission denied")
