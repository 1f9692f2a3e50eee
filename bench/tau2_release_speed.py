"""Per-step cost of tau2 v1.0.1 (through nemo-tau2's worker) beside v0.2.1 (in process), in one run.

Per domain, on the first tasks of the test split the judge does not grade (verify without the judge), each
release plays the task's gold calls as the resources server would: seed an episode, run every gold call, verify.
v0.2.1 is the project's in-process path (``Episode.start``, ``Episode.call_tool``, ``evaluate_episode``: the shared
DB snapshot, copy-on-access forks, entry-by-entry DB compare); v1.0.1 is ``Tau2Worker`` (``seed``, ``call_tool``,
``verify`` = tau2 v1.0.1's ``evaluate_simulation``, which rebuilds and replays the environment). Then, with the
scripted judge on 127.0.0.1, the judge's added latency per NL task (verify of an NL task minus the median verify of
the domain's tasks without NL assertions). Last, v1.0.1 plays every plain task a second time (``*_repeat_ms``): its
worker hashes each DB content once (a task's gold DB on the task's first verify), and training sees a task many times.

    NEMO_TAU2_TAU2_V1_PYTHON=... uv run bench/tau2_release_speed.py [--tasks 5]

Prints a table, then a last line of JSON with both sides and the ratios (v1.0.1 time / v0.2.1 time).
"""

import argparse
import json
import statistics
import time

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)

# isort: split
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.episode import Episode
from nemo_tau2.tau2_env.reward import evaluate_episode
from nemo_tau2.tau2_release.client import Tau2Worker, release_python
from nemo_tau2.tau2_release.config import NLJudgeConfig, Tau2ReleaseConfig
from nemo_tau2.tau2_release.trajectory import Trajectory
from nemo_tau2.testing.scripted_judge import ScriptedJudge

DOMAINS = ("airline", "retail", "telecom")


def _ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 3)


def needs_judge(task: dict) -> bool:
    criteria = task["evaluation_criteria"]
    return "NL_ASSERTION" in criteria["reward_basis"] and bool(criteria["nl_assertions"])


def measure_v021(domain: str, task_ids: list[str]) -> dict:
    seeds, calls, verifies = [], [], []
    for task_id in task_ids:
        start = time.perf_counter()
        episode = Episode.start(domain, task_id)
        seeds.append(time.perf_counter() - start)
        task = episode.task
        for action in task.evaluation_criteria.actions or []:
            start = time.perf_counter()
            episode.call_tool(action.name, action.arguments, action.requestor)
            calls.append(time.perf_counter() - start)
        texts = [" ".join(task.evaluation_criteria.communicate_info or []) or "done"]
        start = time.perf_counter()
        reward = evaluate_episode(episode, texts, "user_stop").reward
        verifies.append(time.perf_counter() - start)
        assert reward == 1.0, (domain, task_id)
    return {"seed_ms": _ms(seeds), "tool_call_ms": _ms(calls), "verify_ms": _ms(verifies)}


def play_v101(worker: Tau2Worker, domain: str, task: dict, timings: dict) -> float:
    start = time.perf_counter()
    episode_id = worker.request("seed", domain=domain, task_id=task["id"])["episode_id"]
    timings["seed"].append(time.perf_counter() - start)
    criteria = task["evaluation_criteria"]
    trajectory = Trajectory()
    trajectory.text("assistant", worker.request("greeting"))
    trajectory.text("user", "Hello.")
    for index, action in enumerate(criteria["actions"] or []):
        requestor = action.get("requestor", "assistant")
        start = time.perf_counter()
        answer = worker.request(
            "call_tool", episode_id=episode_id, name=action["name"], arguments=action["arguments"],
            requestor=requestor, call_id=f"c{index}",
        )  # fmt: skip
        timings["tool"].append(time.perf_counter() - start)
        trajectory.tool_call(requestor, f"c{index}", action["name"], action["arguments"], answer)
    trajectory.text("assistant", " ".join(["Done."] + list(criteria["communicate_info"] or [])))
    trajectory.text("user", "###STOP###")
    start = time.perf_counter()
    reward = worker.verify(episode_id, trajectory.messages, "user_stop")["reward"]
    elapsed = time.perf_counter() - start
    assert reward == 1.0, (domain, task["id"])
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5, help="tasks per domain")
    args = parser.parse_args()
    judge = ScriptedJudge()
    config = Tau2ReleaseConfig(version="v1.0.1", judge=NLJudgeConfig(model="scripted-judge", base_url=judge.base_url))
    release_python(config)  # one-line error naming the build command when there is no v1.0.1 environment
    results = {}
    with Tau2Worker(config) as worker:
        for domain in DOMAINS:
            v1_tasks = {task["id"]: task for task in worker.request("tasks", domain=domain, split="test")}
            plain = [t for t in v1_tasks if not needs_judge(v1_tasks[t])]
            chosen = [t for t in plain if t in set(domains.task_splits(domain)["test"])][: args.tasks]
            v021 = measure_v021(domain, chosen)
            timings = {"seed": [], "tool": []}
            verifies = [play_v101(worker, domain, v1_tasks[task_id], timings) for task_id in chosen]
            v101 = {"seed_ms": _ms(timings["seed"]), "tool_call_ms": _ms(timings["tool"]), "verify_ms": _ms(verifies)}
            repeats = {"seed": [], "tool": []}
            verifies = [play_v101(worker, domain, v1_tasks[task_id], repeats) for task_id in chosen]
            v101 |= {"seed_repeat_ms": _ms(repeats["seed"]), "verify_repeat_ms": _ms(verifies)}
            judged = [t for t in v1_tasks if needs_judge(v1_tasks[t])][: args.tasks]
            if judged:
                nl_verifies = [play_v101(worker, domain, v1_tasks[t], {"seed": [], "tool": []}) for t in judged]
                v101["judge_added_ms"] = round(_ms(nl_verifies) - v101["verify_ms"], 3)
            ratios = {key: round(v101[key] / v021[key], 2) for key in v021 if v021[key]}
            for op in ("seed", "verify"):
                ratios[f"{op}_repeat_ms"] = round(v101[f"{op}_repeat_ms"] / v021[f"{op}_ms"], 2)
            results[domain] = {"tasks": chosen, "v0.2.1": v021, "v1.0.1": v101, "ratio_v101_over_v021": ratios}
    judge.close()
    print(f"{'domain':<9}{'op':<17}{'v0.2.1 ms':>12}{'v1.0.1 ms':>12}{'ratio':>8}")
    for domain, result in results.items():
        for op in ("seed_ms", "tool_call_ms", "verify_ms", "seed_repeat_ms", "verify_repeat_ms"):
            ratio = result["ratio_v101_over_v021"].get(op, float("nan"))
            reference = result["v0.2.1"][op.replace("_repeat", "")]
            print(f"{domain:<9}{op:<17}{reference:>12}{result['v1.0.1'][op]:>12}{ratio:>8}")
        if "judge_added_ms" in result["v1.0.1"]:
            print(f"{domain:<9}{'judge_added':<17}{'':>12}{result['v1.0.1']['judge_added_ms']:>12}")
    print(json.dumps({"benchmark": "tau2_release_speed", "tasks_per_domain": args.tasks, "results": results}))


if __name__ == "__main__":
    main()
