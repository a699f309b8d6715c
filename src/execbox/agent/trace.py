"""The stored trace of an ask: its stages, each model call's tokens, and the runs it cites.

Three tables of their own (own MetaData, created on first use) on the executor's record store
engine, next to the run records, so `execbox runs trace ASK_ID` can show an ask beside its runs.
Rows are written as the ask goes, so an ask that dies midway still leaves what it did.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel

_meta = sa.MetaData()

asks_table = sa.Table(
    "agent_asks",
    _meta,
    sa.Column("ask_id", sa.String(40), primary_key=True),
    sa.Column("created_at", sa.Float, nullable=False, index=True),
    sa.Column("finished_at", sa.Float),
    sa.Column("question", sa.Text, nullable=False),
    sa.Column("model", sa.String(200), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("answer", sa.Text),
    sa.Column("run_ids", sa.Text, nullable=False, default="[]"),
    sa.Column("input_tokens", sa.Integer, nullable=False, default=0),
    sa.Column("output_tokens", sa.Integer, nullable=False, default=0),
)

stages_table = sa.Table(
    "agent_stages",
    _meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("ask_id", sa.String(40), nullable=False, index=True),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("stage", sa.String(20), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("status", sa.String(40), nullable=False),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("duration_ms", sa.Float, nullable=False),
    sa.Column("run_id", sa.String(40)),
    sa.Column("detail", sa.Text, nullable=False, default="{}"),
)

calls_table = sa.Table(
    "agent_model_calls",
    _meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("ask_id", sa.String(40), nullable=False, index=True),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("stage", sa.String(20), nullable=False),
    sa.Column("model", sa.String(200), nullable=False),
    sa.Column("input_tokens", sa.Integer, nullable=False),
    sa.Column("output_tokens", sa.Integer, nullable=False),
    sa.Column("requests", sa.Integer, nullable=False),
    sa.Column("duration_ms", sa.Float, nullable=False),
    sa.Column("ok", sa.Boolean, nullable=False),
    sa.Column("error", sa.Text),
)


class StageRow(BaseModel):
    seq: int
    stage: str
    attempt: int
    status: str
    started_at: float
    duration_ms: float
    run_id: str | None
    detail: dict[str, Any]


class CallRow(BaseModel):
    seq: int
    stage: str
    model: str
    input_tokens: int
    output_tokens: int
    requests: int
    duration_ms: float
    ok: bool
    error: str | None


class AskTrace(BaseModel):
    """Everything stored about one ask."""

    ask_id: str
    created_at: float
    finished_at: float | None
    question: str
    model: str
    status: str
    answer: dict[str, Any] | None
    run_ids: list[str]
    input_tokens: int
    output_tokens: int
    stages: list[StageRow]
    model_calls: list[CallRow]


def new_ask_id() -> str:
    return "ask_" + secrets.token_hex(8)


class TraceStore:
    """Reads and writes ask traces on an SQLAlchemy engine (the run records' engine)."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        _meta.create_all(engine)

    def start(self, ask_id: str, question: str, model: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                asks_table.insert().values(
                    ask_id=ask_id,
                    created_at=time.time(),
                    question=question,
                    model=model,
                    status="running",
                    run_ids="[]",
                    input_tokens=0,
                    output_tokens=0,
                )
            )

    def add_stage(
        self,
        ask_id: str,
        seq: int,
        stage: str,
        attempt: int,
        status: str,
        started_at: float,
        duration_ms: float,
        run_id: str | None,
        detail: dict[str, Any],
    ) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                stages_table.insert().values(
                    ask_id=ask_id,
                    seq=seq,
                    stage=stage,
                    attempt=attempt,
                    status=status,
                    started_at=started_at,
                    duration_ms=duration_ms,
                    run_id=run_id,
                    detail=json.dumps(detail, default=str),
                )
            )

    def add_call(
        self,
        ask_id: str,
        seq: int,
        stage: str,
        model: str,
        input_tokens: int,
        output_tokens: int,
        requests: int,
        duration_ms: float,
        ok: bool,
        error: str | None,
    ) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                calls_table.insert().values(
                    ask_id=ask_id,
                    seq=seq,
                    stage=stage,
                    model=model,
                    input_tokens=input_tokens,
                    output_tokens=output_tokens,
                    requests=requests,
                    duration_ms=duration_ms,
                    ok=ok,
                    error=error,
                )
            )

    def finish(
        self,
        ask_id: str,
        status: str,
        answer_json: str,
        run_ids: list[str],
        input_tokens: int,
        output_tokens: int,
    ) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                asks_table.update()
                .where(asks_table.c.ask_id == ask_id)
                .values(
                    finished_at=time.time(),
                    status=status,
                    answer=answer_json,
                    run_ids=json.dumps(run_ids),
                    input_tokens=input_tokens,
                    output_tokens=output_tokens,
                )
            )

    def get(self, ask_id: str) -> AskTrace | None:
        with self.engine.connect() as conn:
            ask = conn.execute(asks_table.select().where(asks_table.c.ask_id == ask_id)).first()
            if ask is None:
                return None
            stages = conn.execute(
                stages_table.select()
                .where(stages_table.c.ask_id == ask_id)
                .order_by(stages_table.c.seq)
            ).all()
            calls = conn.execute(
                calls_table.select()
                .where(calls_table.c.ask_id == ask_id)
                .order_by(calls_table.c.seq)
            ).all()
        return AskTrace(
            ask_id=ask.ask_id,
            created_at=ask.created_at,
            finished_at=ask.finished_at,
            question=ask.question,
            model=ask.model,
            status=ask.status,
            answer=json.loads(ask.answer) if ask.answer else None,
            run_ids=json.loads(ask.run_ids),
            input_tokens=ask.input_tokens,
            output_tokens=ask.output_tokens,
            stages=[
                StageRow(
                    seq=s.seq,
                    stage=s.stage,
                    attempt=s.attempt,
                    status=s.status,
                    started_at=s.started_at,
                    duration_ms=s.duration_ms,
                    run_id=s.run_id,
                    detail=json.loads(s.detail),
                )
                for s in stages
            ],
            model_calls=[
                CallRow(
                    seq=c.seq,
                    stage=c.stage,
                    model=c.model,
                    input_tokens=c.input_tokens,
                    output_tokens=c.output_tokens,
                    requests=c.requests,
                    duration_ms=c.duration_ms,
                    ok=c.ok,
                    error=c.error,
                )
                for c in calls
            ],
        )

    def list(self, limit: int = 20) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                asks_table.select().order_by(asks_table.c.created_at.desc()).limit(limit)
            ).all()
        return [
            {
                "ask_id": r.ask_id,
                "created_at": r.created_at,
                "status": r.status,
                "model": r.model,
                "question": r.question,
                "tokens": r.input_tokens + r.output_tokens,
            }
            for r in rows
        ]


class Recorder:
    """The trace of one ask as it happens: numbered stages and model calls. Thread-safe."""

    def __init__(self, store: TraceStore, ask_id: str) -> None:
        self.store = store
        self.ask_id = ask_id
        self._seq = 0
        self._lock = threading.Lock()

    def _next(self) -> int:
        with self._lock:
            self._seq += 1
            return self._seq

    def stage(
        self,
        stage: str,
        attempt: int,
        status: str,
        started_at: float,
        run_id: str | None = None,
        **detail: Any,
    ) -> None:
        self.store.add_stage(
            self.ask_id,
            self._next(),
            stage,
            attempt,
            status,
            started_at,
            (time.time() - started_at) * 1000,
            run_id,
            detail,
        )

    def call(
        self,
        stage: str,
        model: str,
        input_tokens: int,
        output_tokens: int,
        requests: int,
        duration_ms: float,
        ok: bool,
        error: str | None,
    ) -> None:
        self.store.add_call(
            self.ask_id,
            self._next(),
            stage,
            model,
            input_tokens,
            output_tokens,
            requests,
            duration_ms,
            ok,
            error,
        )
