"""GRPO on tau2-bench with NeMo-Gym rollouts.

    uv run examples/run_grpo.py --config examples/configs/grpo_tau2_cpu_smoke.yaml
    uv run examples/run_grpo.py --config examples/configs/grpo_tau2_qwen3_4b.yaml grpo.max_num_steps=200
    uv run examples/run_grpo.py --config examples/configs/grpo_tau2_qwen3_4b.yaml --plan   # memory plan, then exit

Every run checks the same memory plan first and refuses (exit 2) a config that cannot fit, naming what to change,
before any server or model starts. Overrides: ``a.b=value`` changes an existing key (unknown keys are an error
naming the closest one), ``+a.b=value`` adds one. A run with the same ``checkpointing.checkpoint_dir`` resumes from
its latest checkpoint.
"""

import logging
import sys
from pathlib import Path

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)
from nemo_tau2.algorithms import training_cli
from nemo_tau2.algorithms.training_cli import Stop
from nemo_tau2.utils import console_table

COLUMNS = [
    ("step", "step", "{:>5d}"),
    ("train/rollout/success_rate", "success", "{:>7.3f}"),
    ("train/shaped_reward/mean", "reward", "{:>7.3f}"),
    ("train/loss", "loss", "{:>8.4f}"),
    ("train/approx_kl", "kl", "{:>8.5f}"),
    ("train/clip_fraction", "clip", "{:>6.3f}"),
    ("train/entropy", "entropy", "{:>7.3f}"),
    ("train/num_sequences", "seqs", "{:>5.0f}"),
    ("train/generation_agreement/token_mult_prob_error", "gen err", "{:>7.4f}"),
    ("timing/rollout_s", "rollout s", "{:>9.1f}"),
    ("timing/train_s", "train s", "{:>7.1f}"),
    ("timing/weight_sync_s", "sync s", "{:>6.2f}"),
]


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("nemo_tau2").setLevel(logging.INFO)  # a line per server as it starts, resuming, checkpoints
    from nemo_tau2.evals.progress_display import log_plainly

    log_plainly()  # progress lines off a terminal: the line alone, as run_eval.py's
    return training_cli.run(_main)


def _main() -> int:
    from nemo_tau2.algorithms.grpo_config import GRPOMasterConfig

    args, raw, cfg = training_cli.read_config(sys.argv[1:], GRPOMasterConfig)
    from nemo_tau2.algorithms import grpo, training_setup
    from nemo_tau2.evals.progress_display import StepProgress
    from nemo_tau2.testing.warm_start import build_tiny_policy

    training_cli.check_memory_plan(grpo.plan_memory, cfg, args)
    print(f"config: {args.config.resolve()}", file=sys.stderr)
    checkpoints = (
        f", checkpoints in {Path(cfg.checkpointing.checkpoint_dir).resolve()}" if cfg.checkpointing.enabled else ""
    )
    print(f"results: metrics in {Path(cfg.logger.log_dir).resolve()}{checkpoints}", file=sys.stderr)
    try:
        train_rows, val_rows = grpo.load_rows(cfg)
    except ValueError as e:  # each names its key and the fix (an unknown split, domain or task, a rows file)
        raise Stop(2, f"error: {e}") from None
    if cfg.checkpointing.enabled:
        with training_cli.starting():  # a checkpoint of another backend, release or variant: one line, exit 2
            played = training_setup.trained_on(cfg, train_rows + val_rows)  # the release and retrieval variant
            latest = grpo.resumable_checkpoint(cfg.checkpointing.checkpoint_dir, cfg.policy, played=played)
        done = grpo.checkpoint_step(latest) if latest is not None else 0
        if done >= cfg.grpo.max_num_steps:
            print(
                f"nothing left to do: step {done} of grpo.max_num_steps={cfg.grpo.max_num_steps} is done ({latest}); "
                f"raise grpo.max_num_steps to train further",
                file=sys.stderr,
            )
            return 0
    if cfg.tiny_policy is not None and not Path(cfg.policy.model_name).exists():
        print(f"building the warm-started tiny policy into {cfg.policy.model_name} ...", file=sys.stderr)
        build_tiny_policy(cfg.tiny_policy, train_rows, cfg.policy.model_name)
    training_cli.write_run_config(cfg.logger.log_dir, raw)
    print(
        f"starting: the trainer ({cfg.policy.model_name}), {cfg.policy.generation.backend} generation and the "
        "tau2 Gym servers ...",
        file=sys.stderr,
    )
    with training_cli.starting():
        setup = grpo.setup(cfg, train_rows, val_rows)
    if setup.start_step:
        print(
            f"resuming: {setup.start_step} of {cfg.grpo.max_num_steps} steps already done "
            f"({cfg.checkpointing.checkpoint_dir})",
            file=sys.stderr,
        )
    progress = StepProgress(cfg.grpo.max_num_steps, setup.start_step)
    progress.write(console_table.header(COLUMNS))
    setup.on_rollout_progress = progress.on_progress

    def on_step(step: int, metrics: dict) -> None:
        progress.write(console_table.row(COLUMNS, step, metrics))
        val = {k: v for k, v in metrics.items() if k.startswith("val/") and "pass@1" in k}
        if val:
            progress.write("  validation: " + ", ".join(f"{k.removeprefix('val/')}={v:.3f}" for k, v in val.items()))
        progress.step_done(int(metrics.get("train/rollout/num_infrastructure_errors", 0)))

    try:
        grpo.grpo_train(setup, on_step=on_step)
    except KeyboardInterrupt:
        raise training_cli.interrupted(cfg.checkpointing.checkpoint_dir) from None
    finally:
        progress.close()
        setup.close()
    print(f"\nmetrics: {cfg.logger.log_dir}/metrics.jsonl; checkpoints: {cfg.checkpointing.checkpoint_dir}")
    training_cli.print_report(cfg.logger)
    return 0


if __name__ == "__main__":
    sys.exit(main())
