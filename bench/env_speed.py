"""Resources-server speed and memory against tau2's own gym environment and evaluator, in one run.

Per domain, on the first tasks of the test split:
- ours, over real HTTP on 127.0.0.1: /seed_session latency, tool-call latency (the task's gold calls),
  /verify latency (after replaying the gold calls), and resident memory per idle session (server RSS growth
  over many seeded, untouched sessions divided by their number);
- tau2's: ``AgentGymEnv.reset`` and ``.step`` (one gold tool call per step; the user simulator answers with
  litellm's offline ``mock_response``) and ``evaluate_simulation(..., ALL)`` on the same gold trajectory.

    uv run bench/env_speed.py [--tasks 5] [--idle-sessions 300]

Prints a table, then a last line of JSON with both sides and the ratios (tau2 time / ours).
"""

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)

# isort: split
import aiohttp
import requests
from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage, UserMessage
from tau2.data_model.simulation import SimulationRun
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
from tau2.gym.gym_agent import AgentGymEnv

from nemo_tau2.gym.launch import GymServers, ServerSpec
from nemo_tau2.gym.resources_server.bodies import verify_body
from nemo_tau2.tau2_env import domains, prompts

DOMAINS = ("airline", "retail", "telecom")
SERVER = "tau2_resources_server"


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def _post(http: aiohttp.ClientSession, url: str, body, cookies) -> tuple[float, str, dict]:
    start = time.perf_counter()
    async with http.post(url, json=body, cookies=cookies) as response:
        response.raise_for_status()
        text = await response.text()
        cookies = {key: morsel.value for key, morsel in response.cookies.items()} or cookies
    return time.perf_counter() - start, text, cookies


async def _measure_ours(url: str, domain: str, tasks) -> tuple[list, list, list]:
    """As the agent server calls it: one pooled keep-alive aiohttp client, each episode's cookie passed along."""
    seeds, calls, verifies = [], [], []
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        for _ in range(20):  # warm the connection pool
            async with http.get(f"{url}/") as response:
                await response.read()
        for task in tasks:
            seed = {"domain": domain, "task_id": task.id}
            elapsed, _, cookies = await _post(http, f"{url}/seed_session", seed, None)
            seeds.append(elapsed)
            for action in task.evaluation_criteria.actions or []:
                route = f"/{action.name}" if action.requestor == "assistant" else f"/user_tools/{action.name}"
                elapsed, _, cookies = await _post(http, url + route, action.arguments, cookies)
                calls.append(elapsed)
            texts = [" ".join(task.evaluation_criteria.communicate_info or []) or "done"]
            elapsed, text, _ = await _post(http, f"{url}/verify", verify_body(texts), cookies)
            verifies.append(elapsed)
            assert json.loads(text)["reward"] == 1.0, (domain, task.id, text[:300])
    return seeds, calls, verifies


def measure_ours(url: str, domain: str, tasks) -> dict:
    seeds, calls, verifies = asyncio.run(_measure_ours(url, domain, tasks))
    return {
        "seed_ms": _ms(statistics.median(seeds)),
        "tool_call_ms": _ms(statistics.median(calls)),
        "verify_ms": _ms(statistics.median(verifies)),
        "verify_max_ms": _ms(max(verifies)),
    }


def measure_idle_memory(url: str, pid: int, domain: str, task_id: str, sessions: int) -> float:
    keep = []
    for _ in range(20):  # warm caches first so they do not count as per-session memory
        warm = requests.Session()
        warm.post(f"{url}/seed_session", json={"domain": domain, "task_id": task_id}).raise_for_status()
        keep.append(warm)
    before = _rss_kb(pid)
    for _ in range(sessions):
        http = requests.Session()
        http.post(f"{url}/seed_session", json={"domain": domain, "task_id": task_id}).raise_for_status()
        keep.append(http)
    return round((_rss_kb(pid) - before) / sessions / 1024, 4)


def gold_trajectory(domain: str, task) -> list:
    """The gold calls as tau2 messages, with tau2's own tool outputs (what a perfect agent's trajectory holds)."""
    messages = [AssistantMessage(role="assistant", content=prompts.greeting())]
    env = domains.environment_constructor(domain)()
    env.set_state(
        task.initial_state.initialization_data if task.initial_state else None,
        task.initial_state.initialization_actions if task.initial_state else None,
        [],
    )
    for index, action in enumerate(task.evaluation_criteria.actions or []):
        call = ToolCall(id=f"c{index}", name=action.name, arguments=action.arguments, requestor=action.requestor)
        sender = AssistantMessage if action.requestor == "assistant" else UserMessage
        result: ToolMessage = env.get_response(call)
        messages += [sender(role=action.requestor, tool_calls=[call]), result]
    messages.append(
        AssistantMessage(role="assistant", content=" ".join(task.evaluation_criteria.communicate_info or []) or "done")
    )
    messages.append(UserMessage(role="user", content="###STOP###"))
    return messages


def measure_tau2(domain: str, tasks) -> dict:
    resets, steps, evaluations = [], [], []
    for task in tasks:
        env = AgentGymEnv(
            domain=domain,
            task_id=task.id,
            user_llm="gpt-4.1",
            user_llm_args={"mock_response": "Hi, I need help with my account."},
        )
        start = time.perf_counter()
        env.reset()
        resets.append(time.perf_counter() - start)
        for action in [a for a in task.evaluation_criteria.actions or [] if a.requestor == "assistant"][:3]:
            start = time.perf_counter()
            env.step(json.dumps({"name": action.name, "arguments": action.arguments}))
            steps.append(time.perf_counter() - start)
        simulation = SimulationRun(
            id="b",
            task_id=task.id,
            start_time="",
            end_time="",
            duration=0.0,
            termination_reason="user_stop",
            messages=gold_trajectory(domain, task),
        )
        start = time.perf_counter()
        reward = evaluate_simulation(simulation, task, EvaluationType.ALL, solo_mode=False, domain=domain).reward
        evaluations.append(time.perf_counter() - start)
        assert reward == 1.0, (domain, task.id)
    return {
        "reset_ms": _ms(statistics.median(resets)),
        "step_ms": _ms(statistics.median(steps)) if steps else None,
        "evaluate_ms": _ms(statistics.median(evaluations)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=5, help="tasks per domain (test split order)")
    parser.add_argument("--idle-sessions", type=int, default=300)
    args = parser.parse_args()

    spec = ServerSpec(
        SERVER,
        "resources_servers",
        "tau2",
        "nemo_tau2.gym.resources_server.app:Tau2ResourcesServer",
        {"domain": "agent", "domains": list(DOMAINS)},
    )
    results: dict = {}
    with GymServers([spec]) as servers:
        url, pid = servers.url(SERVER), servers.pid(SERVER)
        for domain in DOMAINS:
            tasks = domains.get_tasks(domain, "test")[: args.tasks]
            ours = measure_ours(url, domain, tasks)
            ours["idle_session_mb"] = measure_idle_memory(url, pid, domain, tasks[0].id, args.idle_sessions)
            results[domain] = {"ours": ours}
    for domain in DOMAINS:
        tau2 = measure_tau2(domain, domains.get_tasks(domain, "test")[: args.tasks])
        ours = results[domain]["ours"]
        results[domain]["tau2"] = tau2
        results[domain]["ratio"] = {
            "seed_vs_reset": round(tau2["reset_ms"] / ours["seed_ms"], 1),
            "tool_call_vs_step": round(tau2["step_ms"] / ours["tool_call_ms"], 1) if tau2["step_ms"] else None,
            "verify_vs_evaluate": round(tau2["evaluate_ms"] / ours["verify_ms"], 1),
        }

    print(
        f"{'domain':8} {'seed ms':>9} {'call ms':>8} {'verify ms':>10} {'MB/idle':>8} | "
        f"{'tau2 reset':>10} {'step':>8} {'evaluate':>9}"
    )
    for domain, r in results.items():
        o, t = r["ours"], r["tau2"]
        print(
            f"{domain:8} {o['seed_ms']:9.2f} {o['tool_call_ms']:8.2f} {o['verify_ms']:10.2f} "
            f"{o['idle_session_mb']:8.3f} | {t['reset_ms']:10.1f} {t['step_ms'] or 0:8.1f} {t['evaluate_ms']:9.1f}"
        )
    print(json.dumps({"benchmark": "env_speed", "tasks_per_domain": args.tasks, "results": results}))


if __name__ == "__main__":
    main()
