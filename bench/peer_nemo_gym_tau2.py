"""Side by side with NeMo-Gym 0.7.0's own tau2 agent: the same tasks, the same model endpoint, one run, one client.

- **Theirs**: ``responses_api_agents/tau2`` of the 0.7.0 environment under ``ng_run`` (:mod:`peer_theirs`: tau2
  v1.0.1 from the vendored release, plus what their agent needs of its fork, :mod:`peer_tau2_shim`).
- **Ours**: our resources server, agent and model servers on NeMo-Gym 0.7.0, ``tau2.version: v1.0.1``
  (:mod:`peer_ours`).
- **The models**: one scripted OpenAI-compatible server plays the policy and the user for both (the oracle, then a
  policy that corrupts one argument of each task's first write). Their agent sends no conversation key, so it
  recognises their requests by what they hold (``missing_key: tau2``; each of their episodes has its own seed).
- **One client** posts every episode to each agent's ``/run`` at 1, 16 and 64 at a time (:mod:`peer_measure`).

Measured: rewards, episode for episode, against tau2 v1.0.1 scoring each side's own trajectory
(:mod:`peer_rescore`); episodes/s and CPU-seconds per episode of each side's processes (agent, resources, model
servers, Ray where a side runs it; the scripted server apart); what each answer holds per policy turn for training
(token ids, contiguity across turns, with the policy's generations token-inconsistent as a history-rewriting
template makes them); a policy endpoint answering 500s, and one hanging. Their ``num_workers`` is swept.

    uv run bench/peer_nemo_gym_tau2.py [--quick] [--concurrency 1,16,64] [--their-workers 1,2] [--tasks-per-domain 4]
        [--only ours|theirs] [--smollm2 N]

``--smollm2 N`` adds N episodes per side with SmolLM2-135M on llama.cpp as policy and user (airline task 0,
max_steps 8, 256 tokens a call on both sides), each reward against tau2's own scoring: ~3.5 minutes for N = 2 on
2 cores (two more stack start-ups, 6-9k-token prompts), so it is off by default to keep the run under 10 minutes.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

from peer_compare import (
    SMOLLM2_TASK,
    Side,
    compare_rewards,
    failure_probe,
    smollm2_probe,
    table,
    throughput,
    training_probe,
)
from peer_theirs import TheirServers, install, their_rows

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)
from nemo_tau2.generation import GenerationConfig
from nemo_tau2.generation.launch import start_generation
from nemo_tau2.tau2_release.client import KNOWLEDGE_DOMAINS as KNOWLEDGE
from nemo_tau2.tau2_release.client import TAU2_V1_PYTHON_ENV, Tau2Worker
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig
from nemo_tau2.tau2_release.rows import release_rows
from nemo_tau2.testing import start_fake_server
from nemo_tau2.testing.config import ControlRequest, FakeServerConfig
from nemo_tau2.testing.release_tasks import load_release_tasks, write_release_tasks
from nemo_tau2.testing.scripts import ScriptError
from nemo_tau2.testing.tau2_scripts import OUT_OF_SCOPE, STOP, TRANSFER, opening_text, policy_turns, task_of

ROOT = Path(__file__).resolve().parents[1]
DOMAINS = ["airline", "retail", "telecom", "banking_knowledge"]
RETRIEVAL_VARIANT = "bm25_grep"  # banking_knowledge's offline variant, served by both (tau2's default needs OpenAI)
#: The mistaken policy per domain: one argument of the first write corrupted; banking_knowledge's gold are calls of
#: discoverable tools, which the scripted policy cannot corrupt, so there it closes at once.
MISTAKES = {"airline": "wrong_argument", "retail": "wrong_argument", "telecom": "wrong_argument",
            "banking_knowledge": "do_nothing"}  # fmt: skip
GYM07_PYTHON_ENV = "NEMO_TAU2_GYM07_PYTHON"
MAX_STEPS = 200  # their agent config's max_steps; ours is its own default (both far above the oracle's)


def _setup_python(variable: str, part: str) -> Path:
    if os.environ.get(variable):
        return Path(os.environ[variable])
    out = subprocess.run([str(ROOT / "scripts/setup.sh"), part], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"error: `scripts/setup.sh {part}` failed; run it to see why ({out.stderr.strip()[-300:]})")
    return Path(out.stdout.split()[-1])


def _uv() -> Path:
    from shutil import which

    for candidate in (os.environ.get("UV"), which("uv")):
        if candidate and Path(candidate).parent.name != "shims":
            return Path(candidate)
    sys.exit("error: no uv binary (not pyenv's shim) found: run the bench with `uv run`, or put uv's folder on PATH")


def _tau2_source() -> Path:
    source = Path(os.environ.get("NEMO_TAU2_TAU2_V1_SOURCE") or ROOT.parent / "shared/vendor/tau2-bench-1.0.1")
    if not (source / "src/tau2/runner/batch.py").is_file():
        sys.exit(f"error: no tau2 v1.0.1 source at {source}: set NEMO_TAU2_TAU2_V1_SOURCE to a checkout of it")
    return source


def pick_tasks(worker: Tau2Worker, per_domain: int, work: Path) -> dict[str, list[dict]]:
    """Per domain, ``per_domain`` tasks spread over its base split (banking_knowledge: its tasks): those scored
    without the NL judge (no endpoint for it here; their benchmark drops NL assertions too), starting from no message
    history, and with an argument of a write for the mistaken policy to corrupt where it corrupts one."""
    eligible = {
        domain: [
            task for task in worker.request("tasks", domain=domain, split=None if domain in KNOWLEDGE else "base")
            if "NL_ASSERTION" not in (task.get("evaluation_criteria") or {}).get("reward_basis", [])
            and not (task.get("initial_state") or {}).get("message_history")
        ]
        for domain in DOMAINS
    }  # fmt: skip
    load_release_tasks(write_release_tasks(work / "eligible_tasks.json", eligible))
    picked = {}
    for domain, tasks in eligible.items():
        if MISTAKES[domain] == "wrong_argument":
            tasks = [task for task in tasks if _corruptible(domain, str(task["id"]))]
        step = max(1, len(tasks) // per_domain)
        picked[domain] = tasks[::step][:per_domain]
    return picked


def _corruptible(domain: str, task_id: str) -> bool:
    try:
        policy_turns(domain, task_id, "wrong_argument")
    except ScriptError:
        return False
    return True


def _opens_with_stop(domain: str, task: dict) -> bool:
    """The scripted user opens with the task's whole scenario where it is one string; some (banking_knowledge's
    task_078) end with tau2's stop token, so that episode ends at its first message, on both sides alike."""
    return any(token in opening_text(task_of(domain, str(task["id"]))) for token in (STOP, TRANSFER, OUT_OF_SCOPE))


def _gold_calls(task: dict) -> int:
    return sum(
        1 for a in (task.get("evaluation_criteria") or {}).get("actions") or [] if a["requestor"] == "assistant"
    )


class Episodes:
    """``episodes(count)``: ``count`` episodes cycling over the tasks (``of``: those given), each with a seed of its
    own, which the scripted server is told (their agent's requests carry no key: the seed names the task).
    ``longest``: the task with the most gold tool calls (the training-data probe's)."""

    def __init__(self, tasks: list[tuple[str, str]], fake, longest: tuple[str, str]) -> None:
        self.tasks, self.fake, self.next_seed, self.longest = tasks, fake, 100_000, longest

    def __call__(self, count: int, of: list[tuple[str, str]] | None = None) -> list[tuple[str, str, int]]:
        tasks = of or self.tasks
        made = [(*tasks[i % len(tasks)], self.next_seed + i) for i in range(count)]
        self.next_seed += count
        self.fake.control(ControlRequest(inferred_key_seeds={seed: f"{d}|{t}" for d, t, seed in made}))
        return made


class Rows:
    """Each side's ``/run`` rows of some episodes: ours (``sample_index`` names the episode to the scripted server)
    and theirs (tau2's ``seed``, on the row and in its run config), from one row per task."""

    def __init__(self, ours: dict[tuple[str, str], dict], theirs: list[dict]) -> None:
        sampling = {"temperature": 1.0, "top_p": 1.0}
        self.ours = {key: row | {"responses_create_params": row["responses_create_params"] | sampling}
                     for key, row in ours.items()}  # fmt: skip
        self.theirs = {(row["config"]["domain"], str(row["task"]["id"])): row for row in theirs}

    def for_side(self, side: str, made: list[tuple[str, str, int]]) -> list[dict]:
        if side == "ours":
            return [self.ours[(d, t)] | {"sample_index": seed} for d, t, seed in made]
        return [self.theirs[(d, t)] | {"seed": seed, "config": self.theirs[(d, t)]["config"] | {"seed": seed}}
                for d, t, seed in made]  # fmt: skip


SMOLLM2_MAX_STEPS = 8  # a small model on 2 cores, ~10 s a turn: a few turns each (tau2's max_steps, both sides)
SMOLLM2_MAX_TOKENS = 256  # per call, policy and user, on both sides: uncapped, a small model rambles for minutes
SMOLLM2_POLICY_TIMEOUT_S = 600.0  # ours per policy call, as litellm's default on theirs


def smollm2(sides: list[Side], rows: Rows, count: int, tau2_python: Path) -> dict:
    """The first setting of each side again, policy and user SmolLM2-135M on llama.cpp (16k context, 2 slots)."""
    from dataclasses import replace

    config = GenerationConfig(backend="llamacpp", llamacpp_cfg={"n_ctx": 16384, "n_parallel": 2},
                              temperature=1.0, top_p=1.0)  # fmt: skip
    found = {}
    with start_generation(config) as llama:
        for side in {side.name: side for side in reversed(sides)}.values():
            real = replace(side, base_url=llama.base_urls[0], model=llama.model_name, max_steps=SMOLLM2_MAX_STEPS,
                           policy_timeout_s=SMOLLM2_POLICY_TIMEOUT_S, max_new_tokens=SMOLLM2_MAX_TOKENS)  # fmt: skip
            with real.start(TheirServers) as running:
                made = [("airline", SMOLLM2_TASK, 900_000 + i) for i in range(count)]
                capped = [
                    row
                    | {
                        "responses_create_params": row["responses_create_params"]
                        | {"max_output_tokens": SMOLLM2_MAX_TOKENS}
                    }
                    for row in rows.for_side(side.name, made)
                ]
                found[side.name] = smollm2_probe(running, capped, tau2_python, count)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CI: 1 task per domain, concurrency 1 and 4, 1 worker")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--their-workers", default="1,2", help="their agent's num_workers settings to sweep")
    parser.add_argument("--tasks-per-domain", type=int, default=4)
    parser.add_argument("--work-dir", type=Path, help="where logs and results.json go (default: a new temp folder)")
    parser.add_argument("--only", choices=["ours", "theirs"], help="measure one side (no ratios)")
    parser.add_argument("--smollm2", type=int, default=0, help="episodes per side with SmolLM2 on llama.cpp (slow)")
    args = parser.parse_args()
    if args.quick:
        args.concurrency, args.their_workers, args.tasks_per_domain, args.smollm2 = "1,4", "1", 1, 0
    levels = [int(c) for c in args.concurrency.split(",")]
    workers = [int(w) for w in args.their_workers.split(",")]
    gym07, tau2_python, uv, source = (
        _setup_python(GYM07_PYTHON_ENV, "gym07"), _setup_python(TAU2_V1_PYTHON_ENV, "tau2-v1"), _uv(), _tau2_source()
    )  # fmt: skip
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="peer_nemo_gym_tau2_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work folder {work}; tau2 v1.0.1 from {source}", flush=True)
    their = install(Path.home() / ".cache/nemo-tau2/peer-nemo-gym-tau2", source, gym07, tau2_python, uv)
    release = Tau2ReleaseConfig(version="v1.0.1", python=str(tau2_python), retrieval_variant=RETRIEVAL_VARIANT)
    their_settings = {"temperature": 1.0, "top_p": 1.0, "max_steps": MAX_STEPS, "retrieval_config": RETRIEVAL_VARIANT}
    with Tau2Worker(release) as worker:
        tasks = pick_tasks(worker, args.tasks_per_domain, work)
    pool = [(domain, str(task["id"])) for domain, found in tasks.items() for task in found]
    longest = max(((d, str(t["id"])) for d, found in tasks.items() for t in found if not _opens_with_stop(d, t)),
                  key=lambda dt: _gold_calls(next(t for t in tasks[dt[0]] if str(t["id"]) == dt[1])))  # fmt: skip
    release_file = write_release_tasks(work / "release_tasks.json", tasks)
    row_tasks = sorted(set(pool) | {("airline", SMOLLM2_TASK)})
    our_rows = {
        (row["domain"], row["task_id"]): row for row in release_rows(release, DOMAINS, None, [t for _, t in row_tasks])
    }
    fake_config = FakeServerConfig(
        missing_key="tau2", inferred_key_domains=DOMAINS, tau2={"release_tasks": str(release_file)}
    )
    with start_fake_server(fake_config, mode="subprocess", log_file=work / "fake_server.log") as fake:
        episodes = Episodes(pool, fake, longest)

        rows = Rows(our_rows, their_rows(their, source / "data", [(d, t, 0) for d, t in row_tasks], **their_settings))

        common = {"domains": tuple(DOMAINS), "retrieval_variant": RETRIEVAL_VARIANT, "quick": args.quick}
        sides = [Side("ours", ROOT, gym07, tau2_python, fake.base_url, work, None, **common)] + [
            Side("theirs", ROOT, gym07, tau2_python, fake.base_url, work, w, their, **common) for w in workers
        ]
        sides = [side for side in sides if args.only in (None, side.name)]
        results = {"throughput": [], "rewards": {}, "training": {}, "failures": {}}
        for side in sides:
            with side.start(TheirServers) as running:
                print(f"{side.label}: up in {running.startup_s:.1f} s at {running.agent_url}", flush=True)
                results["throughput"] += throughput(running, fake, levels, episodes, rows.for_side, args.quick)
                if side.workers in (None, workers[0]):  # rewards, training data and failures: once per agent
                    results["rewards"][side.name] = compare_rewards(
                        running, fake, episodes, rows.for_side, tau2_python, MISTAKES, RETRIEVAL_VARIANT
                    )
                    results["training"][side.name] = training_probe(running, fake, episodes, rows.for_side)
                    results["failures"][side.name] = failure_probe(running, fake, episodes, rows.for_side, args.quick)
        if args.smollm2:
            results["smollm2"] = smollm2(sides, rows, args.smollm2, tau2_python)
    if args.only:
        table(results, [], workers)
        print(json.dumps({"benchmark": "peer_nemo_gym_tau2", "only": args.only, "throughput": results["throughput"]}))
        return
    summary = table(results, levels, workers)
    for name, found in results.get("smollm2", {}).items():
        summary.setdefault("smollm2", {})[name] = {
            key: found[key] for key in ("episodes", "scored", "identical_to_tau2", "wall_s")
        } | {"rewards": [record["reward"] for record in found["records"]]}
    summary |= {"benchmark": "peer_nemo_gym_tau2", "date": date.today().isoformat(), "cpus": os.cpu_count(),
                "load_avg_1m": round(os.getloadavg()[0], 2), "quick": args.quick, "tasks": len(pool)}  # fmt: skip
    (work / "results.json").write_text(json.dumps(results | {"summary": summary}, indent=1, default=str))
    print(f"full results: {work / 'results.json'}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
