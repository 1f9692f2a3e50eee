"""Async GRPO against sync: step time when generation is latency-bound and takes about as long as training.

Both modes run the loop's generation side for real: tau2's mock domain on the real Gym servers, the scripted fake
as policy and user with a fixed latency per model call (``--latency-ms``: a remote engine's time, not this box's
CPU), scored and filtered as the loop does. The trainer is a fixed ``--train-s`` per step (a sleep: the point is
the overlap, and on this CPU box a real trainer would compete with nothing but the fake's sleeps); by default it is
set to the measured sync generation time, so generation ~ training; a weight load takes ``--load-s`` (a sleep, the
fake's answers then report the new ``weight_version``). Sync: ``grpo.generate`` then train and load, every step.
Async: ``AsyncCollector.take`` (max age 1) then train, then the weight load with the collector paused: running
episodes finish first (``in_flight_weight_updates: false``), or run on through it (``true``, the third mode). The
fake does not learn, so no success is compared.

    uv run bench/async_grpo.py [--steps 6] [--latency-ms 60] [--train-s S] [--load-s 0.1]

Last line: JSON with the three modes' mean step time (the first step of each excluded: warm-up and the async
buffer's first fill), the idle fractions, ``ratio`` = async / sync (target <= 0.6 at max age 1) and
``ratio_in_flight`` = async with in-flight updates / sync.
"""

import argparse
import json
import statistics
import time
from types import SimpleNamespace

from nemo_tau2.algorithms import grpo
from nemo_tau2.algorithms.async_collector import AsyncCollector
from nemo_tau2.algorithms.curriculum import TaskCurriculum
from nemo_tau2.algorithms.grpo_config import GRPODataConfig, GRPOSettings
from nemo_tau2.algorithms.training_setup import train_and_val_rows
from nemo_tau2.experience.rollouts import SamplingParams
from nemo_tau2.generation import GenerationConfig
from nemo_tau2.gym.environment import Tau2Environment, Tau2EnvironmentSpec
from nemo_tau2.gym.episode_config import NemoGymEnvConfig

TASKS = ["update_task_1", "create_task_1"]


def _settings(steps: int, max_age: int, in_flight: bool = False) -> GRPOSettings:
    return GRPOSettings(
        num_prompts_per_step=4, num_generations_per_prompt=4, max_num_steps=steps, max_rollout_concurrency=64,
        curriculum={"enabled": False}, reward_shaping={"enabled": False},
        async_grpo={"enabled": max_age > 0, "max_trajectory_age_steps": max(max_age, 1),
                    "in_flight_weight_updates": in_flight},
    )  # fmt: skip


def _setup(env: Tau2Environment, generation: GenerationConfig, settings: GRPOSettings) -> SimpleNamespace:
    """What ``grpo.generate`` reads of a ``GRPOSetup``: no trainer."""
    data = GRPODataConfig(domains=["mock"], train_split="base", val_split=None, task_ids=TASKS, compact_rows=True)
    rows, _ = train_and_val_rows(data)
    curriculum = TaskCurriculum([f"mock/{r['task_id']}" for r in rows], settings.curriculum, seed=0)
    cfg = SimpleNamespace(grpo=settings, policy=SimpleNamespace(generation=generation))
    return SimpleNamespace(
        cfg=cfg, train_rows=rows, curriculum=curriculum, environment=env, on_rollout_progress=None, collector=None
    )


def _load_weights(env: Tau2Environment, version: int, load_s: float) -> None:
    time.sleep(load_s)
    env.policy.engine.set_weight_version(version)  # the fake's answers from now on say which weights


def run_sync(env, generation, steps: int, train_s: float, load_s: float) -> dict:
    s = _setup(env, generation, _settings(steps, max_age=0))
    step_times, generate_times = [], []
    for step in range(steps):
        started = time.perf_counter()
        groups, results, _ = grpo.generate(s, step)
        assert all(r.ok for r in results), [r.error for r in results if not r.ok]
        generate_times.append(time.perf_counter() - started)
        time.sleep(train_s)  # train
        _load_weights(env, step + 1, load_s)
        step_times.append(time.perf_counter() - started)
    waited = [generating / step for generating, step in zip(generate_times[1:], step_times[1:], strict=True)]
    return {
        "step_s": statistics.fmean(step_times[1:]),
        "generation_s": statistics.fmean(generate_times[1:]),
        "trainer_idle_fraction": statistics.fmean(waited),  # the trainer waits for every rollout
        "generation_idle_fraction": 1 - statistics.fmean(waited),  # ... and generation for every update
    }


def run_async(env, generation, steps: int, train_s: float, load_s: float, max_age: int, in_flight: bool) -> dict:
    s = _setup(env, generation, _settings(steps, max_age, in_flight))
    env.policy.engine.set_weight_version(0)
    sampling = SamplingParams.from_generation(generation)
    collector = AsyncCollector(s.cfg.grpo, s.train_rows, s.curriculum, env.agent_urls, sampling, weight_version=0)
    step_times, metrics = [], []
    collector.start()
    try:
        for step in range(steps):
            started = time.perf_counter()
            _, results, _ = collector.take(step)
            assert all(r.ok for r in results), [r.error for r in results if not r.ok]
            time.sleep(train_s)
            with collector.paused(step + 1):
                _load_weights(env, step + 1, load_s)
            step_times.append(time.perf_counter() - started)
            metrics.append(collector.step_metrics())
    finally:
        collector.stop()
    return {
        "step_s": statistics.fmean(step_times[1:]),
        "trajectory_age_max": max(m["train/async/trajectory_age_max"] for m in metrics),
        "groups_dropped_for_age": sum(m["train/async/groups_dropped_for_age"] for m in metrics),
        "groups_spanning_weight_updates": sum(m["train/async/groups_spanning_weight_updates"] for m in metrics),
        "generation_idle_fraction": statistics.fmean(m["train/async/generation_idle_fraction"] for m in metrics[1:]),
        "trainer_idle_fraction": statistics.fmean(m["train/async/trainer_idle_fraction"] for m in metrics[1:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--latency-ms", type=float, default=60.0, help="per model call, policy and user")
    parser.add_argument("--train-s", type=float, default=None, help="default: the measured sync generation time")
    parser.add_argument("--load-s", type=float, default=0.1, help="one weight load")
    parser.add_argument("--max-age", type=int, default=1)
    args = parser.parse_args()
    if args.steps < 2 or args.max_age < 1:
        parser.error("--steps must be >= 2 and --max-age >= 1")
    generation = GenerationConfig(
        backend="fake", fake_cfg={"latency_ms": args.latency_ms}, temperature=1.0, top_p=1.0, max_new_tokens=256
    )
    spec = Tau2EnvironmentSpec(
        policy=generation, user=generation, domains=["mock"], gym=NemoGymEnvConfig(return_token_ids=True, max_turns=4)
    )
    with Tau2Environment(spec) as env:
        train_s = args.train_s
        if train_s is None:
            train_s = run_sync(env, generation, 3, 0.0, 0.0)["generation_s"]
        sync = run_sync(env, generation, args.steps, train_s, args.load_s)
        asynchronous = run_async(env, generation, args.steps, train_s, args.load_s, args.max_age, in_flight=False)
        in_flight = run_async(env, generation, args.steps, train_s, args.load_s, args.max_age, in_flight=True)
    print(f"train {train_s:.3f} s + load {args.load_s:.3f} s per step")
    print("| mode | s/step | trainer idle | generation idle |\n|---|---|---|---|")
    for name, mode in (("sync", sync), ("async", asynchronous), ("async, in-flight updates", in_flight)):
        idle = f"{mode['trainer_idle_fraction']:.2f} | {mode['generation_idle_fraction']:.2f}"
        print(f"| {name} | {mode['step_s']:.3f} | {idle} |")
    figures = {
        "latency_ms": args.latency_ms,
        "train_s": round(train_s, 4),
        "steps": args.steps,
        "load_s": args.load_s,
        "max_age": args.max_age,
        "sync": {k: round(v, 4) for k, v in sync.items()},
        "async": {k: round(v, 4) for k, v in asynchronous.items()},
        "async_in_flight": {k: round(v, 4) for k, v in in_flight.items()},
        "ratio": round(asynchronous["step_s"] / sync["step_s"], 3),
        "ratio_in_flight": round(in_flight["step_s"] / sync["step_s"], 3),
        "target_ratio": 0.6,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
