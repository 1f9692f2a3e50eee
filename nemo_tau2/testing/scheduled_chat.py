"""A scheduled chat endpoint: an OpenAI-compatible ``/v1/chat/completions`` on 127.0.0.1 that answers each prompt
(its messages, whole) from that prompt's schedule of assistant messages, in turn, with no model and no tokens.

What profiling a frozen policy needs to be exact in a test or a benchmark: for each pivot's prompt, which answers come
back, in which proportions (``profile_pivots.py``, ``bench/pivots.py``). A prompt marked ``down`` gets a 503 (an
endpoint outage), a prompt with no schedule a 400. ``served`` counts the answers per prompt.
"""

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from nemo_tau2.testing.local_http import LocalHTTPServer


def prompt_key(messages: list[dict[str, Any]]) -> str:
    """A prompt's key: its chat messages, whole (the request's ``messages``)."""
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()


class ScheduledChat:
    """Use as a context manager; ``url`` ends in ``/v1``; ``schedules[prompt_key(messages)] = [message, ...]``."""

    def __init__(self, schedules: dict[str, list[dict[str, Any]]] | None = None):
        self.schedules: dict[str, list[dict[str, Any]]] = schedules if schedules is not None else {}
        self.served: dict[str, int] = {}
        self.down: set[str] = set()
        self._lock = threading.Lock()
        self.server = LocalHTTPServer(self._handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        key = prompt_key(body.get("messages") or [])
        if key in self.down or key not in self.schedules:
            return (503 if key in self.down else 400), None
        with self._lock:
            count = self.served[key] = self.served.get(key, 0) + 1
        schedule = self.schedules[key]
        message = schedule[(count - 1) % len(schedule)]
        return 200, {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        chat = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802
                status, answer = chat.answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                data = json.dumps(answer).encode() if answer is not None else b"{}"
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        return Handler

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "ScheduledChat":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
