"""Benchmark the scripted fake server: server CPU per turn and throughput under many concurrent conversations.

1. ``engine``: the server-side work of one policy turn without HTTP (decode the request JSON, answer the chat
   completion with token ids and logprobs, answer the matching /tokenize, encode both responses), on a realistic
   airline conversation (tau2's airline policy as the system prompt, all 14 tool schemas, growing history).
2. ``http``: the fake in a subprocess, ``--conversations`` clients at once, each sending ``--turns`` chat + tokenize
   pairs, at 0 ms and 50 ms latency. Server CPU per turn is read from /proc for the server process.

Prints one JSON object per measurement; the last line is the summary JSON.
"""

import argparse
import asyncio
import json
import os
import statistics
import time

import aiohttp
import orjson

import nemo_tau2  # noqa: F401  (offline tau2 settings first)
from nemo_tau2.tau2_env import domains
from nemo_tau2.testing import FakeEngine, FakeServerConfig, start_fake_server, tau2_key

DOMAIN, TASK_ID = "airline", "7"


def policy_requests(engine: FakeEngine) -> list[dict]:
    """The oracle's policy requests for one airline episode, as the agent would send them (history growing)."""
    key = tau2_key(DOMAIN, TASK_ID, 0, "policy")
    messages = [{"role": "system", "content": domains.policy(DOMAIN)}, {"role": "user", "content": "Hi, I need help."}]
    requests = []
    for _ in range(20):
        body = {
            "model": "fake-model",
            "messages": list(messages),
            "tools": domains.chat_tool_schemas(DOMAIN),
            "user": key,
            "logprobs": True,
            "top_logprobs": 0,
            "return_tokens_as_token_ids": True,
        }
        requests.append(body)
        message = engine.complete(body)["choices"][0]["message"]
        messages.append({"role": "assistant", "content": message["content"], "tool_calls": message["tool_calls"]})
        if not message["tool_calls"]:
            break
        for call in message["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": '{"status": "ok"}' * 20})
    return requests


def bench_engine(repeats: int) -> dict:
    engine = FakeEngine(FakeServerConfig())
    requests = policy_requests(engine)
    payloads = [orjson.dumps(body) for body in requests]
    tokenize_payloads = [orjson.dumps({k: body[k] for k in ("model", "messages", "tools")}) for body in requests]
    per_turn_us = []
    for _ in range(repeats):
        for payload, tokenize_payload in zip(payloads, tokenize_payloads, strict=True):
            start = time.perf_counter()
            orjson.dumps(engine.complete(orjson.loads(payload)))
            orjson.dumps(engine.tokenize(orjson.loads(tokenize_payload)))
            per_turn_us.append((time.perf_counter() - start) * 1e6)
    prompt_tokens = engine.complete(orjson.loads(payloads[-1]))["usage"]["prompt_tokens"]
    return {
        "measurement": "engine",
        "turns_per_episode": len(requests),
        "last_prompt_tokens": prompt_tokens,
        "request_kb_last": round(len(payloads[-1]) / 1024, 1),
        "us_per_turn_median": round(statistics.median(per_turn_us), 1),
        "us_per_turn_p90": round(statistics.quantiles(per_turn_us, n=10)[-1], 1),
    }


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


async def _conversation(session: aiohttp.ClientSession, fake, index: int, turns: int, body: dict) -> None:
    body = body | {"user": tau2_key(DOMAIN, TASK_ID, index, "policy")}  # one episode per conversation
    tokenize_body = {k: body[k] for k in ("model", "messages", "tools")}
    for _ in range(turns):  # the same request again: turn selection is retry-stable, so each is turn 0
        async with session.post(f"{fake.base_url}/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            await r.read()
        async with session.post(f"{fake.root_url}/tokenize", json=tokenize_body) as r:
            assert r.status == 200, await r.text()
            await r.read()


async def bench_http(conversations: int, turns: int, latency_ms: float, token_ids_in_completions: str) -> dict:
    engine = FakeEngine(FakeServerConfig())
    body = policy_requests(engine)[4]  # mid-episode: system prompt, tools and some history
    config = FakeServerConfig(
        latency_ms=latency_ms, preload_domains=[DOMAIN], token_ids_in_completions=token_ids_in_completions
    )
    with start_fake_server(config, mode="subprocess") as fake:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
            cpu_before, start = _cpu_seconds(fake.pid), time.perf_counter()
            await asyncio.gather(*(_conversation(session, fake, i, turns, body) for i in range(conversations)))
            wall, cpu = time.perf_counter() - start, _cpu_seconds(fake.pid) - cpu_before
        stats = fake.stats()
    total_turns = conversations * turns
    assert stats.requests_by_route["chat"] == total_turns
    return {
        "measurement": "http",
        "latency_ms": latency_ms,
        "token_ids_in_completions": token_ids_in_completions,
        "conversations": conversations,
        "turns": total_turns,
        "turns_per_s": round(total_turns / wall, 1),
        "server_cpu_us_per_turn": round(cpu / total_turns * 1e6, 1),
        "request_kb": round(len(orjson.dumps(body)) / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--turns", type=int, default=5)
    args = parser.parse_args()
    results = [bench_engine(args.repeats)]
    print(json.dumps(results[-1]))
    for latency_ms, token_ids in ((0.0, "always"), (50.0, "always"), (0.0, "when_requested")):
        results.append(asyncio.run(bench_http(args.conversations, args.turns, latency_ms, token_ids)))
        print(json.dumps(results[-1]))
    http = {f"{r['latency_ms']:g}ms/{r['token_ids_in_completions']}": r for r in results[1:]}
    summary = {
        "bench": "fake_server",
        "engine_us_per_turn_median": results[0]["us_per_turn_median"],
        "http_server_cpu_us_per_turn": {name: r["server_cpu_us_per_turn"] for name, r in http.items()},
        "http_turns_per_s": {name: r["turns_per_s"] for name, r in http.items()},
        "conversations": args.conversations,
        "prompt_tokens": results[0]["last_prompt_tokens"],
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
