"""An HTTP proxy in front of the fake that records what each request carried (path, Authorization, JSON body):
what a Gym server really sent to an OpenAI-compatible endpoint."""

import http.server
import json
import threading
import urllib.request

from nemo_tau2.testing.local_http import LocalHTTPServer


class RecordingProxy(http.server.BaseHTTPRequestHandler):
    """Forwards to ``upstream`` and records ``(path, Authorization header, body or None)`` per request."""

    upstream = ""
    seen: list[tuple[str, str, dict | None]] = []

    @classmethod
    def start(cls, upstream: str) -> "_Running":
        cls.upstream, cls.seen = upstream, []
        server = LocalHTTPServer(cls)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return _Running(server)

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if self.command == "POST" else None
        RecordingProxy.seen.append(
            (self.path, self.headers.get("Authorization", ""), json.loads(body) if body else None)
        )
        request = urllib.request.Request(self.upstream + self.path, data=body, method=self.command,
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=60) as answer:
            status, payload = answer.status, answer.read()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _forward

    def log_message(self, *args) -> None:
        pass


class _Running:
    def __init__(self, server: LocalHTTPServer):
        self.server = server
        self.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
