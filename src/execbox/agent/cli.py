"""`execbox ask` and the trace views under `execbox runs` (`asks`, `trace`).

Only click is imported at module level: the CLI must start fast; the agent and pydantic-ai load
when a command runs.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import click

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _fail(message: str) -> NoReturn:
    click.echo(f"execbox: {message}", err=True)
    sys.exit(EXIT_USAGE)


@click.command("ask")
@click.argument("question")
@click.option(
    "--file",
    "files",
    multiple=True,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="An input file, placed read-only in the workspace (repeat).",
)
@click.option("--model", help="Model string, e.g. openai:gpt-4o (default: EXECBOX_MODEL).")
@click.option(
    "--base-url",
    help="OpenAI-compatible server for a bare model name "
    "(default: EXECBOX_BASE_URL or OPENAI_BASE_URL).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the answer with its evidence as JSON.")
@click.option(
    "--artifacts-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write the answer's artifacts (cleaned files, charts) here.",
)
@click.option(
    "--schema",
    "schema_path",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="A JSON schema the printed result must match.",
)
@click.option(
    "--mode",
    type=click.Choice(["auto", "run", "tests_first", "steps"]),
    default="auto",
    show_default=True,
    help="tests_first: test a reference implementation first; steps: cells in one "
    "stateful session; auto: as the plan says.",
)
@click.option("--max-repairs", type=click.IntRange(0, 20), default=3, show_default=True)
@click.option(
    "--max-exec-s",
    type=click.FloatRange(min=0, min_open=True),
    default=120.0,
    show_default=True,
    help="Total sandbox execution time of the ask.",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=200_000,
    show_default=True,
    help="Total model tokens of the ask.",
)
@click.option("--timeout", type=float, help="Wall time limit of each run in seconds.")
@click.option("--memory", type=int, help="Memory limit of each run in MiB.")
@click.option("--profile", default="data", show_default=True, help="Policy profile of the runs.")
def ask_cmd(
    question: str,
    files: tuple[Path, ...],
    model: str | None,
    base_url: str | None,
    as_json: bool,
    artifacts_dir: Path | None,
    schema_path: Path | None,
    mode: str,
    max_repairs: int,
    max_exec_s: float,
    max_tokens: int,
    timeout: float | None,
    memory: int | None,
    profile: str,
) -> None:
    """Answer QUESTION by running code in the sandbox, and show the evidence.

    Exit status 0 when answered and verified, 1 when the agent stopped without an answer (the
    logs say why), 2 for usage or host errors."""
    from ..contract import Limits
    from ..errors import ExecboxError
    from ..executor import Executor
    from .llm import resolve_model
    from .loop import ask
    from .models import AskSettings

    schema = None
    if schema_path is not None:
        try:
            schema = json.loads(schema_path.read_text())
        except ValueError as exc:
            _fail(f"{schema_path} is not JSON: {exc}")
    limit_fields = {
        k: v for k, v in (("timeout_s", timeout), ("memory_mib", memory)) if v is not None
    }
    try:
        settings = AskSettings(
            max_repairs=max_repairs,
            max_exec_s=max_exec_s,
            max_tokens=max_tokens,
            profile=profile,
            mode=mode,
            limits=Limits(**limit_fields) if limit_fields else None,
        )
        resolved = resolve_model(model, base_url=base_url)
        with Executor() as executor:
            answer = ask(
                question,
                executor=executor,
                model=resolved,
                files=list(files),
                expected_schema=schema,
                settings=settings,
            )
    except (ExecboxError, ValueError) as exc:
        _fail(str(exc))
    written: list[Path] = []
    if artifacts_dir is not None and answer.artifacts:
        from ..cli import write_artifacts
        from ..contract import RunResult, Status

        holder = RunResult(
            run_id=answer.run_ids[-1] if answer.run_ids else "",
            status=Status.ok,
            artifacts=answer.artifacts,
        )
        written = write_artifacts(holder, artifacts_dir)
    if as_json:
        click.echo(answer.model_dump_json(indent=2))
    else:
        _print_answer(answer, written)
    sys.exit(EXIT_OK if answer.ok else EXIT_FAILED)


def _print_answer(answer: Any, written: list[Path]) -> None:
    if answer.ok:
        click.echo(answer.answer)
        if answer.evidence == "none":
            click.echo(
                "\nevidence: none (answered without running code: nothing was computed or checked)",
                err=True,
            )
    else:
        click.echo(
            f"No verified answer ({answer.failure.kind}): {answer.failure.message}", err=True
        )
        for log in answer.failure.logs:
            click.echo(
                f"  attempt {log.attempt}: {log.status}"
                + (f" {log.error}" if log.error else "")
                + (f" runs {', '.join(log.run_ids)}" if log.run_ids else ""),
                err=True,
            )
    if answer.claims:
        click.echo("\nevidence:", err=True)
        for claim in answer.claims:
            click.echo("  " + _claim_line(claim.model_dump()), err=True)
    if answer.verdicts:
        click.echo("\nverification:", err=True)
        for v in answer.verdicts:
            click.echo(
                f"  [{'pass' if v.passed else 'FAIL'}] {v.check}: "
                f"{v.detail.splitlines()[0] if v.detail else ''}",
                err=True,
            )
    for art in answer.artifacts:
        click.echo(f"artifact {art.path} ({art.size} bytes, {art.mime_type})", err=True)
    for path in written:
        click.echo(f"  written to {path}", err=True)
    runs = ", ".join(answer.run_ids) or "none"
    click.echo(
        f"runs: {runs}\ntokens: {answer.usage.total_tokens} in {answer.usage.requests} "
        f"model calls; attempts: {answer.attempts}\n"
        f"trace: execbox runs trace {answer.ask_id}",
        err=True,
    )


def _claim_line(claim: dict[str, Any]) -> str:
    where = (f"run {claim['run_id']}, " if claim.get("run_id") else "") + (
        claim.get("source") or ""
    )
    return (
        f"[{'ok' if claim['grounded'] else 'NOT IN THE OUTPUTS'}] {claim['kind']} "
        f"{claim['text']!r}: {where if claim['grounded'] else claim.get('detail', '')}"
    )


def _traces() -> Any:
    from ..records import RunStore
    from .trace import TraceStore

    return TraceStore(RunStore().engine)


@click.command("asks")
@click.option("--limit", default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def asks_cmd(limit: int, as_json: bool) -> None:
    """The most recent asks of the agent, newest first."""
    for row in _traces().list(limit=limit):
        if as_json:
            click.echo(json.dumps(row))
            continue
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["created_at"]))
        click.echo(
            f"{row['ask_id']}  {when}  {row['status']:<9} {row['tokens']:>7} tok  "
            f"{row['question'][:60]}"
        )


@click.command("trace")
@click.argument("ask_id")
@click.option("--json", "as_json", is_flag=True, help="The whole trace as JSON.")
def trace_cmd(ask_id: str, as_json: bool) -> None:
    """An ask's stages, model calls (tokens) and the runs its answer cites."""
    trace = _traces().get(ask_id)
    if trace is None:
        _fail(f"no ask {ask_id!r}")
    if as_json:
        click.echo(trace.model_dump_json(indent=2))
        return
    click.echo(f"{trace.ask_id}  {trace.status}  model {trace.model}\nquestion: {trace.question}")
    events = [(s.seq, "stage", s) for s in trace.stages] + [
        (c.seq, "call", c) for c in trace.model_calls
    ]
    for _, kind, item in sorted(events, key=lambda e: e[0]):
        if kind == "stage":
            extra = f" run {item.run_id}" if item.run_id else ""
            if item.detail.get("check_runs"):
                extra += f" (checks ran as {', '.join(item.detail['check_runs'])})"
            label = item.detail.get("program") or (
                f"draft {item.detail['draft']}" if item.detail.get("draft") else None
            )
            click.echo(
                f"  {item.seq:>3} {item.stage:<9} attempt {item.attempt} {item.status}"
                f"{f' ({label})' if label else ''}{extra} {item.duration_ms:.0f} ms"
            )
            for claim in item.detail.get("claims") or []:
                click.echo("        " + _claim_line(claim))
            if item.stage == "verify" and item.detail.get("verdicts"):
                click.echo(
                    "        checks: "
                    + ", ".join(
                        f"{v['check']} {'pass' if v['passed'] else 'FAIL'}"
                        for v in item.detail["verdicts"]
                    )
                )
        else:
            click.echo(
                f"  {item.seq:>3}   model {item.stage:<9} {item.input_tokens} in / "
                f"{item.output_tokens} out tokens, {item.duration_ms:.0f} ms"
                + ("" if item.ok else f" FAILED {item.error}")
            )
    click.echo(f"tokens: {trace.input_tokens} in / {trace.output_tokens} out")
    click.echo(f"cited runs: {', '.join(trace.run_ids) or 'none'} (execbox runs show RUN_ID)")
