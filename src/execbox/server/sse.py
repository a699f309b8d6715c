"""Server-sent events for a run or cell: its stdout and stderr as they are written, then the
result. The executor calls the output callbacks from its worker thread; they hop onto the event
loop through a queue, so the loop never blocks and events keep their order. (Unlike
`execbox.streaming`, the run uses the server's own run limiter, not asyncio's small default
thread pool, and goes on to its end, recorded, when the client disconnects.)

    event: stdout          data: {"text": "..."}
    event: stderr          data: {"text": "..."}
    event: overflow        data: {"message": "..."}     (once, if the client reads too slowly:
                           no more output events follow; the result still has all of it)
    event: result          data: <RunResult JSON>       (last event on success)
    event: error           data: {"error": {"code", "message"}, "status"}   (last, on failure;
                           status: the HTTP status the same error has on the plain endpoint)
"""

from __future__ import annotations

import asyncio
import codecs
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ..contract import RunResult
from ..errors import ExecboxError
from .errors import ApiError, translate

OutputCallback = Callable[[bytes], None]
Call = Callable[[OutputCallback | None, OutputCallback | None], RunResult]

_background: set[asyncio.Task[None]] = set()

# OpenAPI description of a streaming response: each server-sent event as {event, data}.
RESPONSE: dict[str, Any] = {
    "description": 'Server-sent events: stdout and stderr as {"text"} while the code runs '
    "(one overflow event, and no more output, if the client reads too slowly), "
    'then one result (a RunResult) or one error ({"error": {code, message}}).',
    "content": {
        "text/event-stream": {
            "schema": {
                "type": "object",
                "required": ["event", "data"],
                "properties": {
                    "event": {
                        "type": "string",
                        "enum": ["stdout", "stderr", "overflow", "result", "error"],
                    },
                    "data": {"type": "string", "description": "JSON text"},
                },
            }
        }
    },
}


def event(name: str, data: str) -> bytes:
    return f"event: {name}\ndata: {data}\n\n".encode()


def result_json(result: RunResult) -> bytes:
    """The result's JSON, encoded once: `model_dump_json` makes bytes, then a str of them,
    which a response encodes again (three copies of a big output where one will do)."""
    return RunResult.__pydantic_serializer__.to_json(result)


class Buffered:
    """Characters of output waiting for slow readers, summed over every stream of a server,
    and the most there ever were. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.held = self.peak = 0

    def add(self, n: int) -> None:
        with self._lock:
            self.held += n
            self.peak = max(self.peak, self.held)


class Feed:
    """One run or cell on a worker thread (started at once) and the events it makes. At most
    `buffer_chars` of output wait for the reader; past that the stream gets one `overflow`
    event and no more output, and the run goes on to its result (which holds all its output
    within its limits): the client's reading speed never holds the server's memory."""

    def __init__(
        self,
        call: Call,
        run_in_thread: Callable[[Callable[[], RunResult]], Any],
        buffer_chars: int,
        buffered: Buffered,
    ) -> None:
        loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._buffered = buffered
        self._lock = threading.Lock()
        self._held = 0
        self._cut = False
        decoders = {
            name: codecs.getincrementaldecoder("utf-8")("replace") for name in ("stdout", "stderr")
        }

        def put(item: tuple[str, Any]) -> None:
            try:
                loop.call_soon_threadsafe(self._queue.put_nowait, item)
            except RuntimeError:  # the loop is gone (server shutting down)
                pass

        def send(name: str, text: str) -> None:
            if not text:
                return
            with self._lock:
                if self._cut:
                    return
                if self._held + len(text) > buffer_chars:
                    self._cut = True
                    put(("overflow", None))
                    return
                self._held += len(text)
            buffered.add(len(text))
            put((name, text))

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
                self._queue.put_nowait(("result", result))
            except ApiError as exc:
                self._queue.put_nowait(("error", exc))
            except ExecboxError as exc:
                self._queue.put_nowait(("error", translate(exc)))
            except Exception:  # noqa: BLE001 - reported to the client as an internal error
                self._queue.put_nowait(
                    ("error", ApiError(500, "internal_error", "internal server error"))
                )

        task = asyncio.create_task(worker())
        _background.add(task)
        task.add_done_callback(_background.discard)
        self._buffer_chars = buffer_chars

    def _taken(self, n: int) -> None:
        with self._lock:
            self._held -= n
        self._buffered.add(-n)

    async def events(self) -> AsyncIterator[bytes]:
        """The events, the last one a result or an error. The run goes on to its end if the
        client goes away (it is bounded by its own limits and is still recorded)."""
        try:
            while True:
                name, item = await self._queue.get()
                if name == "result":
                    assert isinstance(item, RunResult)
                    # In pieces: one event string would be two more copies of the output.
                    yield b"event: result\ndata: "
                    yield result_json(item)
                    yield b"\n\n"
                    return
                if name == "error":
                    assert isinstance(item, ApiError)
                    yield event(
                        "error",
                        json.dumps(
                            {
                                "error": {"code": item.code, "message": item.message},
                                "status": item.status,
                            }
                        ),
                    )
                    return
                if name == "overflow":
                    yield event(
                        "overflow",
                        json.dumps(
                            {
                                "message": (
                                    f"the client read more slowly than the code wrote: over "
                                    f"{self._buffer_chars} characters of output were waiting, so no more "
                                    "output is streamed; the result event at the end holds it all"
                                )
                            }
                        ),
                    )
                    continue
                self._taken(len(item))
                yield event(name, json.dumps({"text": item}))
        finally:
            self._drop()

    def _drop(self) -> None:
        """The stream has ended (sent, or the client gone): what still waits is let go."""
        with self._lock:
            self._cut = True
            held, self._held = self._held, 0
        self._buffered.add(-held)


class EventStream(StreamingResponse):
    """A feed's events as a response; `on_end` is awaited once the response has ended,
    however it ended (sent, or the client gone, even before the first event)."""

    def __init__(self, feed: Feed, on_end: Callable[[], Awaitable[None]]) -> None:
        super().__init__(
            feed.events(), media_type="text/event-stream", headers={"Cache-Control": "no-store"}
        )
        self._feed = feed
        self._on_end = on_end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._feed._drop()
            await self._on_end()
