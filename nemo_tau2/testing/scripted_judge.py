"""A scripted NL-assertion judge: an OpenAI-compatible ``/v1/chat/completions`` on 127.0.0.1 (standard library only).

Only the judge's behaviour is scripted: every expected outcome in tau2's judge prompt is met unless the
conversation contains ``fail_marker`` (case-insensitive); the answer is tau2's format
(``{"results": [{"expectedOutcome", "reasoning", "metExpectation"}]}``). ``inject(fault, count, when)`` makes it
do what a real judge endpoint can do, for the next ``count`` requests (those whose prompt contains ``when``):
``http_500``, ``invalid_json``, ``empty_results`` (then it answers properly again).
"""

import ast
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEFAULT_FAIL_MARKER = "could not help"


def verdict(prompt: str, fail_marker: str = DEFAULT_FAIL_MARKER) -> dict:
    """tau2 v1.0.1's judge answer format for the outcomes listed after ``expectedOutcomes:`` in its prompt."""
    conversation, _, outcomes_text = prompt.partition("expectedOutcomes:")
    outcomes = ast.literal_eval(outcomes_text.strip())
    met = fail_marker.lower() not in conversation.lower()
    return {
        "results": [
            {"expectedOutcome": outcome, "reasoning": "scripted", "metExpectation": met} for outcome in outcomes
        ]
    }


class ScriptedJudge:
    """The judge server; ``base_url`` is what ``tau2.judge.base_url`` takes. ``close()`` stops it."""

    def __init__(self, fail_marker: str = DEFAULT_FAIL_MARKER):
        self.fail_marker = fail_marker
        self.fault: str | None = None
        self.fault_count = 0
        self.fault_when = ""
        self.requests = 0
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                judge.requests += 1
                prompt = body["messages"][-1]["content"]
                fault = judge.fault if judge.fault_count > 0 and judge.fault_when in prompt else None
                if fault:
                    judge.fault_count -= 1
                if fault == "http_500":
                    self._send(500, {"error": {"message": "judge overloaded"}})
                    return
                if fault == "invalid_json":
                    content = "The agent did well."
                elif fault == "empty_results":
                    content = json.dumps({"results": []})
                else:
                    content = json.dumps(verdict(prompt, judge.fail_marker))
                self._send(200, {
                    "id": "judge", "object": "chat.completion", "created": 0, "model": body.get("model", "judge"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": content}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                })  # fmt: skip

            def _send(self, status: int, payload: dict):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def inject(self, fault: str, count: int = 1, when: str = "") -> None:
        """The next ``count`` requests whose prompt contains ``when`` (any request: "") get ``fault``."""
        self.fault, self.fault_count, self.fault_when = fault, count, when

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
