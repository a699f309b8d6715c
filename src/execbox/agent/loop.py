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

from ..contract import RunResult
from ..executor import Executor
from . import generate as generate_mod
from . import plan as plan_mod
from . import verify
from .attempt import Attempt, Runner
from .drafting import ANSWER_DRAFTS, answer_and_review
from .execute import effective_limits
from .llm import LLM, ModelFailure, resolve_model
from .meter import Breaker, Meter
from .models import (
    Answer,
    AskSettings,
    AttemptLog,
    Failure,
    Plan,
    Verdict,
)
from .trace import Recorder, TraceStore, new_ask_id

if TYPE_CHECKING:
    from pydantic_ai.models import Model

Schema = Mapping[str, Any] | type[BaseModel]


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
        self.logs: list[AttemptLog] = []
        self.ask_id = new_ask_id()
        self.store = TraceStore(executor.store.engine)
        self.trace = Recorder(self.store, self.ask_id)
        self.meter = Meter(settings, self.trace)
        self.llm = LLM(model, on_call=self.meter.on_call)
        self.runner = Runner(executor, files, settings, self.trace, self.meter)
        self.plan: Plan | None = None
        # Checked before the ask starts: limits the policy refuses are the caller's mistake.
        self.limits = effective_limits(executor, settings.limits, settings.profile)

    def _stage_call(self, stage: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.meter.check_tokens()
        started = time.time()
        try:
            out = fn(*args, **kwargs)
        except ModelFailure as exc:
            self.trace.stage(stage, len(self.logs), "model_error", started, error=str(exc))
            raise
        self.meter.check_tokens()
        return out, started

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
            last: Attempt | None = None
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
        except Breaker as trip:
            return self._fail(trip.kind, trip.message)
        except ModelFailure as exc:
            return self._fail("model_error", f"the model call failed: {exc}")
        except BaseException as exc:  # a host or caller error: the trace says so, then re-raise
            self.store.finish(
                self.ask_id,
                "error",
                "",
                self.meter.run_ids,
                self.meter.usage.input_tokens,
                self.meter.usage.output_tokens,
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

    def _attempt(self, number: int, mode: str, limits: Any, previous: Attempt | None) -> Attempt:
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
        att = Attempt(program)
        log = AttemptLog(attempt=number, status="not_run")
        self.logs.append(log)
        try:
            self._run_and_verify(att, number, mode, log)
        finally:
            log.feedback = att.feedback
        return att

    def _run_and_verify(self, att: Attempt, number: int, mode: str, log: AttemptLog) -> None:
        run = self.runner.run(att, number, mode, log)
        if run is None:
            return
        att.main = run
        self._verify(att, number, run)

    def _verify(self, att: Attempt, number: int, run: RunResult) -> None:
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
            answer_and_review(
                att,
                number,
                run,
                llm=self.llm,
                question=self.question,
                plan=self.plan,
                files=self.files,
                trace=self.trace,
                stage_call=self._stage_call,
            )
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

    def _deterministic_checks(self, att: Attempt, number: int) -> None:
        assert self.plan is not None
        if self.schema is not None:
            att.verdicts.append(verify.check_schema(att.result, self.schema, number))
        if self.plan.invariants:
            found, check_run = verify.check_invariants(
                self.executor, self.plan.invariants, att.result, self.meter.budget, number
            )
            att.runs.append(check_run)
            self.meter.account(check_run)
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
                    self.meter.budget,
                    self.settings.limits,
                    self.settings.profile,
                    number,
                )
                att.runs.append(check_run)
                self.meter.account(check_run)
                att.verdicts.append(verdict)

    def _answer(self, att: Attempt) -> Answer:
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

    def _fail_ungrounded(self, att: Attempt) -> Answer:
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

    def _fail(self, kind: Any, message: str, att: Attempt | None = None) -> Answer:
        self.trace.stage(
            "answer", len(self.logs), "failed", time.time(), kind=kind, message=message
        )
        answer = Answer(
            ask_id=self.ask_id,
            status="failed",
            question=self.question,
            plan=self.plan,
            attempts=len(self.logs),
            run_ids=list(self.meter.run_ids),
            evidence="runs" if self.meter.run_ids else "none",
            failure=Failure(kind=kind, message=message, logs=self.logs),
        )
        if att is not None and att.main is not None:
            answer.code, answer.outputs = att.code, att.outputs()
            answer.artifacts, answer.verdicts = att.main.artifacts, att.verdicts
        return self._finish(answer)

    def _finish(self, answer: Answer) -> Answer:
        answer.usage = self.meter.usage.model_copy()
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
            self.meter.usage.input_tokens,
            self.meter.usage.output_tokens,
        )
        return answer


def _first_problem(feedback: str) -> str:
    """The feedback's first line, and the line after a heading ('Verification failed:')."""
    lines = feedback.splitlines() or [""]
    if lines[0].endswith(":") and len(lines) > 1:
        return f"{lines[0]} {lines[1].lstrip('- ')}"
    return lines[0]
