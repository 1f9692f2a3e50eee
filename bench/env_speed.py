"""Resources-server speed and memory against tau2's own gym environment and evaluator, in one run.

Per domain, on the first tasks of the test split:
- ours, over real HTTP on 127.0.0.1: /seed_session latency, tool-call latency (the task's gold calls),
  /verify latency (after replaying the gold calls), and resident memory per idle session (server RSS growth
  over many seeded, untouched sessions divided by their number);
- tau2's: ``AgentGymEnv.reset`` and ``.step`` (one gold tool call per step; the user simulator answers with
  litellm's offline ``mock_response``) and ``evaluate_simulation(..., ALL)`` on the same gold trajectory.

Then, with a tau2 v1.0.1 environment (``$NEMO_TAU2_TAU2_V1_PYTHON``; ``--no-v1`` skips it), the same server on
``tau2.version=v1.0.1`` over HTTP (its episode and scoring workers), per domain on the first test tasks the judge
does not grade: seed, tool call and verify (without the judge) beside v0.2.1's, and the judge's added latency per
NL task (verify of the domain's NL tasks minus the median verify without the judge; the scripted judge on 127.0.0.1).
Every verify is its task's first. As a run uses it (``tau2.warm_gold``, on): the seed has the scoring worker hash the
task's gold DB in a forked child while the episode is played; the first tool call comes ``--think-s`` after the seed
and the verify ``--think-s`` after the last call (untimed; they stand for the episode's first and last LLM turns,
seconds each in a run; v0.2.1 is measured with the same pauses for these ratios, as a process woken from a pause on
a busy box answers later). Cold: a second server with ``tau2.warm_gold=false`` plays the same tasks with no pause,
so each verify hashes the gold DB itself, beside v0.2.1 with no pause.

    uv run bench/env_speed.py [--tasks 5] [--idle-sessions 300] [--think-s 1.0] [--no-v1]

Prints a table, then a last line of JSON with both sides and the ratios (tau2 time / ours; v1.0.1 / v0.2.1).
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
from nemo_tau2.tau2_release.client import Tau2Worker, release_python
from nemo_tau2.tau2_release.config import NLJudgeConfig, Tau2ReleaseConfig
from nemo_tau2.tau2_release.trajectory import Trajectory
from nemo_tau2.testing.scripted_judge import ScriptedJudge

DOMAINS = ("airline", "retail", "telecom")
SERVER = "tau2_resources_server"
SERVER_CLASS = "nemo_tau2.gym.resources_server.app:Tau2ResourcesServer"
TOOL_ERROR = "X-Tau2-Tool-Error"


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


def gold_play(task) -> dict:
    """A v0.2.1 task (tau2's ``Task``) or a v1.0.1 one (its JSON) as the gold calls and closing message to play."""
    criteria = task["evaluation_criteria"] if isinstance(task, dict) else task.evaluation_criteria.model_dump()
    actions = [{"requestor": "assistant"} | action for action in criteria.get("actions") or []]
    text = " ".join(criteria.get("communicate_info") or []) or "done"
    return {"id": task["id"] if isinstance(task, dict) else task.id, "actions": actions, "closing": text}


async def _measure_ours(
    url: str, domain: str, tasks, with_trajectory: bool = False, think_s: float = 0.0
) -> tuple[list, list, list]:
    """As the agent server calls it: one pooled keep-alive aiohttp client, each episode's cookie passed along
    (``with_trajectory``: the verify carries tau2's message list, as the agent sends it for v1.0.1; ``think_s``:
    untimed pause after the seed and before the verify, the episode's first and last LLM turns)."""
    seeds, calls, verifies = [], [], []
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        for _ in range(20):  # warm the connection pool
            async with http.get(f"{url}/") as response:
                await response.read()
        for task in map(gold_play, tasks):
            seed = {"domain": domain, "task_id": task["id"]}
            elapsed, _, cookies = await _post(http, f"{url}/seed_session", seed, None)
            seeds.append(elapsed)
            await asyncio.sleep(think_s)
            trajectory = Trajectory()
            trajectory.text("assistant", prompts.greeting())
            trajectory.text("user", "Hello.")
            for index, action in enumerate(task["actions"]):
                name, requestor, arguments = action["name"], action["requestor"], action["arguments"]
                route = f"/{name}" if requestor == "assistant" else f"/user_tools/{name}"
                start = time.perf_counter()
                async with http.post(url + route, json=arguments, cookies=cookies) as response:
                    response.raise_for_status()
                    answer = {"content": await response.text(), "error": response.headers[TOOL_ERROR] == "1"}
                calls.append(time.perf_counter() - start)
                trajectory.tool_call(requestor, f"c{index}", name, arguments, answer)
            trajectory.text("assistant", task["closing"])
            trajectory.text("user", "###STOP###")
            body = verify_body([task["closing"]])
            await asyncio.sleep(think_s)
            if with_trajectory:
                body["tau2_messages"] = trajectory.messages
            elapsed, text, _ = await _post(http, f"{url}/verify", body, cookies)
            verifies.append(elapsed)
            assert json.loads(text)["reward"] == 1.0, (domain, task["id"], text[:300])
    return seeds, calls, verifies


def measure_ours(url: str, domain: str, tasks, with_trajectory: bool = False, think_s: float = 0.0) -> dict:
    seeds, calls, verifies = asyncio.run(_measure_ours(url, domain, tasks, with_trajectory, think_s))
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


def _needs_judge(task: dict) -> bool:
    criteria = task.get("evaluation_criteria") or {}
    return "NL_ASSERTION" in (criteria.get("reward_basis") or []) and bool(criteria.get("nl_assertions"))


def measure_v101(num_tasks: int, think_s: float) -> dict:
    """The resources server on v1.0.1 over HTTP, per domain: plain tasks (no judge), then the judged ones; gold
    side warmed on seed (a run's setting), then cold (``warm_gold=false``) on a server of its own."""
    judge = ScriptedJudge()
    release = Tau2ReleaseConfig(version="v1.0.1", judge=NLJudgeConfig(model="scripted-judge", base_url=judge.base_url))
    release_python(release)  # one-line error naming the build command when there is no v1.0.1 environment
    with Tau2Worker(release) as worker:
        tasks = {domain: worker.request("tasks", domain=domain, split="test") for domain in DOMAINS}
    results: dict = {domain: {} for domain in DOMAINS}
    try:
        for warm in (True, False):
            tau2 = release.model_copy(update={"warm_gold": warm}).model_dump(mode="json")
            config = {"domain": "agent", "domains": list(DOMAINS), "tau2": tau2}
            with GymServers([ServerSpec(SERVER, "resources_servers", "tau2", SERVER_CLASS, config)]) as servers:
                for domain in DOMAINS:
                    plain = [task for task in tasks[domain] if not _needs_judge(task)][:num_tasks]
                    if not warm:
                        cold = measure_ours(servers.url(SERVER), domain, plain, with_trajectory=True)
                        results[domain]["cold"] = cold
                        continue
                    results[domain] |= measure_ours(servers.url(SERVER), domain, plain, True, think_s)
                    judged = [task for task in tasks[domain] if _needs_judge(task)][:num_tasks]
                    if judged:
                        nl = measure_ours(servers.url(SERVER), domain, judged, True, think_s)
                        results[domain]["judge_added_ms"] = round(nl["verify_ms"] - results[domain]["verify_ms"], 3)
    finally:
        judge.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=5, help="tasks per domain (test split order)")
    parser.add_argument("--idle-sessions", type=int, default=300)
    parser.add_argument("--no-v1", action="store_true", help="skip tau2 v1.0.1 (needs its environment)")
    parser.add_argument(
        "--think-s", type=float, default=1.0, help="v1.0.1: untimed pause after each seed and before each verify"
    )
    args = parser.parse_args()

    spec = ServerSpec(SERVER, "resources_servers", "tau2", SERVER_CLASS, {"domain": "agent", "domains": list(DOMAINS)})
    results: dict = {}
    with GymServers([spec]) as servers:
        url, pid = servers.url(SERVER), servers.pid(SERVER)
        for domain in DOMAINS:
            tasks = domains.get_tasks(domain, "test")[: args.tasks]
            ours = measure_ours(url, domain, tasks)
            if not args.no_v1:  # v1.0.1's warmed server is measured with pauses: this side too, the same pauses
                results[domain] = {"ours_paused": measure_ours(url, domain, tasks, think_s=args.think_s)}
            ours["idle_session_mb"] = measure_idle_memory(url, pid, domain, tasks[0].id, args.idle_sessions)
            results[domain] = results.get(domain, {}) | {"ours": ours}
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
    if not args.no_v1:
        if args.think_s < 0:
            parser.error(f"--think-s must be >= 0, not {args.think_s}")
        v101 = measure_v101(args.tasks, args.think_s)
        print(f"{'domain':8} {'op':19} {'v0.2.1 ms':>10} {'v1.0.1 ms':>10} {'ratio':>7}   (over HTTP)")
        for domain in DOMAINS:
            ours, paused, cold = results[domain]["ours"], results[domain]["ours_paused"], v101[domain]["cold"]
            pairs = {f"{op} warmed": (paused[op], v101[domain][op]) for op in ("seed_ms", "tool_call_ms", "verify_ms")}
            pairs |= {f"{op} cold": (ours[op], cold[op]) for op in ("seed_ms", "tool_call_ms", "verify_ms")}
            ratio = {name: round(theirs / mine, 2) for name, (mine, theirs) in pairs.items()}
            results[domain] |= {"v1.0.1": v101[domain], "ratio_v101_over_v021": ratio}
            for name, (mine, theirs) in pairs.items():
                print(f"{domain:8} {name:19} {mine:10.2f} {theirs:10.2f} {ratio[name]:7.2f}")
            if "judge_added_ms" in v101[domain]:
                print(f"{domain:8} {'judge_added_ms':19} {'':>10} {v101[domain]['judge_added_ms']:10.2f}")
    print(
        json.dumps(
            {"benchmark": "env_speed", "tasks_per_domain": args.tasks, "think_s": args.think_s, "results": results}
        )
    )


if __name__ == "__main__":
    main()
