"""Episode throughput through 1, 2 and 4 agent + resources replicas placed by Ray, and the CPU each Gym server
spends per policy turn: the figures the capacity plan (``--plan``, :mod:`nemo_tau2.gym.capacity`) rests on.

One local Ray (``cluster.ray_address`` null, ``gym_placement=ray``, sized with logical CPUs for the largest
placement: a bundle of one CPU per replica); for each replica count a ``Tau2Environment`` places that many agents
(each with its policy and user model servers) and resources servers, and the scripted fake engine (one process,
0 ms latency: the gold policy and a scripted user) plays tau2 test tasks of all three domains through
``run_nemo_gym_rollout_sync`` at a concurrency that keeps every replica busy. The reference is one replica, measured
in the same run.

CPU per policy turn, per component (``/proc/<pid>/stat`` before and after the timed batch, divided by the policy
turns played): agent, resources, model servers (policy + user), the fake engine, and this process (the rollout
client, Ray's driver threads); ``cores_busy`` is their sum per wall second, against ``os.cpu_count()``. From the
one-replica figures and a stated generation throughput, the replicas one vLLM GPU serving Qwen3-4B needs (defaults
and their sources: ``nemo_tau2/gym/capacity.py``). Wall figures depend on what else the machine runs: its load
average is printed.

    uv run bench/rollout_scaling.py [--replicas 1,2,4] [--episodes 300] [--concurrency 64]
        [--tokens-per-s-per-gpu 10000] [--tokens-per-turn 135]
"""

import argparse
import json
import math
import os
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)
from nemo_tau2.cluster import ClusterConfig, ray_connection
from nemo_tau2.experience.rollouts import OK, SamplingParams, run_nemo_gym_rollout_sync
from nemo_tau2.generation import GenerationConfig
from nemo_tau2.gym.capacity import GENERATION_TOKENS_PER_S_PER_GPU, TOKENS_PER_POLICY_TURN, plan_gym_capacity
from nemo_tau2.gym.environment import Tau2Environment, Tau2EnvironmentSpec
from nemo_tau2.gym.episode_config import NemoGymEnvConfig
from nemo_tau2.gym.stack import AGENT, POLICY_MODEL, RESOURCES_SERVER, USER_MODEL
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.gym_rows import task_row

DOMAINS = ("airline", "retail", "telecom")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SAMPLING = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=512)
COMPONENTS = {"agent": (AGENT,), "resources": (RESOURCES_SERVER,), "model_servers": (POLICY_MODEL, USER_MODEL)}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:13]) / CLOCK_TICKS


def episode_rows(count: int, sample: int) -> list[dict]:
    pool = [(domain, task.id) for domain in DOMAINS for task in domains.get_tasks(domain, "test")]
    return [task_row(*pool[i % len(pool)]) | {"sample_index": sample} for i in range(count)]


def component_pids(env: Tau2Environment) -> dict[str, list[int]]:
    """Component -> the pids of its servers (every replica), the fake engine's process and this one."""
    names = list(env.servers.placement)
    pids = {
        component: [env.servers.pid(name) for name in names if name.startswith(prefixes)]
        for component, prefixes in COMPONENTS.items()
    }
    return pids | {"fake_engine": [env.policy.engine.pid], "rollout_client": [os.getpid()]}  # this process: the client


def measure(replicas: int, episodes: int, concurrency: int, log_dir: Path) -> dict:
    spec = Tau2EnvironmentSpec(
        policy=GenerationConfig(
            backend="fake", fake_cfg={"preload_domains": list(DOMAINS)}, temperature=0.0, top_p=1.0
        ),
        user=None,  # the user on the same fake engine
        domains=list(DOMAINS),
        gym=NemoGymEnvConfig(agent_replicas=replicas, resources_replicas=replicas),
        log_dir=log_dir / f"replicas_{replicas}",
        cluster=ClusterConfig(gym_placement="ray"),
    )
    began = time.perf_counter()
    with Tau2Environment(spec) as env:
        startup_s = time.perf_counter() - began
        run_nemo_gym_rollout_sync(episode_rows(3 * replicas, 0), env.agent_urls, SAMPLING, 1)  # warm-up
        pids = component_pids(env)
        before = {name: sum(map(cpu_seconds, group)) for name, group in pids.items()}
        started = time.perf_counter()
        results = run_nemo_gym_rollout_sync(
            episode_rows(episodes, 1), env.agent_urls, SAMPLING, 1, max_concurrency=concurrency
        )
        wall = time.perf_counter() - started
        spent = {name: sum(map(cpu_seconds, group)) - before[name] for name, group in pids.items()}
    bad = [r for r in results if r.status != OK]
    assert not bad, f"{len(bad)} episodes failed: {bad[0].status} {bad[0].error}"
    turns = sum(r.num_turns for r in results)
    return {
        "replicas": replicas,
        "startup_s": round(startup_s, 1),
        "episodes": len(results),
        "policy_turns": turns,
        "mean_reward": round(sum(r.reward for r in results) / len(results), 3),  # scripted play: not all tasks pass
        "wall_s": round(wall, 2),
        "episodes_per_s": round(len(results) / wall, 2),
        "policy_turns_per_s": round(turns / wall, 1),
        "cpu_ms_per_policy_turn": {name: round(seconds / turns * 1000, 3) for name, seconds in spent.items()},
        "cores_busy": round(sum(spent.values()) / wall, 2),  # of os.cpu_count(), shared with whatever else runs
    }


def replicas_per_gpu(cpu_ms: dict[str, float], tokens_per_s_per_gpu: float, tokens_per_turn: float) -> dict:
    """Replicas (one CPU each) that one generation GPU's policy turns keep busy: the capacity plan of ``--plan``
    (:func:`nemo_tau2.gym.capacity.plan_gym_capacity`) for one GPU, with this run's CPU per turn."""
    agent_ms = cpu_ms["agent"] + cpu_ms["model_servers"]  # an agent replica's bundle holds its model servers
    plan = plan_gym_capacity(
        1, 1, 1, tokens_per_s_per_gpu=tokens_per_s_per_gpu, tokens_per_turn=tokens_per_turn,
        cpu_s_per_turn={"agent": agent_ms / 1000, "resources": cpu_ms["resources"] / 1000},
    )  # fmt: skip
    return {
        "policy_turns_per_s_per_gpu": round(plan.policy_turns_per_s, 1),
        "agent_replica_cpu_ms_per_turn": round(agent_ms, 3),
        "agent_replicas": round(plan.replicas_busy("agent"), 2),
        "resources_replicas": round(plan.replicas_busy("resources"), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--replicas", default="1,2,4", help="agent + resources replica counts; the first is the reference"
    )
    parser.add_argument("--episodes", type=int, default=300, help="timed episodes per replica count")
    parser.add_argument("--concurrency", type=int, default=64, help="episodes in flight")
    parser.add_argument(
        "--tokens-per-s-per-gpu",
        type=float,
        default=GENERATION_TOKENS_PER_S_PER_GPU,
        help="generation tokens/s of one vLLM GPU for Qwen3-4B (default: nemo_tau2/gym/capacity.py, an assumption)",
    )
    parser.add_argument(
        "--tokens-per-turn",
        type=float,
        default=TOKENS_PER_POLICY_TURN,
        help="tokens per policy turn (default: nemo_tau2/gym/capacity.py, from bench/tau2_episode_lengths.py)",
    )
    args = parser.parse_args()
    counts = [int(x) for x in args.replicas.split(",")]
    load_before = os.getloadavg()
    rows = []
    with ExitStack() as stack:
        # one local Ray for every count, with a logical CPU per bundle of the largest placement (2 roles)
        stack.enter_context(ray_connection(ClusterConfig(), num_cpus=2 * max(counts), object_store_memory=80 * 2**20))
        log_dir = Path(tempfile.mkdtemp(prefix="rollout_scaling_"))
        for count in counts:
            figures = measure(count, args.episodes, args.concurrency, log_dir)
            rows.append(figures)
            print(f"{count} replica(s): {json.dumps(figures)}", flush=True)
    reference = rows[0]
    header = f"{'replicas':>8} {'start s':>8} {'ep/s':>7} {'turns/s':>8} {'x ref':>6} {'cores':>6}"
    print(f"\n{header}  CPU ms per policy turn")
    for row in rows:
        cpu = "  ".join(f"{name} {ms:.2f}" for name, ms in row["cpu_ms_per_policy_turn"].items())
        ratio = row["episodes_per_s"] / reference["episodes_per_s"]
        print(
            f"{row['replicas']:>8} {row['startup_s']:>8} {row['episodes_per_s']:>7} "
            f"{row['policy_turns_per_s']:>8} {ratio:>6.2f} {row['cores_busy']:>6}  {cpu}"
        )
    per_gpu = replicas_per_gpu(reference["cpu_ms_per_policy_turn"], args.tokens_per_s_per_gpu, args.tokens_per_turn)
    print(
        f"\nper vLLM GPU (Qwen3-4B, {args.tokens_per_s_per_gpu:,.0f} tokens/s, {args.tokens_per_turn:g} tokens/turn): "
        f"{per_gpu['policy_turns_per_s_per_gpu']} policy turns/s -> {per_gpu['agent_replicas']} agent replicas "
        f"(ceil {math.ceil(per_gpu['agent_replicas'])}), {per_gpu['resources_replicas']} resources replicas "
        f"(ceil {math.ceil(per_gpu['resources_replicas'])})"
    )
    ratios = {str(row["replicas"]): round(row["episodes_per_s"] / reference["episodes_per_s"], 2) for row in rows}
    summary = {
        "benchmark": "rollout_scaling",
        "cpus": os.cpu_count(),
        "load_avg_1m_before": round(load_before[0], 2),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
        "episodes": args.episodes,
        "concurrency": args.concurrency,
        "results": rows,
        "episodes_per_s_over_reference": ratios,
        "reference_replicas": reference["replicas"],
        "target_ratio_at_2": 1.5,
        "replicas_per_gpu": per_gpu,
        "tokens_per_s_per_gpu": args.tokens_per_s_per_gpu,
        "tokens_per_turn": args.tokens_per_turn,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
