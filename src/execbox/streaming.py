"""Live output as an async iterator: a run or a cell executes in a worker thread, and what it
prints reaches the caller as events while it runs, the result last."""

from __future__ import annotations

import asyncio
import codecs
import threading
from collections.abc import AsyncIterator, Callable

from .contract import RunResult, StreamEvent
from .sandbox.host.pump import OutputCallback

Runner = Callable[[OutputCallback, OutputCallback], RunResult]


# Complex on purpose: one loop over stdout, stderr, the result and cancellation.
async def stream_events(  # noqa: C901
    run: Runner,
    cancel: Callable[[], None] | None = None,
) -> AsyncIterator[StreamEvent]:
    """Call `run(on_stdout, on_stderr)` in a thread of its own; yield its output, then its
    result. Output bytes are decoded incrementally (a character split across chunks stays
    whole). Not the loop's default executor: its few threads would queue the calls beyond
    them without bound, out of reach of the executor's admission (`max_concurrency`,
    `max_queue`), which each thread goes through like any caller of `run`. With `cancel`, a
    consumer that stops before the result (its task cancelled, the iterator closed) calls it
    and does not wait for the thread, whose run it ends; without, it waits for the run."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[StreamEvent | BaseException] = asyncio.Queue()
    decoders = {
        kind: codecs.getincrementaldecoder("utf-8")("replace") for kind in ("stdout", "stderr")
    }

    def post(item: StreamEvent | BaseException) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: its consumer stopped (see `cancel`)
            pass

    def sink(kind: str) -> OutputCallback:
        def push(data: bytes) -> None:
            text = decoders[kind].decode(data)
            if text:
                post(StreamEvent(kind=kind, text=text))

        return push

    def work() -> None:
        try:
            result = run(sink("stdout"), sink("stderr"))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's task
            post(exc)
            return
        for kind, decoder in decoders.items():
            tail = decoder.decode(b"", final=True)
            if tail:
                post(StreamEvent(kind=kind, text=tail))
        post(StreamEvent(kind="result", result=result))

    worker: asyncio.Future[None] = loop.create_future()

    def thread() -> None:
        try:
            work()
        finally:
            try:
                loop.call_soon_threadsafe(_settle, worker)
            except RuntimeError:  # the loop is closed: nobody awaits the worker any more
                pass

    threading.Thread(target=thread, name="execbox-stream", daemon=True).start()
    ended = False
    try:
        while True:
            item = await queue.get()
            if isinstance(item, BaseException):
                ended = True
                raise item
            if item.kind == "result":
                ended = True
            yield item
            if ended:
                return
    finally:
        if not ended and cancel is not None:
            cancel()
        else:
            await asyncio.shield(worker)


def _settle(worker: asyncio.Future[None]) -> None:
    if not worker.done():
        worker.set_result(None)
