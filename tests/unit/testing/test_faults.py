"""Injected faults: each kind, how rules select requests, the HTTP control route, latency and stats."""

import asyncio
import json
import time

import aiohttp
import pytest
from conftest import chat, post_json

from nemo_tau2.testing import Turn, start_fake_server

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def scripted(fake):
    for key in ("a", "b", "x|user"):
        fake.register_script(key, [Turn.say(f"answer for {key}")])
    return fake


async def _status(http, fake, key: str = "a", route: str = "chat") -> int:
    url = f"{fake.base_url}/chat/completions" if route == "chat" else f"{fake.root_url}/tokenize"
    async with http.post(url, json={"messages": MESSAGES, "user": key}) as response:
        await response.read()
        return response.status


@pytest.mark.parametrize("kind, status", [("http_500", 500), ("http_503", 503), ("http_429", 429)])
async def test_http_error_faults_hit_the_next_n_requests(scripted, http, kind, status):
    scripted.inject_fault(kind, count=2)
    assert [await _status(http, scripted) for _ in range(3)] == [status, status, 200]
    stats = scripted.stats()
    assert stats.faults_by_kind[kind] == 2 and stats.requests_by_key["a"] == 3
    assert stats.responses_by_status[status] == 2 and stats.responses_by_status[200] == 1


async def test_error_fault_body_is_an_openai_error(scripted, http):
    scripted.inject_fault("http_500")
    status, data = await post_json(http, f"{scripted.base_url}/chat/completions", {"messages": MESSAGES, "user": "a"})
    assert status == 500 and data["object"] == "error" and "injected fault: http_500" in data["message"]


async def test_garbage_fault_is_200_with_invalid_json(scripted, http):
    scripted.inject_fault("garbage")
    async with http.post(f"{scripted.base_url}/chat/completions", json={"messages": MESSAGES, "user": "a"}) as r:
        assert r.status == 200 and r.content_type == "application/json"
        with pytest.raises(json.JSONDecodeError):
            json.loads(await r.text())


async def test_drop_fault_closes_the_connection(scripted, http):
    scripted.inject_fault("drop")
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await _status(http, scripted)
    assert await _status(http, scripted) == 200


async def test_timeout_fault_holds_past_the_client_timeout_then_recovers(scripted, http):
    scripted.inject_fault("timeout", hold_s=5.0)
    with pytest.raises(asyncio.TimeoutError):
        async with http.post(
            f"{scripted.base_url}/chat/completions",
            json={"messages": MESSAGES, "user": "a"},
            timeout=aiohttp.ClientTimeout(total=0.3),
        ):
            pass
    data = await chat(http, scripted, messages=MESSAGES, user="a")
    assert data["choices"][0]["message"]["content"] == "answer for a"


async def test_held_request_is_answered_after_the_hold(scripted, http):
    scripted.inject_fault("timeout", hold_s=0.2)
    start = time.monotonic()
    assert await _status(http, scripted) == 200
    assert time.monotonic() - start >= 0.2


async def test_close_releases_held_requests(http):
    fake = start_fake_server()
    fake.register_script("a", [Turn.say("x")])
    fake.inject_fault("timeout", hold_s=600)
    request = asyncio.ensure_future(_status(http, fake))
    deadline = time.monotonic() + 30
    while fake.stats().faults_by_kind["timeout"] < 1:  # held, however long the request took to arrive
        assert time.monotonic() < deadline, "the request never reached the fake"
        await asyncio.sleep(0.05)
    start = time.monotonic()
    await asyncio.to_thread(fake.close)
    assert time.monotonic() - start < 30  # not the 600 s hold
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await request


async def test_faults_select_by_key_pattern_and_route(scripted, http):
    scripted.inject_fault("http_503", key="b", count=None)
    scripted.inject_fault("http_500", key_pattern=r"\|user$", count=None)
    scripted.inject_fault("http_429", route="tokenize")
    assert [await _status(http, scripted, key) for key in ("a", "b", "x|user")] == [200, 503, 500]
    assert await _status(http, scripted, route="tokenize") == 429
    assert await _status(http, scripted, route="tokenize") == 200
    scripted.clear_faults()
    assert await _status(http, scripted, "b") == 200


async def test_fraction_is_seeded_and_repeatable(http):
    outcomes = []
    for _ in range(2):
        with start_fake_server() as fake:
            fake.register_script("a", [Turn.say("x")])
            fake.inject_fault("http_500", count=None, fraction=0.5, seed=3)
            outcomes.append([await _status(http, fake) for _ in range(30)])
    assert outcomes[0] == outcomes[1]
    assert 5 <= outcomes[0].count(500) <= 25


async def test_control_route_drives_faults_latency_and_stats(scripted, http):
    body = {"faults": [{"kind": "http_503", "count": 1}], "latency_ms": 100}
    status, data = await post_json(http, f"{scripted.root_url}/fake/control", body)
    assert status == 200 and data == {"ok": True, "active_faults": 1}
    assert await _status(http, scripted) == 503
    start = time.monotonic()
    assert await _status(http, scripted) == 200
    assert time.monotonic() - start >= 0.1
    async with http.get(f"{scripted.root_url}/fake/stats") as response:
        stats = await response.json()
    assert stats["requests_by_key"]["a"] == 2 and stats["faults_by_kind"] == {"http_503": 1}


@pytest.mark.parametrize(
    "body, problem",
    [
        ({"faults": [{"kind": "http_418"}]}, "faults.0.kind"),
        ({"faults": [{"kind": "drop", "key": "a", "key_pattern": "b"}]}, "set at most one of key and key_pattern"),
        ({"latency": 5}, "latency"),
        ({"faults": [{"kind": "drop", "fraction": 2}]}, "faults.0.fraction"),
    ],
)
async def test_control_route_rejects_bad_bodies_naming_the_field(scripted, http, body, problem):
    status, data = await post_json(http, f"{scripted.root_url}/fake/control", body)
    assert status == 400 and problem in data["message"]


async def test_latency_applies_to_every_completion(scripted, http):
    scripted.set_latency(50)
    start = time.monotonic()
    await asyncio.gather(*(_status(http, scripted) for _ in range(20)))  # concurrent: sleeps overlap
    elapsed = time.monotonic() - start
    assert elapsed >= 0.05
