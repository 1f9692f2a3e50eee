"""Episode throughput and per-turn orchestration overhead: our agent stack against tau2's own orchestrator.

Both sides play the same episodes (oracle policy + scripted user from the fake model server, which runs in its own
process, answers after 0 ms or 50 ms and, like vLLM >= 0.10.2, returns prompt token ids only when asked): ours
through the agent server (policy via a Gym model server with token ids, as training runs it; user via its own
model server; tools and reward on the resources server), once per model server kind (our fast_vllm_model, the
default, and NeMo-Gym's vllm_model, which NeMo-RL runs); tau2's through ``run_task`` (litellm to the same fake; tau2
runs concurrent episodes on threads, as ``tau2 run --max-concurrency`` does; its reward is computed inside
``run_task``, ours in ``/verify``).

Overhead per model call, at concurrency 1: wall = (episode wall time - latency x model calls) / model calls, and
the CPU time each process spent per model call (``/proc/<pid>/stat``): the agent + resources server, the two model
servers (policy + user), and the fake model itself.

    uv run bench/rollout_speed.py [--concurrency 1,16,64,256] [--latencies 0,50] [--tau2-concurrency 1,64]
        [--model-servers fast_vllm_model,vllm_model]
"""

import argparse
import asyncio
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)

# isort: split
import aiohttp
import orjson
from tau2.run import run_task

from nemo_tau2.gym.launch import GymServers
from nemo_tau2.gym.stack import AGENT, POLICY_MODEL, RESOURCES_SERVER, USER_MODEL, ModelEndpoint, tau2_stack
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.gym_rows import task_row
from nemo_tau2.testing import start_fake_server, tau2_key

DOMAINS = ("airline", "retail", "telecom")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
JSON = {"Content-Type": "application/json"}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (and its reaped children) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / CLOCK_TICKS


def episode_tasks(count: int) -> list[tuple[str, str]]:
    pool = [(domain, task.id) for domain in DOMAINS for task in domains.get_tasks(domain, "test")]
    return [pool[i % len(pool)] for i in range(count)]


async def run_ours(agent_url: str, jobs: list[tuple[str, str]], concurrency: int) -> dict:
    gate = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency + 8)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=1800)) as http:

        async def one(index: int, domain: str, task_id: str) -> dict:
            async with gate:
                row = task_row(domain, task_id) | {"sample_index": index}
                # orjson both ways, as run_async_nemo_gym_rollout does (an answer with token ids is megabytes)
                async with http.post(f"{agent_url}/run", data=orjson.dumps(row), headers=JSON) as response:
                    return orjson.loads(await response.read())

        started = time.perf_counter()
        results = await asyncio.gather(*(one(i, *job) for i, job in enumerate(jobs)))
        wall = time.perf_counter() - started
    bad = [r for r in results if r.get("status") != "ok" or r.get("reward") != 1.0]
    assert not bad, bad[0].get("error") or bad[0].get("termination_reason")
    calls = sum(r["num_turns"] + r["num_user_turns"] for r in results)
    return {
        "episodes": len(results),
        "wall_s": round(wall, 3),
        "episodes_per_s": round(len(results) / wall, 2),
        "model_calls": calls,
    }


def run_tau2(fake_url: str, jobs: list[tuple[str, str]], concurrency: int) -> dict:
    def one(index: int, domain: str, task_id: str) -> float:
        key = f"tau2bench{index}"
        common = {"api_base": fake_url, "api_key": "EMPTY", "temperature": 0.0}  # litellm drops a plain `user`
        simulation = run_task(
            domain=domain,
            task=domains.get_task(domain, task_id),
            agent="llm_agent",
            user="user_simulator",
            llm_agent="openai/fake-policy",
            llm_args_agent=common | {"extra_body": {"user": tau2_key(domain, task_id, key, "policy")}},
            llm_user="openai/fake-user",
            llm_args_user=common | {"extra_body": {"user": tau2_key(domain, task_id, key, "user")}},
            max_steps=200,
            max_errors=10,
        )
        return simulation.reward_info.reward

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        rewards = list(pool.map(lambda job: one(*job), [(i, *job) for i, job in enumerate(jobs)]))
    wall = time.perf_counter() - started
    assert all(reward == 1.0 for reward in rewards), rewards
    return {"episodes": len(jobs), "wall_s": round(wall, 3), "episodes_per_s": round(len(jobs) / wall, 2)}


def run_our_levels(fake, kind: str, levels: list[int], latencies: list[float], episodes_at_1: int) -> dict:
    """Our stack with ``kind`` model servers at every latency and concurrency level."""
    specs = tau2_stack(
        ModelEndpoint([fake.base_url], "fake-policy", server=kind, return_token_ids=True),
        ModelEndpoint([fake.base_url], "fake-user", server=kind),
        list(DOMAINS),
    )
    results = {}
    with GymServers(specs) as servers:
        agent_url = servers.url(AGENT)
        groups = {
            "agent+resources": [servers.pid(AGENT), servers.pid(RESOURCES_SERVER)],
            "model_servers": [servers.pid(POLICY_MODEL), servers.pid(USER_MODEL)],
            "fake_model": [fake.pid],
        }
        asyncio.run(run_ours(agent_url, episode_tasks(6), 6))  # warm-up: imports, caches, connections
        for latency in latencies:
            fake.set_latency(latency)
            for level in levels:
                jobs = episode_tasks(episodes_at_1 if level == 1 else max(2 * level, 64))
                before = {name: sum(cpu_seconds(pid) for pid in pids) for name, pids in groups.items()}
                figures = asyncio.run(run_ours(agent_url, jobs, level))
                calls = figures["model_calls"]
                for name, pids in groups.items():
                    spent = sum(cpu_seconds(pid) for pid in pids) - before[name]
                    figures[f"cpu_ms_per_model_call/{name}"] = round(spent / calls * 1000, 3)
                if level == 1:
                    busy = figures["wall_s"] - latency / 1000 * calls
                    figures["overhead_wall_ms_per_model_call"] = round(busy / calls * 1000, 3)
                results[f"{latency:g}ms/c{level}"] = figures
                print(f"{kind}  latency {latency:>3g} ms  concurrency {level:>3}: {figures}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,16,64,256")
    parser.add_argument("--latencies", default="0,50", help="fake model latency per call, ms")
    parser.add_argument("--tau2-concurrency", default="1,64")
    parser.add_argument("--episodes-at-1", type=int, default=12)
    parser.add_argument("--model-servers", default="fast_vllm_model,vllm_model", help="the first one is 'ours'")
    args = parser.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    latencies = [float(x) for x in args.latencies.split(",")]
    tau2_levels = [int(x) for x in args.tau2_concurrency.split(",") if x]

    kinds = args.model_servers.split(",")
    results: dict = {kind: {} for kind in kinds} | {"tau2": {}}
    fake_config = {"preload_domains": list(DOMAINS), "token_ids_in_completions": "when_requested"}
    with start_fake_server(mode="subprocess", **fake_config) as fake:
        for kind in kinds:
            results[kind] = run_our_levels(fake, kind, levels, latencies, args.episodes_at_1)
        for latency in latencies:
            fake.set_latency(latency)
            for level in tau2_levels:
                jobs = episode_tasks(args.episodes_at_1 if level == 1 else max(2 * level, 64))
                figures = run_tau2(fake.base_url, jobs, level)
                results["tau2"][f"{latency:g}ms/c{level}"] = figures
                print(f"tau2  latency {latency:>3g} ms  concurrency {level:>3}: {figures}", flush=True)

    ratios = {
        kind: {
            key: round(results[kind][key]["episodes_per_s"] / results["tau2"][key]["episodes_per_s"], 1)
            for key in results["tau2"]
            if key in results[kind]
        }
        for kind in kinds
    }
    summary = {"benchmark": "rollout_speed", "ours": kinds[0], "results": results}
    print(json.dumps(summary | {"over_tau2_episodes_per_s": ratios}))


if __name__ == "__main__":
    main()
