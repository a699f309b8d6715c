"""A scripted OpenAI-compatible chat-completions server on loopback, for the wire-format tests.

It answers POST /v1/chat/completions by calling the one output tool the request offers with the
next scripted arguments for that tool, and reports token usage like the real API does.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = Mapping[str, Any] | Callable[[str], Mapping[str, Any]]


class ChatServer:
    def __init__(self, script: Mapping[str, list[Reply]]) -> None:
        self.queues = {tool: deque(replies) for tool, replies in script.items()}
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.usages: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    def reply(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.requests.append((path, body))
            tool = body["tools"][0]["function"]["name"]
            prompt = next(
                (
                    m["content"]
                    for m in reversed(body["messages"])
                    if m["role"] == "user" and isinstance(m["content"], str)
                ),
                "",
            )
            answer = self.queues[tool].popleft()
            args = answer(prompt) if callable(answer) else answer
            n = len(self.requests)
            usage = (100 + n, 10 + n)
            self.usages.append(usage)
        return {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": f"call_{n}",
                                "type": "function",
                                "function": {"name": tool, "arguments": json.dumps(args)},
                            }
                        ],
                    },
                }
            ],
            "usage": {
                "prompt_tokens": usage[0],
                "completion_tokens": usage[1],
                "total_tokens": sum(usage),
            },
        }


@contextmanager
def serve(script: Mapping[str, list[Reply]]) -> Iterator[tuple[ChatServer, str]]:
    chat = ChatServer(script)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the http.server API)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/v1/chat/completions":
                self.send_error(404)
                return
            data = json.dumps(chat.reply(self.path, body)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield chat, f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
