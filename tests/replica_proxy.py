"""An HTTP proxy in front of one model replica that records each chat completion (request and answer), and can
strip the recorded token ids from the messages first: what stock vLLM does with them (it ignores them), so the
same episodes can be run with and without the prefix splice against the same servers."""

import http.server
import json
import threading
import urllib.error
import urllib.request

from nemo_tau2.generation.prefix import REQUIRED_PREFIX_FIELD, TOKEN_FIELDS
from nemo_tau2.testing.local_http import LocalHTTPServer


class ReplicaProxy:
    def __init__(self, upstream_root: str, strip_token_ids: bool = False) -> None:
        self.upstream_root = upstream_root.removesuffix("/").removesuffix("/v1")
        self.strip_token_ids = strip_token_ids
        self.completions: list[tuple[dict, dict]] = []  # (request as forwarded, answer) of each 200 chat completion
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if self.command == "POST" and length else None
                if body is not None and proxy.strip_token_ids and "messages" in body:
                    body = proxy.without_token_ids(body)
                data = json.dumps(body).encode() if body is not None else None
                request = urllib.request.Request(
                    proxy.upstream_root + self.path, data=data, method=self.command,
                    headers={"Content-Type": "application/json"},
                )  # fmt: skip
                try:
                    with urllib.request.urlopen(request, timeout=600) as answer:
                        status, payload, kind = answer.status, answer.read(), answer.headers.get("Content-Type")
                except urllib.error.HTTPError as e:
                    status, payload, kind = e.code, e.read(), e.headers.get("Content-Type")
                if status == 200 and self.path.endswith("/chat/completions"):
                    with proxy._lock:
                        proxy.completions.append((body, json.loads(payload)))
                self.send_response(status)
                self.send_header("Content-Type", kind or "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _forward

            def log_message(self, *args) -> None:
                pass

        self.server = LocalHTTPServer(Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    @staticmethod
    def without_token_ids(body: dict) -> dict:
        messages = [{k: v for k, v in m.items() if k not in TOKEN_FIELDS} for m in body["messages"]]
        return {k: v for k, v in body.items() if k != REQUIRED_PREFIX_FIELD} | {"messages": messages}

    def __enter__(self) -> "ReplicaProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
