"""Supervised fine-tuning on multi-turn tau2 episodes (NeMo-RL's ``run_sft.py`` and ``sft`` config block).

    uv run examples/run_sft.py --config examples/configs/sft_tau2_cpu_smoke.yaml
    uv run examples/run_sft.py --config examples/configs/sft_tau2_qwen3_4b.yaml data.train_data_path=data/sft.jsonl
    uv run examples/run_sft.py --config examples/configs/sft_tau2_qwen3_4b.yaml --plan   # memory plan, then exit

Rows come from ``prepare_sft_data.py``. Loss on assistant tokens only; validation loss and pass@1 (through the
evaluator's rollout path) every ``sft.val_period`` steps; DCP checkpoints, and a rerun with the same
``checkpointing.checkpoint_dir`` resumes. The final weights are exported as a Hugging Face model to
``<checkpoint_dir>/final_hf`` (what ``run_rft.py`` / ``run_grpo.py`` take as ``policy.model_name``).
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
    ("step", "step", "{:>5d}"),
    ("train/epoch", "epoch", "{:>5.0f}"),
    ("train/loss", "loss", "{:>8.4f}"),
    ("train/grad_norm", "grad", "{:>8.3f}"),
    ("train/num_sequences", "seqs", "{:>5.0f}"),
    ("train/tokens_per_s", "tok/s", "{:>9.0f}"),
    ("val/loss", "val loss", "{:>8.4f}"),
    ("val/overall/pass@1", "val pass@1", "{:>10.3f}"),
]


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(
        sys.argv[1:], switches={"--plan": "print the memory plan (per trainer rank, per vLLM GPU), exit"}
    )
    try:
        raw = apply_overrides(load_config(args.config), args.overrides)
        from nemo_tau2.algorithms.sft_config import SFTMasterConfig

        cfg = validate_config(raw, SFTMasterConfig)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from tqdm import tqdm

    from nemo_tau2.algorithms import sft
    from nemo_tau2.algorithms.sft_data import SFTDataError, read_sft_rows
    from nemo_tau2.models.memory_plan import format_plan
    from nemo_tau2.tau2_env.gym_rows import load_rows
    from nemo_tau2.testing.warm_start import build_tiny_policy

    try:
        plan = sft.plan_memory(cfg)
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
    data = cfg.data
    try:
        train_rows = read_sft_rows(data.train_data_path)
        val_rows = read_sft_rows(data.val_data_path) if data.val_data_path else []
        eval_rows = load_rows(
            data_path=data.val_rows_path, domains_=data.domains, split=data.val_split, task_ids=data.task_ids,
            compact=data.compact_rows, split_key="val_split", path_key="val_rows_path",
        )  # fmt: skip
    except (SFTDataError, ValueError, OSError) as e:  # each names its key or file and the fix
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not train_rows:
        print(f"error: {data.train_data_path} has no rows: nothing to train on", file=sys.stderr)
        return 2
    if cfg.tiny_policy is not None and not Path(cfg.policy.model_name).exists():
        if not eval_rows:
            print("error: tiny_policy is built from the validation tasks: set data.domains", file=sys.stderr)
            return 2
        print(f"building the tiny policy into {cfg.policy.model_name} ...", file=sys.stderr)
        build_tiny_policy(cfg.tiny_policy, eval_rows, cfg.policy.model_name)
    Path(cfg.logger.log_dir).mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(cfg.logger.log_dir) / "config.json", redact_secrets(raw))
    try:
        setup = sft.setup(cfg, train_rows, val_rows, eval_rows)
    except (GenerationStartupError, ServerStartError) as e:
        print(f"error: could not start: {e}", file=sys.stderr)
        return 3
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if setup.start_step:
        print(f"resuming at step {setup.start_step} from {cfg.checkpointing.checkpoint_dir}", file=sys.stderr)
    total = sft.total_steps(cfg, len(setup.train_sequences))
    progress = tqdm(total=total, initial=setup.start_step, desc="SFT steps", unit="step")
    progress.write(console_table.header(COLUMNS))

    def on_step(step: int, metrics: dict) -> None:
        progress.write(console_table.row(COLUMNS, step, metrics))
        progress.update(1)

    try:
        sft.sft_train(setup, on_step=on_step)
    except KeyboardInterrupt:
        print(
            f"\ninterrupted: rerun the same command to resume from the latest checkpoint in "
            f"{cfg.checkpointing.checkpoint_dir}",
            file=sys.stderr,
        )
        return 130
    finally:
        progress.close()
        setup.close()
    print(f"\nmetrics: {cfg.logger.log_dir}/metrics.jsonl; final model: {sft.final_hf_dir(cfg)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
