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
from nemo_tau2.algorithms import training_cli
from nemo_tau2.algorithms.training_cli import Stop
from nemo_tau2.utils import console_table

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
    return training_cli.run(_main)


def _main() -> int:
    from nemo_tau2.algorithms.rft_config import RFTMasterConfig

    args, raw, cfg = training_cli.read_config(sys.argv[1:], RFTMasterConfig)
    from nemo_tau2.algorithms import rft
    from nemo_tau2.testing.warm_start import build_tiny_policy

    training_cli.check_memory_plan(rft.plan_memory, cfg, args)
    try:
        train_rows, val_rows = rft.load_rows(cfg)
    except (ValueError, OSError) as e:  # each names its key or file and the fix
        raise Stop(2, f"error: {e}") from None
    if cfg.tiny_policy is not None and not Path(cfg.policy.model_name).exists():
        print(f"building the tiny policy into {cfg.policy.model_name} ...", file=sys.stderr)
        build_tiny_policy(cfg.tiny_policy, train_rows, cfg.policy.model_name)
    training_cli.write_run_config(cfg.logger.log_dir, raw)
    with training_cli.starting():
        setup = rft.setup(cfg, train_rows, val_rows)
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
        raise training_cli.interrupted(cfg.checkpointing.checkpoint_dir) from None
    finally:
        setup.close()
    final = Path(cfg.checkpointing.checkpoint_dir) / rft.FINAL_HF_DIR
    print(f"\nmetrics: {cfg.logger.log_dir}/metrics.jsonl; final model: {final}")
    training_cli.print_report(cfg.logger)
    return 0


if __name__ == "__main__":
    sys.exit(main())
