"""The ask loop: Plan → (Generate → Policy → Execute → Verify ⇄ Answer)* → Answer, each
stage recorded.

A failed run, a policy refusal or a failed verification goes back to Generate as structured
feedback, at most `max_repairs` times. Once the deterministic checks pass, the answer is drafted
and grounded (`ground`: every value it states must come from the outputs); the model's review
then judges the output and the drafted answer in one call, so an honest ask costs no extra
model call. An answer the evidence does not support goes back to the answer stage with the
discrepancy named, at most `ANSWER_DRAFTS` drafts; then the ask fails, carrying the verified
result, and is never `answered` with the contradicted text. A plan without code is accepted
only for questions that need none (no input files, no computed value). Circuit breakers on
total execution time, tokens and artifacts end the ask with a clean failure that carries every
attempt's logs.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ..budget import Budget
from ..contract import ErrorInfo, RunResult, Status
from ..executor import Executor
from . import answer as answer_mod
from . import generate as generate_mod
from . import ground, verify
from . import plan as plan_mod
from .evidence import Context, Evidence
from .execute import check_policy, effective_limits, execute
from .llm import LLM, ModelCall, ModelFailure, resolve_model
from .models import (
    Answer,
    AskSettings,
    AttemptLog,
    Claim,
    Failure,
    Plan,
    Program,
    RunOutput,
    TokenUsage,
    Verdict,
)
from .trace import Recorder, TraceStore, new_ask_id

if TYPE_CHECKING:
    from pydantic_ai.models import Model

Schema = Mapping[str, Any] | type[BaseModel]
ANSWER_DRAFTS = 3  # the first draft and two redrafts with the discrepancy named


class _Breaker(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class _Attempt:
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


def read_files(
    files: Mapping[str, bytes | str | os.PathLike[str]] | list[str | os.PathLike[str]] | None,
) -> dict[str, bytes]:
    """Inputs as workspace name -> bytes; paths are read and named by their base name."""
    if not files:
        return {}
    items = files.items() if isinstance(files, Mapping) else ((Path(p).name, p) for p in files)
    out: dict[str, bytes] = {}
    for name, source in items:
        out[name] = source if isinstance(source, bytes) else Path(source).read_bytes()
    return out


def ask(
    question: str,
    *,
    executor: Executor,
    model: Model | str | None = None,
    files: Mapping[str, bytes | str | os.PathLike[str]]
    | list[str | os.PathLike[str]]
    | None = None,
    expected_schema: Schema | None = None,
    settings: AskSettings | None = None,
    base_url: str | None = None,
) -> Answer:
    """Answer `question` by running code in the sandbox, with evidence.

    `model`: a pydantic-ai Model or a model string (default: EXECBOX_MODEL or the config file).
    `files`: inputs placed read-only in the workspace. `expected_schema`: a JSON schema or a
    pydantic model the printed result must match. Never raises for what the model or its code
    did: a failure is an Answer with status 'failed' and the logs. Raises UsageError when no
    model is configured."""
    resolved = resolve_model(model, base_url=base_url)
    return _Ask(
        question, executor, resolved, read_files(files), expected_schema, settings or AskSettings()
    ).run()


class _Ask:
    def __init__(
        self,
        question: str,
        executor: Executor,
        model: Model,
        files: dict[str, bytes],
        schema: Schema | None,
        settings: AskSettings,
    ) -> None:
        self.question = question
        self.executor = executor
        self.files = files
        self.schema = schema
        self.schema_json = (
            schema.model_json_schema()
            if isinstance(schema, type)
            else dict(schema)
            if schema is not None
            else None
        )
        self.settings = settings
        self.usage = TokenUsage()
        self.budget = Budget(exec_s=settings.max_exec_s, artifact_bytes=settings.max_artifact_bytes)
        self.artifact_files = 0
        self.logs: list[AttemptLog] = []
        self.run_ids: list[str] = []
        self.ask_id = new_ask_id()
        self.llm = LLM(model, on_call=self._on_call)
        self.store = TraceStore(executor.store.engine)
        self.trace = Recorder(self.store, self.ask_id)
        self.plan: Plan | None = None
        # Checked before the ask starts: limits the policy refuses are the caller's mistake.
        self.limits = effective_limits(executor, settings.limits, settings.profile)

    # -- accounting and breakers ---------------------------------------------------------------

    def _on_call(self, call: ModelCall) -> None:
        self.usage.input_tokens += call.input_tokens
        self.usage.output_tokens += call.output_tokens
        self.usage.requests += call.requests
        self.trace.call(
            call.stage,
            call.model,
            call.input_tokens,
            call.output_tokens,
            call.requests,
            call.duration_ms,
            call.ok,
            call.error,
        )

    def _check_tokens(self) -> None:
        if self.usage.total_tokens > self.settings.max_tokens:
            raise _Breaker(
                "tokens",
                f"token budget of {self.settings.max_tokens} spent "
                f"({self.usage.total_tokens} tokens used); raise max_tokens",
            )

    def _stage_call(self, stage: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self._check_tokens()
        started = time.time()
        try:
            out = fn(*args, **kwargs)
        except ModelFailure as exc:
            self.trace.stage(stage, len(self.logs), "model_error", started, error=str(exc))
            raise
        self._check_tokens()
        return out, started

    def _account(self, run: RunResult) -> None:
        if run.run_id:
            self.run_ids.append(run.run_id)
        if run.status is Status.budget_exceeded:
            message = run.error.message if run.error else "execution-time budget spent"
            raise _Breaker("exec_time", f"{message} (max_exec_s {self.settings.max_exec_s:g})")
        self.artifact_files += len(run.artifacts)
        if self.artifact_files > self.settings.max_artifact_files:
            raise _Breaker(
                "artifacts",
                f"{self.artifact_files} artifact files written, more "
                f"than max_artifact_files {self.settings.max_artifact_files}",
            )
        spent = self.budget.remaining_artifact_bytes == 0
        if run.artifacts_truncated and spent:
            raise _Breaker(
                "artifacts",
                f"artifact budget of {self.settings.max_artifact_bytes} "
                "bytes spent; raise max_artifact_bytes",
            )

    # -- the stages ----------------------------------------------------------------------------

    def run(self) -> Answer:
        self.store.start(self.ask_id, self.question, self.llm.name)
        try:
            self.plan = self._plan()
            if not self.plan.needs_code:
                reason = plan_mod.code_required(self.question, self.files)
                if reason is not None:
                    self.plan = self._plan(sent_back=reason)
                    if not self.plan.needs_code:
                        self.plan = self.plan.model_copy(update={"answer": None})
                        return self._fail(
                            "no_evidence",
                            f"the plan answered without running "
                            f"code twice, but {reason}; an answer without a run "
                            "is not accepted",
                        )
            if not self.plan.needs_code:
                return self._finish(
                    Answer(
                        ask_id=self.ask_id,
                        status="answered",
                        question=self.question,
                        answer=self.plan.answer or "",
                        plan=self.plan,
                        evidence="none",
                    )
                )
            mode = self.plan.mode if self.settings.mode == "auto" else self.settings.mode
            last: _Attempt | None = None
            for number in range(1, self.settings.max_repairs + 2):
                last = self._attempt(number, mode, self.limits, last)
                if last.passed:
                    return self._answer(last)
                if last.ungrounded is not None:  # the program was right; its answer was not
                    return self._fail_ungrounded(last)
            assert last is not None
            return self._fail(
                "repairs_exhausted",
                f"no verified answer after {len(self.logs)} attempts "
                f"({self.settings.max_repairs} repairs); last problem: "
                f"{_first_problem(last.feedback or 'unknown')}",
            )
        except _Breaker as trip:
            return self._fail(trip.kind, trip.message)
        except ModelFailure as exc:
            return self._fail("model_error", f"the model call failed: {exc}")
        except BaseException as exc:  # a host or caller error: the trace says so, then re-raise
            self.store.finish(
                self.ask_id,
                "error",
                "",
                self.run_ids,
                self.usage.input_tokens,
                self.usage.output_tokens,
            )
            self.trace.stage(
                "answer", len(self.logs), "error", time.time(), error=f"{type(exc).__name__}: {exc}"
            )
            raise

    def _plan(self, sent_back: str | None = None) -> Plan:
        plan, started = self._stage_call(
            "plan",
            plan_mod.make_plan,
            self.llm,
            self.question,
            self.files,
            self.schema_json,
            sent_back=sent_back,
        )
        assert isinstance(plan, Plan)
        self.trace.stage(
            "plan",
            0,
            "code" if plan.needs_code else "text",
            started,
            sent_back=sent_back,
            **plan.model_dump(mode="json"),
        )
        return plan

    def _attempt(self, number: int, mode: str, limits: Any, previous: _Attempt | None) -> _Attempt:
        assert self.plan is not None
        program, started = self._stage_call(
            "generate",
            generate_mod.generate,
            self.llm,
            self.question,
            self.plan,
            self.files,
            limits,
            mode=mode,
            schema=self.schema_json,
            previous=previous.program if previous else None,
            feedback=previous.feedback if previous else None,
        )
        self.trace.stage(
            "generate",
            number,
            "repair" if previous else "first",
            started,
            code=program.code,
            solution=program.solution,
            tests=program.tests,
            cells=program.cells,
            cross_check=program.cross_check,
            notes=program.notes,
        )
        att = _Attempt(program)
        log = AttemptLog(attempt=number, status="not_run")
        self.logs.append(log)
        try:
            self._run_and_verify(att, number, mode, log)
        finally:
            log.feedback = att.feedback
        return att

    def _run_and_verify(self, att: _Attempt, number: int, mode: str, log: AttemptLog) -> None:
        assert self.plan is not None
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
                return
            tests_code = program.solution + "\n\n" + program.tests
            run = self._run(number, "tests", tests_code, log, att)
            if run is None:
                return
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
                return
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
                return
            att.code = "\n\n".join(
                f"# --- cell {i} ---\n{cell}" for i, cell in enumerate(program.cells, 1)
            )
            run = self._run_cells(number, program.cells, log, att)
        else:
            run = self._run(number, "main", att.code, log, att)
        if run is None:
            return
        att.main = run
        self._verify(att, number, run)

    def _policy(self, number: int, label: str, code: str, log: AttemptLog, att: _Attempt) -> bool:
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
        self, number: int, label: str, code: str, log: AttemptLog, att: _Attempt
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
            self.budget,
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
        att: _Attempt,
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
        self._account(run)

    def _run_cells(
        self, number: int, cells: list[str], log: AttemptLog, att: _Attempt
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
                    raise _Breaker(
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

        reserved = self.budget.reserve(session.limits)
        if isinstance(reserved, str):
            raise _Breaker("exec_time", reserved)
        try:
            run: RunResult = session.run(cell, timeout_s=reserved.limits.timeout_s)
        except SessionClosed as exc:
            self.budget.settle(reserved, 0.0, 0)
            return RunResult(
                run_id="",
                status=Status.sandbox_error,
                session_id=session.id,
                error=ErrorInfo(type="SessionClosed", message=str(exc)),
            ), False
        self.budget.settle(reserved, run.metrics.wall_ms / 1000, sum(a.size for a in run.artifacts))
        return run, reserved.time_clipped and run.status is Status.timeout

    def _verify(self, att: _Attempt, number: int, run: RunResult) -> None:
        assert self.plan is not None
        started = time.time()
        verdicts = att.verdicts
        verdicts.append(verify.check_run(run, number))
        if not run.ok:
            att.feedback = "The program failed:\n" + verify.describe_failure(
                run, att.failed_cell or att.code
            )
        else:
            att.result = verify.parse_result(run.stdout)
            verdicts.append(verify.check_result_present(att.result, number, run.run_id))
        if att.result is not verify.NO_RESULT:
            self._deterministic_checks(att, number)
        if self.files and run.ok:
            verdicts.append(verify.check_inputs_used(run, self.files, number))
        failed = [v for v in verdicts if not v.passed]
        if failed and att.feedback is None:
            att.feedback = "Verification failed:\n" + "\n".join(
                f"- {v.check}: {v.detail}" for v in failed
            )
        if att.feedback is None:
            self._answer_and_review(att, number, run)
        checks = sorted({v.run_id for v in verdicts if v.run_id and v.run_id != run.run_id})
        self.trace.stage(
            "verify",
            number,
            "passed" if att.passed else "failed",
            started,
            run_id=run.run_id,
            check_runs=checks,
            verdicts=[v.model_dump(mode="json") for v in verdicts],
        )

    def _answer_and_review(self, att: _Attempt, number: int, run: RunResult) -> None:
        """Draft the answer and ground it; then one review call judges the output (a failure
        goes back to Generate) and the draft (a failure goes back to the answer stage)."""
        assert self.plan is not None
        outputs = att.outputs()
        evidence = Evidence.of(outputs, run.artifacts, run.run_id)
        context = Context(
            self.question,
            att.code,
            tuple(self.files),
            tuple(_header(data) for data in self.files.values()),
        )
        draft: str | None = None
        problems: str | None = None
        last: list[Verdict] = []
        for n in range(1, ANSWER_DRAFTS + 1):
            draft, started = self._stage_call(
                "answer",
                answer_mod.draft_answer,
                self.llm,
                self.question,
                self.plan,
                outputs,
                att.result,
                verify.describe_artifacts(run),
                att.verdicts,
                previous=draft,
                feedback=problems,
            )
            claims = ground.check(draft, evidence, context, att.verdicts)
            bad = ground.problems(claims)
            grounding = Verdict(
                check="grounding",
                passed=not bad,
                attempt=number,
                run_id=run.run_id,
                detail=(
                    f"{len(claims)} claims, each found in the outputs"
                    if not bad
                    else "; ".join(bad)
                ),
            )
            self.trace.stage(
                "answer",
                number,
                "ungrounded" if bad else "grounded",
                started,
                run_id=run.run_id,
                draft=n,
                text=draft,
                claims=[c.model_dump(mode="json") for c in claims],
            )
            last = [grounding]
            if bad:
                problems = "It states what no output shows:\n" + "\n".join(f"- {p}" for p in bad)
                continue
            (checklist, faithful), _ = self._stage_call(
                "verify",
                verify.review,
                self.llm,
                self.question,
                self.plan,
                att.code,
                run,
                att.result,
                draft,
                answer_mod.describe_checks(att.verdicts),
                number,
            )
            last = [grounding, checklist, faithful]
            if not checklist.passed:
                att.verdicts.extend(last)
                att.feedback = (
                    "A reviewer checked the output against the question and found: "
                    f"{checklist.detail}"
                )
                return
            if not faithful.passed:
                problems = f"A reviewer found: {faithful.detail}"
                continue
            att.verdicts.extend(last)
            att.answer, att.claims = draft, claims
            return
        att.verdicts.extend(last)
        att.ungrounded = problems or "no draft matched the evidence"

    def _deterministic_checks(self, att: _Attempt, number: int) -> None:
        assert self.plan is not None
        if self.schema is not None:
            att.verdicts.append(verify.check_schema(att.result, self.schema, number))
        if self.plan.invariants:
            found, check_run = verify.check_invariants(
                self.executor, self.plan.invariants, att.result, self.budget, number
            )
            att.runs.append(check_run)
            self._account(check_run)
            att.verdicts.extend(found)
        if self.plan.cross_check:
            if not att.program.cross_check:
                att.verdicts.append(
                    Verdict(
                        check="cross_check",
                        passed=False,
                        attempt=number,
                        detail="the plan asks for a cross-check: give it in `cross_check`",
                    )
                )
            else:
                verdict, check_run = verify.cross_check(
                    self.executor,
                    att.program.cross_check,
                    att.result,
                    self.files,
                    self.budget,
                    self.settings.limits,
                    self.settings.profile,
                    number,
                )
                att.runs.append(check_run)
                self._account(check_run)
                att.verdicts.append(verdict)

    def _answer(self, att: _Attempt) -> Answer:
        assert self.plan is not None and att.main is not None and att.answer is not None
        run = att.main
        self.trace.stage("answer", len(self.logs), "answered", time.time(), run_id=run.run_id)
        return self._finish(
            Answer(
                ask_id=self.ask_id,
                status="answered",
                question=self.question,
                answer=att.answer,
                code=att.code,
                outputs=att.outputs(),
                run_ids=[r.run_id for r in att.runs],
                artifacts=run.artifacts,
                verdicts=att.verdicts,
                claims=att.claims,
                plan=self.plan,
                attempts=len(self.logs),
            )
        )

    def _fail_ungrounded(self, att: _Attempt) -> Answer:
        """The program's result passed its checks, but no draft stated it faithfully: fail,
        with that result plainly given as the program's, never the contradicted text."""
        assert att.main is not None and att.ungrounded is not None
        result = json.dumps(att.result, default=str)
        if len(result) > 500:
            result = result[:500] + "…"
        passed = ", ".join(v.check for v in att.verdicts if v.passed)
        message = (
            f"no answer matched the evidence in {ANSWER_DRAFTS} drafts; the last: "
            f"{att.ungrounded.splitlines()[-1].lstrip('- ')}. The program's result, not "
            f"an answer (run {att.main.run_id}; checks passed: {passed}): {result}"
        )
        return self._fail("ungrounded", message, att)

    def _fail(self, kind: Any, message: str, att: _Attempt | None = None) -> Answer:
        self.trace.stage(
            "answer", len(self.logs), "failed", time.time(), kind=kind, message=message
        )
        answer = Answer(
            ask_id=self.ask_id,
            status="failed",
            question=self.question,
            plan=self.plan,
            attempts=len(self.logs),
            run_ids=list(self.run_ids),
            evidence="runs" if self.run_ids else "none",
            failure=Failure(kind=kind, message=message, logs=self.logs),
        )
        if att is not None and att.main is not None:
            answer.code, answer.outputs = att.code, att.outputs()
            answer.artifacts, answer.verdicts = att.main.artifacts, att.verdicts
        return self._finish(answer)

    def _finish(self, answer: Answer) -> Answer:
        answer.usage = self.usage.model_copy()
        if (
            answer.status == "answered"
            and not answer.run_ids
            and self.plan is not None
            and not self.plan.needs_code
        ):
            self.trace.stage("answer", 0, "answered", time.time(), without_code=True)
        self.store.finish(
            self.ask_id,
            answer.status,
            answer.model_dump_json(),
            answer.run_ids,
            self.usage.input_tokens,
            self.usage.output_tokens,
        )
        return answer


def _header(data: bytes) -> str:
    """The first line of a text input (its column names may state units), or ''."""
    try:
        return data[:1000].decode().split("\n", 1)[0]
    except UnicodeDecodeError:
        return ""


def _first_problem(feedback: str) -> str:
    """The feedback's first line, and the line after a heading ('Verification failed:')."""
    lines = feedback.splitlines() or [""]
    if lines[0].endswith(":") and len(lines) > 1:
        return f"{lines[0]} {lines[1].lstrip('- ')}"
    return lines[0]
