"""Async GRPO against sync with everything real: ``examples/run_grpo.py`` on the vLLM CPU smoke config (the tiny
warm-started policy served by vLLM's CPU build, the trainer training it, weights reloaded into vLLM every step).

Runs the same GRPO twice as a user would, sync, then async (max age 1, in-flight weight updates), and reads each
run's ``metrics.jsonl``: step time (the first step excluded: vLLM's warm-up and the async buffer's first fill), its
parts, and async's idle fractions. Needs vLLM's environment (``$NEMO_TAU2_VLLM_PYTHON``). On a 2-core box vLLM, the
trainer and the Gym servers share the same cores, so overlap gains little here; the figure that matters is on GPUs.

    uv run bench/async_grpo_vllm.py [--steps 5] [--out results/bench_async_grpo_vllm]

Last line: JSON with both modes' figures and ``ratio`` = async / sync step time.
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).parents[1]
CONFIG = "examples/configs/grpo_tau2_vllm_cpu_smoke.yaml"
ASYNC = ["+grpo.async_grpo.enabled=true", "+grpo.async_grpo.in_flight_weight_updates=true"]


def run(out: Path, name: str, steps: int, overrides: list[str]) -> dict:
    folder = out / name
    shutil.rmtree(folder, ignore_errors=True)
    command = [
        sys.executable, "examples/run_grpo.py", "--config", CONFIG, f"policy.model_name={out / 'tiny_policy'}",
        f"checkpointing.checkpoint_dir={folder / 'checkpoints'}", f"logger.log_dir={folder / 'logs'}",
        "logger.tensorboard_enabled=false", f"grpo.max_num_steps={steps}", "checkpointing.enabled=false",
        *overrides,
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: the {name} run failed (exit {done.returncode}): {done.stderr[-2000:]}")
    records = [json.loads(line) for line in (folder / "logs" / "metrics.jsonl").read_text().splitlines()][1:]
    figures = {
        key.removeprefix("timing/"): statistics.fmean(r[key] for r in records)
        for key in ("timing/step_s", "timing/rollout_s", "timing/train_s", "timing/weight_sync_s")
    }
    for key in ("train/async/trainer_idle_fraction", "train/async/generation_idle_fraction"):
        if key in records[0]:
            figures[key.rsplit("/", 1)[1]] = statistics.fmean(r[key] for r in records)
    figures["wall_s"] = time.monotonic() - started
    return {key: round(value, 4) for key, value in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_async_grpo_vllm")
    args = parser.parse_args()
    if args.steps < 3:
        parser.error("--steps must be >= 3 (the first step is excluded)")
    args.out.mkdir(parents=True, exist_ok=True)
    sync = run(args.out, "sync", args.steps, [])
    asynchronous = run(args.out, "async", args.steps, ASYNC)
    print("| mode | s/step | rollout s | train s | weight sync s |\n|---|---|---|---|---|")
    for name, mode in (("sync", sync), ("async, in-flight updates", asynchronous)):
        print(f"| {name} | {mode['step_s']:.2f} | {mode['rollout_s']:.2f} | {mode['train_s']:.2f} | "
              f"{mode['weight_sync_s']:.2f} |")  # fmt: skip
    figures = {"steps": args.steps, "sync": sync, "async": asynchronous}
    print(json.dumps(figures | {"ratio": round(asynchronous["step_s"] / sync["step_s"], 3), "target_ratio": 0.6}))


if __name__ == "__main__":
    main()
