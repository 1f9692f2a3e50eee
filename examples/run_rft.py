"""Rejection-sampling fine-tuning on tau2-bench: R rounds of sample -> keep the successes -> fine-tune.

    uv run examples/run_rft.py --config examples/configs/rft_tau2_cpu_smoke.yaml
    uv run examples/run_rft.py --config examples/configs/rft_tau2_qwen3_4b.yaml \\
        policy.model_name=results/sft_qwen3_4b/checkpoints/final_hf
    uv run examples/run_rft.py --config examples/configs/rft_tau2_qwen3_4b.yaml --plan   # memory plan, then exit

Each round prints the train tasks' pass@1 (the sampled episodes), how many episodes were kept, the fine-tuning loss
and the validation pass@1; a round in which nothing succeeded says so and trains nothing. A rerun with the same
``checkpointing.checkpoint_dir`` resumes after the last finished round. The final model goes to
``<checkpoint_dir>/final_hf`` (GRPO's ``policy.model_name``).
"""

import logging
import sys
from pathlib import Path

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)
from nemo_tau2.config import ConfigError, apply_overrides, load_config, parse_args, redact_secrets, validate_config
from nemo_tau2.generation.errors import GenerationStartupError
from nemo_tau2.gym.launch import ServerStartError
from nemo_tau2.utils import console_table
from nemo_tau2.utils.jsonl_log import write_json_atomic

COLUMNS = [
    ("step", "round", "{:>5d}"),
    ("train/overall/pass@1", "train pass@1", "{:>12.3f}"),
    ("rft/num_kept", "kept", "{:>5.0f}"),
    ("rft/num_sampled", "sampled", "{:>7.0f}"),
    ("train/loss", "loss", "{:>8.4f}"),
    ("train/num_optimizer_steps", "steps", "{:>5.0f}"),
    ("val/overall/pass@1", "val pass@1", "{:>10.3f}"),
]


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(
        sys.argv[1:], switches={"--plan": "print the memory plan (per trainer rank, per vLLM GPU), exit"}
    )
    try:
        raw = apply_overrides(load_config(args.config), args.overrides)
        from nemo_tau2.algorithms.rft_config import RFTMasterConfig

        cfg = validate_config(raw, RFTMasterConfig)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from nemo_tau2.algorithms import rft
    from nemo_tau2.models.memory_plan import format_plan
    from nemo_tau2.testing.warm_start import build_tiny_policy

    try:
        plan = rft.plan_memory(cfg)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if "--plan" in args.switches:
        print(format_plan(plan))
        return 0 if plan.fits else 2
    if not plan.fits:
        print(format_plan(plan), file=sys.stderr)
        print(f"error: the run cannot fit: {'; '.join(plan.problems)}", file=sys.stderr)
        return 2
    try:
        train_rows, val_rows = rft.load_rows(cfg)
    except (ValueError, OSError) as e:  # each names its key or file and the fix
        print(f"error: {e}", file=sys.stderr)
        return 2
    if cfg.tiny_policy is not None and not Path(cfg.policy.model_name).exists():
        print(f"building the tiny policy into {cfg.policy.model_name} ...", file=sys.stderr)
        build_tiny_policy(cfg.tiny_policy, train_rows, cfg.policy.model_name)
    Path(cfg.logger.log_dir).mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(cfg.logger.log_dir) / "config.json", redact_secrets(raw))
    try:
        setup = rft.setup(cfg, train_rows, val_rows)
    except (GenerationStartupError, ServerStartError) as e:
        print(f"error: could not start: {e}", file=sys.stderr)
        return 3
    if setup.start_round:
        print(f"resuming after round {setup.start_round} from {cfg.checkpointing.checkpoint_dir}", file=sys.stderr)
    print(console_table.header(COLUMNS), flush=True)

    def on_round(round_done: int, metrics: dict) -> None:
        print(console_table.row(COLUMNS, round_done, metrics), flush=True)
        if round_done and not metrics.get("rft/num_kept"):
            print(f"  round {round_done}: no successful episode, nothing fine-tuned", flush=True)

    try:
        rft.rft_train(setup, on_round=on_round)
    except KeyboardInterrupt:
        print(
            f"\ninterrupted: rerun the same command to resume after the last finished round in "
            f"{cfg.checkpointing.checkpoint_dir}",
            file=sys.stderr,
        )
        return 130
    finally:
        setup.close()
    final = Path(cfg.checkpointing.checkpoint_dir) / rft.FINAL_HF_DIR
    print(f"\nmetrics: {cfg.logger.log_dir}/metrics.jsonl; final model: {final}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
