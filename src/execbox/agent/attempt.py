"""One attempt: the program the model generated, run as its mode asks under the policy and
the ask's budget, each run recorded; the runs, verdicts and feedback it produced."""

from __future__ import annotations

import time
from typing import Any

from ..contract import ErrorInfo, RunResult, Status
from ..executor import Executor
from . import answer as answer_mod
from . import verify
from .execute import check_policy, execute
from .meter import Breaker, Meter
from .models import AskSettings, AttemptLog, Claim, Program, RunOutput, Verdict
from .trace import Recorder


class Attempt:
    """What one attempt produced: the runs, the verdicts, and the feedback when it failed."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.code = program.code
        self.runs: list[RunResult] = []
        self.main: RunResult | None = None
        self.result: Any = verify.NO_RESULT
        self.verdicts: list[Verdict] = []
        self.feedback: str | None = None
        self.cell_outputs: list[RunOutput] = []
        self.failed_cell: str | None = None  # steps mode: error lines count within the cell
        self.answer: str | None = None  # the grounded, reviewed answer
        self.claims: list[Claim] = []
        self.ungrounded: str | None = None  # why no draft matched the evidence

    @property
    def passed(self) -> bool:
        return self.feedback is None and self.main is not None and self.answer is not None

    def outputs(self) -> list[RunOutput]:
        """The outputs the answer relies on: each cell's (steps mode), or the main run's."""
        assert self.main is not None
        stdout = self.cell_outputs[-1].stdout if self.cell_outputs else self.main.stdout
        return [
            *self.cell_outputs[:-1],
            RunOutput(run_id=self.main.run_id, stdout=stdout, result=self.result),
        ]


class Runner:
    """Runs an attempt's programs: the policy first, then the sandbox, each stage recorded."""

    def __init__(
        self,
        executor: Executor,
        files: dict[str, bytes],
        settings: AskSettings,
        trace: Recorder,
        meter: Meter,
    ) -> None:
        self.executor = executor
        self.files = files
        self.settings = settings
        self.trace = trace
        self.meter = meter

    def run(self, att: Attempt, number: int, mode: str, log: AttemptLog) -> RunResult | None:
        """The attempt's programs as its mode asks (tests first, cells, or one program); its
        main run, or None (with the feedback set) when it stopped before one."""
        program = att.program
        if mode == "tests_first":
            if not program.solution or not program.tests:
                att.verdicts.append(
                    Verdict(
                        check="tests",
                        passed=False,
                        attempt=number,
                        detail="no solution or tests given",
                    )
                )
                att.feedback = (
                    "tests_first mode: give the reference implementation in "
                    "`solution` and its tests in `tests`"
                )
                return None
            tests_code = program.solution + "\n\n" + program.tests
            run = self._run(number, "tests", tests_code, log, att)
            if run is None:
                return None
            if not run.ok:
                att.verdicts.append(
                    Verdict(
                        check="tests",
                        passed=False,
                        attempt=number,
                        run_id=run.run_id,
                        detail=verify.describe_failure(run),
                    )
                )
                att.feedback = (
                    "The tests failed, so the implementation (or a test) is wrong:\n"
                    + verify.describe_failure(run, tests_code)
                )
                return None
            att.verdicts.append(
                Verdict(
                    check="tests",
                    passed=True,
                    attempt=number,
                    run_id=run.run_id,
                    detail="example and property tests pass",
                )
            )
            att.code = program.solution + "\n\n" + program.code
        if mode == "steps":
            if not program.cells:
                att.feedback = "steps mode: give the program as `cells`"
                return None
            att.code = "\n\n".join(
                f"# --- cell {i} ---\n{cell}" for i, cell in enumerate(program.cells, 1)
            )
            run = self._run_cells(number, program.cells, log, att)
        else:
            run = self._run(number, "main", att.code, log, att)
        if run is None:
            return None
        return run

    def _policy(self, number: int, label: str, code: str, log: AttemptLog, att: Attempt) -> bool:
        started = time.time()
        pol = check_policy(
            self.executor, code, self.files, self.settings.limits, self.settings.profile
        )
        self.trace.stage(
            "policy",
            number,
            pol.decision,
            started,
            program=label,
            rule=pol.rule,
            message=pol.message,
            line=pol.line,
        )
        if not pol.allowed:
            log.status = "policy_denied"
            log.error = f"{pol.rule}: {pol.message}"
            where = (
                f" at line {pol.line}:\n{verify.snippet(code, pol.line)}"
                if pol.line is not None
                else ""
            )
            att.verdicts.append(
                Verdict(
                    check="policy",
                    passed=False,
                    attempt=number,
                    detail=f"{pol.rule}: {pol.message}",
                )
            )
            att.feedback = (
                f"The policy (profile {self.settings.profile!r}) refused the "
                f"{label} program, rule {pol.rule}: {pol.message}{where}\n"
                "Write code that complies with the policy."
            )
            return False
        return True

    def _run(
        self, number: int, label: str, code: str, log: AttemptLog, att: Attempt
    ) -> RunResult | None:
        if not self._policy(number, label, code, log, att):
            return None
        started = time.time()
        run = execute(
            self.executor,
            code,
            self.files,
            self.settings.limits,
            self.settings.profile,
            self.meter.budget,
        )
        self._ran(number, label, run, started, log, att)
        return run

    def _ran(
        self,
        number: int,
        label: str,
        run: RunResult,
        started: float,
        log: AttemptLog,
        att: Attempt,
    ) -> None:
        self.trace.stage(
            "execute",
            number,
            run.status.value,
            started,
            run_id=run.run_id,
            program=label,
            wall_ms=run.metrics.wall_ms,
            session_id=run.session_id,
            artifacts=[a.path for a in run.artifacts],
        )
        if run.run_id:  # a cell of a session that had already ended has none
            log.run_ids.append(run.run_id)
        log.status = run.status.value
        log.error = f"{run.error.type}: {run.error.message}" if run.error else None
        log.stdout_tail = answer_mod.tail(run.stdout, 2000)
        log.stderr_tail = answer_mod.tail(run.stderr, 2000)
        att.runs.append(run)
        self.meter.account(run)

    def _run_cells(
        self, number: int, cells: list[str], log: AttemptLog, att: Attempt
    ) -> RunResult | None:
        """Steps mode: the cells in order in a fresh session (each attempt starts clean, so a
        failed cell's half-done changes never leak into the repair). The result combines the
        cells: all their output, the latest version of every file, the last cell's run id."""
        for i, cell in enumerate(cells, 1):
            if not self._policy(number, f"cell {i}", cell, log, att):
                return None
        runs: list[RunResult] = []
        with self.executor.session(
            profile=self.settings.profile, limits=self.settings.limits, files=self.files
        ) as session:
            for i, cell in enumerate(cells, 1):
                started = time.time()
                run, spent = self._run_cell(session, cell)
                self._ran(number, f"cell {i}", run, started, log, att)
                if spent:
                    raise Breaker(
                        "exec_time",
                        f"execution-time budget of "
                        f"{self.settings.max_exec_s:g} s ran out during cell {i}",
                    )
                runs.append(run)
                if not run.ok:
                    att.failed_cell = cell
                    if run.error is not None:
                        run = run.model_copy(
                            update={
                                "error": run.error.model_copy(
                                    update={"message": f"in cell {i}: {run.error.message}"}
                                )
                            }
                        )
                    return run
        files = {a.path: a for r in runs for a in r.artifacts}
        att.cell_outputs = [RunOutput(run_id=r.run_id, stdout=r.stdout) for r in runs]
        return runs[-1].model_copy(
            update={"stdout": "".join(r.stdout for r in runs), "artifacts": list(files.values())}
        )

    def _run_cell(self, session: Any, cell: str) -> tuple[RunResult, bool]:
        """One cell under the ask's execution-time budget; True when the budget ran out."""
        from ..errors import SessionClosed

        reserved = self.meter.budget.reserve(session.limits)
        if isinstance(reserved, str):
            raise Breaker("exec_time", reserved)
        try:
            run: RunResult = session.run(cell, timeout_s=reserved.limits.timeout_s)
        except SessionClosed as exc:
            self.meter.budget.settle(reserved, 0.0, 0)
            return RunResult(
                run_id="",
                status=Status.sandbox_error,
                session_id=session.id,
                error=ErrorInfo(type="SessionClosed", message=str(exc)),
            ), False
        self.meter.budget.settle(
            reserved, run.metrics.wall_ms / 1000, sum(a.size for a in run.artifacts)
        )
        return run, reserved.time_clipped and run.status is Status.timeout
