"""GRPO step time on the smoke config: rollout / train / weight sync, and trained tokens per second.

Runs ``--steps`` steps of the loop (``examples/configs/grpo_tau2_cpu_smoke.yaml`` unless ``--config``; overrides as
in ``run_grpo.py``) after building the tiny policy if needed, and reports the median of each phase. The reference
measured in the same run is the weight sync a restart-style pipeline does (save the model in Hugging Face format and
have the generation backend load that directory) against ours (tensors copied in place):
``sync_ratio_checkpoint_vs_in_place``.

    uv run python bench/grpo_step.py
    uv run python bench/grpo_step.py --config examples/configs/grpo_tau2_qwen3_4b.yaml --steps 3   # on a GPU
"""

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nemo_tau2  # noqa: F401  (offline settings first)
from nemo_tau2.algorithms import grpo
from nemo_tau2.algorithms.grpo_config import GRPOMasterConfig
from nemo_tau2.config import apply_overrides, load_config, validate_config
from nemo_tau2.testing.warm_start import build_tiny_policy

SMOKE = Path(__file__).parents[1] / "examples" / "configs" / "grpo_tau2_cpu_smoke.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(SMOKE))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="grpo_step_bench_"))
    raw = apply_overrides(
        load_config(args.config),
        [
            f"grpo.max_num_steps={args.steps}",
            "grpo.val_period=0",
            "grpo.val_at_end=false",
            "checkpointing.enabled=false",
            f"logger.log_dir={work / 'logs'}",
            "logger.tensorboard_enabled=false",
            *args.overrides,
        ],
    )
    cfg = validate_config(raw, GRPOMasterConfig)
    train_rows, _ = grpo.load_rows(cfg)
    if cfg.tiny_policy is not None and not Path(cfg.policy.model_name).exists():
        print(f"building the tiny policy into {cfg.policy.model_name}", file=sys.stderr)
        build_tiny_policy(cfg.tiny_policy, train_rows, cfg.policy.model_name)

    started = time.perf_counter()
    s = grpo.setup(cfg, train_rows, [])
    setup_s = time.perf_counter() - started
    try:
        history = grpo.grpo_train(
            s, on_step=lambda step, m: print(f"step {step}: {m['timing/step_s']:.2f} s", file=sys.stderr)
        )
        in_place, via_checkpoint = [], []
        for _ in range(3):
            t = time.perf_counter()
            s.generation.update_weights(s.policy.stream_weights_for_generation())
            in_place.append(time.perf_counter() - t)
            t = time.perf_counter()
            s.generation.update_weights(checkpoint_dir=str(s.policy.save_hf_model(work / "weights")))
            via_checkpoint.append(time.perf_counter() - t)
    finally:
        s.close()

    def median(key: str) -> float:
        return statistics.median(step[key] for step in history)

    sync_in_place, sync_checkpoint = statistics.median(in_place), statistics.median(via_checkpoint)
    steps_after_first = history[1:] or history
    figures = {
        "bench": "grpo_step",
        "config": Path(args.config).name,
        "model": cfg.policy.model_name,
        "generation_backend": cfg.policy.generation.backend,
        "device": cfg.policy.device,
        "steps": len(history),
        "episodes_per_step": cfg.grpo.num_prompts_per_step * cfg.grpo.num_generations_per_prompt,
        "setup_s": round(setup_s, 2),
        "step_s": round(median("timing/step_s"), 3),
        "rollout_s": round(median("timing/rollout_s"), 3),
        "train_s": round(median("timing/train_s"), 3),
        "weight_sync_s": round(median("timing/weight_sync_s"), 4),
        "first_step_s": round(history[0]["timing/step_s"], 3),
        "trained_tokens_per_s": round(statistics.median(step["train/tokens_per_s"] for step in steps_after_first), 1),
        "success_rate_first_last": [history[i]["train/rollout/success_rate"] for i in (0, -1)],
        "sync_in_place_s": round(sync_in_place, 4),
        "sync_via_checkpoint_s": round(sync_checkpoint, 4),
        "sync_ratio_checkpoint_vs_in_place": round(sync_checkpoint / max(sync_in_place, 1e-9), 1),
        "machine": f"{platform.machine()} {platform.system()}",
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
