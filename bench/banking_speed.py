"""banking_knowledge per step, nemo-tau2's worker beside tau2 v1.0.1 itself, per retrieval variant, in one run.

For the first ``--tasks`` tasks (those tau2 grades without its NL judge), both sides play the gold episode as the
resources server would: seed, one knowledge read (``KB_search``, or ``shell`` for the shell variant), every gold
call, verify (tau2's ``evaluate_simulation``, which rebuilds and replays three environments). Ours through
``Tau2Worker`` (the resources server's path, minus HTTP); tau2's in its own process (``bench/banking_reference.py``:
its runner's environment, ``get_response``, ``evaluate_simulation``), one side after the other.
Variants: ``bm25_grep`` (the offline default), ``openai_embeddings_grep`` on the fake server's ``/v1/embeddings``
(both sides; tau2's through ``OPENAI_BASE_URL``), ``terminal_use`` (tau2's sandbox with srt, ours confined by
bubblewrap; skipped without ``srt``).

    uv run bench/banking_speed.py [--tasks 8] [--variants terminal_use]  # tau2 v1.0.1: as the tests find it

Prints a table (median ms per step), then a last line of JSON with both sides and the ratios (tau2's / ours).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from nemo_tau2.tau2_release.client import TAU2_V1_PYTHON_ENV, Tau2Worker, release_python
from nemo_tau2.tau2_release.config import EmbeddingsConfig, NLJudgeConfig, Tau2ReleaseConfig
from nemo_tau2.tau2_release.trajectory import Trajectory
from nemo_tau2.testing import start_fake_server
from nemo_tau2.testing.scripted_judge import ScriptedJudge

DOMAIN = "banking_knowledge"
REFERENCE = Path(__file__).with_name("banking_reference.py")
SEARCH = {"name": "KB_search", "arguments": {"query": "overdraft fee waiver"}, "requestor": "assistant"}
VARIANTS = ("bm25_grep", "openai_embeddings_grep", "terminal_use")
SHELL = {"name": "shell", "arguments": {"command": "grep -ril 'overdraft' . | head -5"}, "requestor": "assistant"}
OPS = ("seed", "read", "tool", "verify")


def _ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 2) if values else float("nan")


def play(worker: Tau2Worker, task: dict, reads: list[dict], timings: dict) -> None:
    start = time.perf_counter()
    episode_id = worker.request("seed", domain=DOMAIN, task_id=task["id"])["episode_id"]
    timings["seed"].append(time.perf_counter() - start)
    trajectory = Trajectory()
    trajectory.text("assistant", worker.request("greeting"))
    trajectory.text("user", "Hello.")
    criteria = task["evaluation_criteria"]
    steps = [(read, "read") for read in reads] + [(action, "tool") for action in criteria["actions"] or []]
    for index, (action, kind) in enumerate(steps):
        requestor = action.get("requestor", "assistant")
        start = time.perf_counter()
        answer = worker.request(
            "call_tool", episode_id=episode_id, name=action["name"], arguments=action["arguments"],
            requestor=requestor, call_id=f"c{index}",
        )  # fmt: skip
        timings[kind].append(time.perf_counter() - start)
        trajectory.tool_call(requestor, f"c{index}", action["name"], action["arguments"], answer)
    trajectory.text("assistant", " ".join(["Done.", *(criteria["communicate_info"] or [])]))
    trajectory.text("user", "###STOP###")
    start = time.perf_counter()
    reward = worker.verify(episode_id, trajectory.messages, "user_stop")["reward"]
    timings["verify"].append(time.perf_counter() - start)
    assert reward == 1.0, (task["id"], reward)


def tau2_v1_python() -> str:
    """The interpreter of tau2 v1.0.1's environment: ``$NEMO_TAU2_TAU2_V1_PYTHON``, else what the set-up prints."""
    if os.environ.get(TAU2_V1_PYTHON_ENV):
        return os.environ[TAU2_V1_PYTHON_ENV]
    setup = Path(__file__).resolve().parents[1] / "scripts" / "setup.sh"
    return subprocess.run([str(setup), "tau2-v1"], check=True, capture_output=True, text=True).stdout.split()[-1]


def measure(variant: str, reads: list[dict], task_ids: list[str], judge: ScriptedJudge, **config) -> dict:
    """Both sides of one variant, one after the other (each alone on the machine); median ms per step."""
    reference_env = config.pop("reference_env", {})
    judge_config = NLJudgeConfig(model="scripted-judge", base_url=judge.base_url)
    started = time.perf_counter()
    release = Tau2ReleaseConfig(version="v1.0.1", judge=judge_config, retrieval_variant=variant, **config)
    with Tau2Worker(release) as worker:
        start_s = time.perf_counter() - started
        tasks = {task["id"]: task for task in worker.request("tasks", domain=DOMAIN, split="base")}
        timings = {op: [] for op in OPS}
        for task_id in task_ids:
            play(worker, tasks[task_id], reads, timings)
    with tempfile.TemporaryDirectory() as scratch:  # tau2 leaves its sandboxes and caches behind: here, not in /tmp
        request = {"variant": variant, "task_ids": task_ids, "reads": reads, "judge_base_url": judge.base_url}
        reference = subprocess.run(
            [release_python(release), str(REFERENCE)], input=json.dumps(request), capture_output=True, text=True,
            env=os.environ | reference_env | {"TMPDIR": scratch}, cwd=scratch, check=True,
        )  # fmt: skip
        theirs = json.loads(reference.stdout)
    ours = {f"{op}_ms": _ms(timings[op]) for op in OPS} | {"worker_start_s": round(start_s, 2)}
    tau2 = {f"{op}_ms": _ms(theirs[op]) for op in OPS}
    ratios = {key: round(tau2[key] / ours[key], 2) for key in tau2 if ours[key] and ours[key] == ours[key]}
    return {"nemo_tau2": ours, "tau2": tau2, "ratio_tau2_over_ours": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=8, help="tasks played per variant and side")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS), help="variants measured")
    args = parser.parse_args()
    judge = ScriptedJudge()
    python = tau2_v1_python()
    with Tau2Worker(Tau2ReleaseConfig(version="v1.0.1", python=python)) as worker:
        every = worker.request("tasks", domain=DOMAIN, split="base")
    task_ids = [task["id"] for task in every if "NL_ASSERTION" not in task["evaluation_criteria"]["reward_basis"]]
    task_ids = task_ids[: args.tasks]
    results = {}
    if "bm25_grep" in args.variants:
        results["bm25_grep"] = measure("bm25_grep", [SEARCH], task_ids, judge, python=python)
    with start_fake_server() as embedder, tempfile.TemporaryDirectory() as cache:
        embeddings = EmbeddingsConfig(base_url=embedder.base_url, cache_dir=cache)
        endpoint = {"OPENAI_BASE_URL": embedder.base_url, "OPENAI_API_KEY": "none"}
        if "openai_embeddings_grep" in args.variants:
            results["openai_embeddings_grep"] = measure("openai_embeddings_grep", [SEARCH], task_ids, judge,
                                                        python=python, embeddings=embeddings,
                                                        reference_env=endpoint)  # fmt: skip
    if "terminal_use" in args.variants and shutil.which("srt"):
        results["terminal_use"] = measure("terminal_use", [SHELL], task_ids, judge, python=python)
    judge.close()
    print(f"{'variant':<24}{'step':<9}{'tau2 ms':>10}{'ours ms':>10}{'tau2/ours':>11}")
    for variant, result in results.items():
        for op in OPS:
            key = f"{op}_ms"
            ratio = result["ratio_tau2_over_ours"].get(key, float("nan"))
            print(f"{variant:<24}{op:<9}{result['tau2'][key]:>10}{result['nemo_tau2'][key]:>10}{ratio:>11}")
    print(json.dumps({"benchmark": "banking_speed", "tasks": task_ids, "results": results}))


if __name__ == "__main__":
    main()
