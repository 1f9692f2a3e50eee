"""A scripted NL-assertion judge: an OpenAI-compatible ``/v1/chat/completions`` on 127.0.0.1 (standard library only).

Only the judge's behaviour is scripted: every expected outcome in tau2's judge prompt is met unless the
conversation contains ``fail_marker`` (case-insensitive); the answer is tau2's format
(``{"results": [{"expectedOutcome", "reasoning", "metExpectation"}]}``). It also grades as tau2's pointwise LLM
reranker asks (banking_knowledge's ``*_reranker*`` variants): a document's ``relevance_score`` is the share of the
query's words it contains, 0-10 (:func:`relevance`). ``inject(fault, count, when)`` makes it
do what a real judge endpoint can do, for the next ``count`` requests (those whose prompt contains ``when``):
``http_500``, ``invalid_json``, ``empty_results`` (then it answers properly again). ``hold(when)`` makes it a
slow judge on the tests' cue: requests whose prompt contains ``when`` wait, once received (``holding`` is set), until
``release()``.
"""

import ast
import json
import re
import threading
from http.server import BaseHTTPRequestHandler

from nemo_tau2.testing.local_http import LocalHTTPServer

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


def relevance(prompt: str) -> dict:
    """tau2's reranker answer (``{"relevance_score": 0-10}``) for the query and document in its prompt."""
    query = prompt.partition("<start_query>")[2].partition("<end_query>")[0]
    document = prompt.partition("<start_document>")[2].partition("<end_document>")[0]
    query_words = set(re.findall(r"[a-z0-9]+", query.lower()))
    document_words = set(re.findall(r"[a-z0-9]+", document.lower()))
    share = len(query_words & document_words) / len(query_words) if query_words else 0.0
    return {"relevance_score": round(10 * share)}


class ScriptedJudge:
    """The judge server; ``base_url`` is what ``tau2.judge.base_url`` takes. ``close()`` stops it."""

    MAX_HOLD_S = 120.0  # a held request answers after this even if nobody releases it

    def __init__(self, fail_marker: str = DEFAULT_FAIL_MARKER):
        self.fail_marker = fail_marker
        self.fault: str | None = None
        self.fault_count = 0
        self.fault_when = ""
        self.requests = 0
        self.holding = threading.Event()  # a held request has been received and waits for release()
        self._gate: threading.Event | None = None
        self._gate_when = ""
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                judge.requests += 1
                prompt = body["messages"][-1]["content"]
                gate = judge._gate
                if gate is not None and judge._gate_when in prompt:
                    judge.holding.set()
                    gate.wait(judge.MAX_HOLD_S)
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
                elif "<start_query>" in prompt:
                    content = json.dumps(relevance(prompt))
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

        self._server = LocalHTTPServer(Handler)
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def inject(self, fault: str, count: int = 1, when: str = "") -> None:
        """The next ``count`` requests whose prompt contains ``when`` (any request: "") get ``fault``."""
        self.fault, self.fault_count, self.fault_when = fault, count, when

    def hold(self, when: str = "") -> None:
        """Requests whose prompt contains ``when`` (any request: "") wait until :meth:`release`."""
        self.holding.clear()
        self._gate, self._gate_when = threading.Event(), when

    def release(self) -> None:
        """Held requests answer now, and later ones are not held."""
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.set()

    def close(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()
