"""Server-sent events for a run or cell: its stdout and stderr as they are written, then the
result. The executor calls the output callbacks from its worker thread; they hop onto the event
loop through a queue, so the loop never blocks and events keep their order. (Unlike
`execbox.streaming`, the run uses the server's own run limiter, not asyncio's small default
thread pool, and goes on to its end, recorded, when the client disconnects.)

    event: stdout          data: {"text": "..."}
    event: stderr          data: {"text": "..."}
    event: result          data: <RunResult JSON>       (last event on success)
    event: error           data: {"error": {"code", "message"}, "status"}   (last, on failure;
                           status: the HTTP status the same error has on the plain endpoint)
"""

from __future__ import annotations

import asyncio
import codecs
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..contract import RunResult
from ..errors import ExecboxError
from .errors import ApiError, translate

OutputCallback = Callable[[bytes], None]
Call = Callable[[OutputCallback | None, OutputCallback | None], RunResult]

_background: set[asyncio.Task[None]] = set()

# OpenAPI description of a streaming response: each server-sent event as {event, data}.
RESPONSE: dict[str, Any] = {
    "description": "Server-sent events: stdout and stderr as {\"text\"} while the code runs, "
                   "then one result (a RunResult) or one error ({\"error\": {code, message}}).",
    "content": {"text/event-stream": {"schema": {
        "type": "object", "required": ["event", "data"],
        "properties": {"event": {"type": "string",
                                 "enum": ["stdout", "stderr", "result", "error"]},
                       "data": {"type": "string", "description": "JSON text"}}}}},
}


def event(name: str, data: str) -> bytes:
    return f"event: {name}\ndata: {data}\n\n".encode()


async def stream(call: Call, run_in_thread: Callable[[Callable[[], RunResult]], Any]
                 ) -> AsyncIterator[bytes]:
    """Run `call(on_stdout, on_stderr)` through `run_in_thread` and yield its events.

    The run goes on to its end if the client goes away (it is bounded by its own limits and
    is still recorded); only the events are dropped."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    decoders = {name: codecs.getincrementaldecoder("utf-8")("replace")
                for name in ("stdout", "stderr")}

    def send(name: str, text: str) -> None:
        if text:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (name, text))
            except RuntimeError:  # the loop is gone (server shutting down)
                pass

    def forward(name: str) -> OutputCallback:
        return lambda chunk: send(name, decoders[name].decode(chunk))

    def run() -> RunResult:
        result = call(forward("stdout"), forward("stderr"))
        for name, decoder in decoders.items():  # a character cut at the very end
            send(name, decoder.decode(b"", final=True))
        return result

    async def worker() -> None:
        try:
            result = await run_in_thread(run)
            queue.put_nowait(("result", result))
        except ApiError as exc:
            queue.put_nowait(("error", exc))
        except ExecboxError as exc:
            queue.put_nowait(("error", translate(exc)))
        except Exception:  # noqa: BLE001 - reported to the client as an internal error
            queue.put_nowait(("error", ApiError(500, "internal_error", "internal server error")))

    task = asyncio.create_task(worker())
    _background.add(task)
    task.add_done_callback(_background.discard)
    while True:
        name, item = await queue.get()
        if name == "result":
            assert isinstance(item, RunResult)
            yield event("result", item.model_dump_json())
            return
        if name == "error":
            assert isinstance(item, ApiError)
            yield event("error", json.dumps({"error": {"code": item.code,
                                                       "message": item.message},
                                             "status": item.status}))
            return
        yield event(name, json.dumps({"text": item}))
