"""Pivots on tau2 v0.2.1: forks against replays, functional verdicts over HTTP, profiling, and NeMo-Gym's verifier.

Pivots are cut from tau2's gold demonstrations (every base task of ``--domains``: each demonstrated call, in the state
the demonstration reached; :mod:`nemo_tau2.pivots.gold`). Four measurements:

1. **Fork vs replay.** A pivot's state forked (``Episode.fork``: copy-on-write over the parent) against rebuilt by
   replaying its prefix from the task's start (what every other tau2 stack must do to start mid-episode).
2. **Verdicts over HTTP.** ``/verify_pivot`` of a real resources server at ``--concurrency`` requests in flight: each
   pivot's demonstrated call and its argument mutations (states warm: each pivot's state rebuilt once before, in
   chunks of the states the server keeps).
3. **Profiling.** ``--candidates`` candidates x ``--samples`` samples (``profile_pivots.py``'s code) against a scripted
   OpenAI-compatible endpoint (0 ms) answering, in turn, the demonstrated call, a mutated one, the call worded
   otherwise (an integer argument as a float: the same call to tau2), and text.
4. **NeMo-Gym 0.7.0's argument-comparison verifier** on the same samples, in its own environment (``--nemo-gym``
   python; default: the set-up's 0.7.0 env): CPU-s per sample, and agreement with ours, with examples of each
   disagreement.

The last line printed is JSON.

    uv run bench/pivots.py [--candidates 1000] [--samples 8] [--concurrency 64] [--domains airline retail telecom]
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)
from nemo_tau2.gym.launch import GymServers
from nemo_tau2.gym.resources_server.pivot_verify import MAX_PIVOT_STATES
from nemo_tau2.gym.resources_server.rescoring import replay
from nemo_tau2.gym.stack import RESOURCES_SERVER, resources_server_spec
from nemo_tau2.pivots.candidates import pivot_rows
from nemo_tau2.pivots.gold import gold_trajectory
from nemo_tau2.pivots.profile import Endpoint, Profiler, ProfileSettings, profile_pivots
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.gym_rows import task_row
from nemo_tau2.testing.scheduled_chat import ScheduledChat, prompt_key

HERE = Path(__file__).resolve().parent
FORK_TARGET_MS, VERDICT_TARGET_MS = 2.0, 5.0  # issue 56: + what the prefix touched; per sample at 64 concurrent


def gold_pivots(names: list[str]) -> list[dict]:
    pivots = []
    for domain in names:
        for task_id in domains.task_splits(domain)["base"]:
            rows, _ = pivot_rows(gold_trajectory(domain, task_id), task_row(domain, task_id))
            pivots += [row for row in rows if row["expected_action"]["type"] == "function_call"]
    return pivots


def mutated(arguments: dict, pool: dict[str, list]) -> dict | None:
    """The arguments with one value changed (another value of that argument from the gold, a number + 1)."""
    for key, value in arguments.items():
        if isinstance(value, bool):
            return arguments | {key: not value}
        if isinstance(value, int | float):
            return arguments | {key: value + 1}
        other = next((candidate for candidate in pool.get(key, []) if candidate != value), None)
        if other is not None:
            return arguments | {key: other}
    return None


def reworded(arguments: dict) -> dict | None:
    """The same call worded otherwise: an integer argument written as a float (tau2's tools read both alike)."""
    for key, value in arguments.items():
        if isinstance(value, int) and not isinstance(value, bool):
            return arguments | {key: float(value)}
    return None


def value_pool(pivots: list[dict]) -> dict[str, list]:
    pool: dict[str, list] = {}
    for pivot in pivots:
        for key, value in json.loads(pivot["expected_action"]["arguments"]).items():
            if isinstance(value, str) and value not in pool.setdefault(key, []):
                pool[key].append(value)
    return pool


def answers_for(pivot: dict, pool: dict) -> list[dict]:
    """The scripted policy's answers at a pivot, served in turn: right, mutated, reworded, text."""
    name, arguments = pivot["expected_action"]["name"], json.loads(pivot["expected_action"]["arguments"])
    variants = [arguments, mutated(arguments, pool), reworded(arguments)]
    calls = [{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": name, "arguments": json.dumps(v)}}]} for v in variants if v is not None]  # fmt: skip
    return calls + [{"role": "assistant", "content": "Let me look into that for you."}]


def fork_vs_replay(pivots: list[dict]) -> dict:
    fork_ms, replay_ms = [], []
    for pivot in pivots:
        started = time.perf_counter()
        parent = replay(pivot["domain"], pivot["task_id"], pivot["tau2_messages"])
        replay_ms.append(1000 * (time.perf_counter() - started))
        started = time.perf_counter()
        parent.fork(1)
        fork_ms.append(1000 * (time.perf_counter() - started))
    return {"pivots": len(pivots), "fork_ms_p50": statistics.median(fork_ms),
            "fork_ms_p95": statistics.quantiles(fork_ms, n=20)[-1], "replay_ms_p50": statistics.median(replay_ms),
            "replay_ms_p95": statistics.quantiles(replay_ms, n=20)[-1],
            "replay_over_fork": statistics.median(replay_ms) / statistics.median(fork_ms)}  # fmt: skip


def verify_body(pivot: dict, arguments: dict) -> dict:
    output = [{"type": "function_call", "name": pivot["expected_action"]["name"], "call_id": "c", "id": "c",
               "arguments": json.dumps(arguments)}]  # fmt: skip
    return pivot | {"response": {"id": "r", "created_at": 0, "model": "m", "object": "response", "output": output,
                                 "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}}  # fmt: skip


async def verdicts_over_http(url: str, server_pid: int, pivots: list[dict], pool: dict, concurrency: int) -> dict:
    """Each pivot's demonstrated call and its mutation, states warm: the pivots go in chunks the server keeps
    (``MAX_PIVOT_STATES``), each chunk's states rebuilt by a warm-up pass before its timed pass. (One pass over all
    824 would rebuild every state again: the least recently used are dropped first.)"""
    gate, latencies, timed = asyncio.Semaphore(concurrency), [], []
    server = psutil.Process(server_pid)
    wall = server_cpu = 0.0
    samples = rebuilt_while_timed = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as http:

        async def post(body: dict) -> None:
            async with gate:
                started = time.perf_counter()
                async with http.post(f"{url}/verify_pivot", json=body) as answer:
                    assert answer.status == 200, await answer.text()
                    await answer.read()
                latencies.append(1000 * (time.perf_counter() - started))

        async def rebuilt() -> int:
            async with http.get(f"{url}/pivot_stats") as answer:
                return (await answer.json())["states_rebuilt"]

        for first in range(0, len(pivots), MAX_PIVOT_STATES):
            chunk = pivots[first : first + MAX_PIVOT_STATES]
            bodies = []
            for pivot in chunk:
                arguments = json.loads(pivot["expected_action"]["arguments"])
                bodies += [verify_body(pivot, variant) for variant in (arguments, mutated(arguments, pool)) if variant]
            await asyncio.gather(*(post(verify_body(p, json.loads(p["expected_action"]["arguments"]))) for p in chunk))
            latencies.clear()  # the warm-up: each pivot's state rebuilt once
            before = await rebuilt()
            cpu_before, started = sum(server.cpu_times()[:2]), time.perf_counter()
            await asyncio.gather(*(post(body) for body in bodies))
            wall += time.perf_counter() - started
            server_cpu += sum(server.cpu_times()[:2]) - cpu_before
            rebuilt_while_timed += await rebuilt() - before
            timed += latencies
            samples += len(bodies)
    return {"samples": samples, "concurrency": concurrency, "ms_per_sample": 1000 * wall / samples,
            "latency_ms_p50": statistics.median(timed), "server_cpu_ms_per_sample": 1000 * server_cpu / samples,
            "states_rebuilt_while_timed": rebuilt_while_timed}  # fmt: skip


def profiling(url: str, server_pid: int, candidates: list[dict], pool: dict, samples: int, work: Path) -> dict:
    from nemo_tau2.gym.model_server.conversion import chat_request

    schedules = {}
    for index, pivot in enumerate(candidates):
        pivot["pivot_id"] = f"{pivot['pivot_id']}-{index}"  # candidates beyond the gold pivots: copies, profiled anew
        messages = chat_request(pivot["responses_create_params"], with_token_ids=False)["messages"]
        schedules[prompt_key(messages)] = answers_for(pivot, pool)
    endpoint = ScheduledChat(schedules)
    profiler = Profiler(Endpoint(endpoint.url, "scripted"), url, ProfileSettings(samples=samples, concurrency=64))
    server, me = psutil.Process(server_pid), psutil.Process()
    server_before, me_before = sum(server.cpu_times()[:2]), sum(me.cpu_times()[:2])
    started = time.perf_counter()
    report = asyncio.run(profile_pivots(candidates, profiler, work / "profile.jsonl", work / "kept.jsonl"))
    wall = time.perf_counter() - started
    server_cpu, me_cpu = sum(server.cpu_times()[:2]) - server_before, sum(me.cpu_times()[:2]) - me_before
    endpoint.close()
    n = report.samples_run
    return {"candidates": len(candidates), "samples": n, "wall_s": wall, "samples_per_s": n / wall,
            "verifier_cpu_s_per_sample": server_cpu / n,  # the resources server: HTTP, JSON, fork, run, compare
            "pipeline_cpu_s_per_sample": (server_cpu + me_cpu) / n,  # + the profiler and the scripted endpoint
            "kept": sum(report.kept.values())}  # fmt: skip


def nemo_gym_agreement(python: str, work: Path, pivots: dict[str, dict]) -> dict:
    """Their verdict on every profiled sample, in their environment; agreement with ours and examples."""
    pairs, ours = [], []
    for line in (json.loads(text) for text in (work / "profile.jsonl").read_text().splitlines()):
        for action, reward in zip(line["actions"], line["rewards"], strict=True):
            if action is not None:
                pairs.append({"expected": pivots[line["pivot_id"]]["expected_action"], "actual": action})
                ours.append(reward)
    (work / "pairs.jsonl").write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    done = subprocess.run([python, str(HERE / "nemo_gym_pivot_verdicts.py"), str(work / "pairs.jsonl")],
                          capture_output=True, text=True, check=True)  # fmt: skip
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    confusion = {"both_1": 0, "both_0": 0, "ours_1_theirs_0": 0, "ours_0_theirs_1": 0}
    examples: dict[str, list] = {"ours_1_theirs_0": [], "ours_0_theirs_1": []}
    for pair, mine, (their, category) in zip(pairs, ours, theirs["verdicts"], strict=True):
        key = "both_1" if mine and their else "both_0" if not mine and not their else (
            "ours_1_theirs_0" if mine else "ours_0_theirs_1")  # fmt: skip
        confusion[key] += 1
        if key in examples and len(examples[key]) < 3 and pair not in [e["pair"] for e in examples[key]]:
            examples[key].append({"pair": pair, "their_category": category})
    return {"samples": len(pairs), "agreement": (confusion["both_1"] + confusion["both_0"]) / len(pairs),
            "confusion": confusion, "nemo_gym_cpu_s_per_sample": theirs["cpu_s"] / len(pairs),
            "threshold": theirs["word_count_similarity_threshold"], "examples": examples}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--domains", nargs="+", default=["airline", "retail", "telecom"])
    parser.add_argument("--candidates", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--nemo-gym", default=str(Path.home() / ".cache/nemo-tau2/nemo-gym-0.7.0-py3.13/bin/python"))
    args = parser.parse_args()
    pivots = gold_pivots(args.domains)
    pool = value_pool(pivots)
    print(f"{len(pivots)} gold call pivots in {', '.join(args.domains)}", flush=True)
    result = {"fork_vs_replay": fork_vs_replay(pivots)}
    print(json.dumps(result["fork_vs_replay"]), flush=True)
    spec = resources_server_spec(args.domains)
    work = Path(tempfile.mkdtemp(prefix="pivots_bench_"))
    with GymServers([spec], log_dir=work / "logs") as servers:
        url = servers.url(RESOURCES_SERVER)
        result["verdicts_http"] = asyncio.run(
            verdicts_over_http(url, servers.pid(RESOURCES_SERVER), pivots, pool, args.concurrency)
        )
        print(json.dumps(result["verdicts_http"]), flush=True)
        candidates = [dict(pivots[i % len(pivots)]) for i in range(args.candidates)]
        result["profiling"] = profiling(url, servers.pid(RESOURCES_SERVER), candidates, pool, args.samples, work)
        print(json.dumps(result["profiling"]), flush=True)
    if os.path.exists(args.nemo_gym):
        by_id = {candidate["pivot_id"]: candidate for candidate in candidates}
        result["nemo_gym"] = nemo_gym_agreement(args.nemo_gym, work, by_id)
        print(json.dumps({k: v for k, v in result["nemo_gym"].items() if k != "examples"}), flush=True)
        for kind, found in result["nemo_gym"]["examples"].items():
            for example in found:
                print(f"  {kind}: {json.dumps(example)}")
        result["verifier_cpu_ratio_ours_over_nemo_gym"] = (
            result["profiling"]["verifier_cpu_s_per_sample"] / result["nemo_gym"]["nemo_gym_cpu_s_per_sample"]
        )
    else:
        print(f"NeMo-Gym 0.7.0's python not found at {args.nemo_gym}: its verifier not measured", file=sys.stderr)
    result["targets"] = {"fork_ms": FORK_TARGET_MS, "verdict_ms_per_sample": VERDICT_TARGET_MS}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
