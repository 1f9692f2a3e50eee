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
from nemo_tau2.algorithms import training_cli
from nemo_tau2.algorithms.training_cli import Stop
from nemo_tau2.utils import console_table

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
    return training_cli.run(_main)


def _main() -> int:
    from nemo_tau2.algorithms.sft_config import SFTMasterConfig

    args, raw, cfg = training_cli.read_config(sys.argv[1:], SFTMasterConfig)
    from tqdm import tqdm

    from nemo_tau2.algorithms import sft
    from nemo_tau2.algorithms.sft_data import SFTDataError, read_sft_rows
    from nemo_tau2.tau2_env.gym_rows import load_rows
    from nemo_tau2.tau2_release.client import Tau2WorkerError
    from nemo_tau2.tau2_release.rows import check_release, release_rows
    from nemo_tau2.testing.warm_start import build_tiny_policy

    training_cli.check_memory_plan(sft.plan_memory, cfg, args)
    data = cfg.data
    try:
        train_rows = read_sft_rows(data.train_data_path)
        check_release(train_rows, cfg.tau2.version, "data.train_data_path")
        val_rows = read_sft_rows(data.val_data_path) if data.val_data_path else []
        check_release(val_rows, cfg.tau2.version, "data.val_data_path")
        if cfg.tau2.version != "v0.2.1" and not data.val_rows_path and data.domains:  # the release's own tasks
            eval_rows = release_rows(
                cfg.tau2, data.domains, data.val_split, data.task_ids, what="data", compact=data.compact_rows
            )
        else:
            eval_rows = load_rows(
                data_path=data.val_rows_path, domains_=data.domains, split=data.val_split, task_ids=data.task_ids,
                compact=data.compact_rows, split_key="val_split", path_key="val_rows_path",
            )  # fmt: skip
            check_release(eval_rows, cfg.tau2.version, "data.val_rows_path")
    except (SFTDataError, ValueError, OSError, Tau2WorkerError) as e:  # each names its key or file and the fix
        raise Stop(2, f"error: {e}") from None
    if not train_rows:
        raise Stop(2, f"error: {data.train_data_path} has no rows: nothing to train on")
    if cfg.tiny_policy is not None and not Path(cfg.policy.model_name).exists():
        if not eval_rows:
            raise Stop(2, "error: tiny_policy is built from the validation tasks: set data.domains")
        print(f"building the tiny policy into {cfg.policy.model_name} ...", file=sys.stderr)
        build_tiny_policy(cfg.tiny_policy, eval_rows, cfg.policy.model_name)
    training_cli.write_run_config(cfg.logger.log_dir, raw)
    try:
        with training_cli.starting():
            setup = sft.setup(cfg, train_rows, val_rows, eval_rows)
    except ValueError as e:  # no row has an assistant token within the length limit
        raise Stop(2, f"error: {e}") from None
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
        raise training_cli.interrupted(cfg.checkpointing.checkpoint_dir) from None
    finally:
        progress.close()
        setup.close()
    print(f"\nmetrics: {cfg.logger.log_dir}/metrics.jsonl; final model: {sft.final_hf_dir(cfg)}")
    training_cli.print_report(cfg.logger)
    return 0


if __name__ == "__main__":
    sys.exit(main())
