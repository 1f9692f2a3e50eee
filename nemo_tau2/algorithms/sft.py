"""Supervised fine-tuning on multi-turn tau2 episodes, one loop that reads top to bottom.

The rows (``prepare_sft_data.py``) are whole episodes as the policy's own token ids; the loss is the mean negative
log-likelihood of the assistant tokens only (the trainer's ``token_mask``; prompt, user and tool tokens carry none).
Each step: (1) take the next ``policy.train_global_batch_size`` rows of a seeded per-epoch order; (2) **train** one
optimizer step with :class:`~nemo_tau2.algorithms.loss.NLLLossFn` on the same ``Policy`` as GRPO (micro-batches,
packing, FSDP2); (3) **log** loss and tokens/s; every ``val_period`` steps **validate**: the loss on held-out rows
and, when tasks are configured, pass@1 through the evaluator's rollout path with the new weights served by
``policy.generation``; (4) **checkpoint** every ``save_period`` steps (DCP, resumable: the row order is a function of
the seed and the epoch, so a resumed run continues with the same rows). At the end the weights are exported as a
Hugging Face model to ``<checkpointing.checkpoint_dir>/final_hf``, which the next stage (RFT, GRPO) loads by path.

References: NeMo-RL's ``sft_train`` (names and semantics); slime's tau2 pipeline (SFT -> RFT -> GRPO).
"""

import logging
import math
import shutil
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nemo_tau2.algorithms import training_setup
from nemo_tau2.algorithms.loss import NLLLossFn
from nemo_tau2.algorithms.prompt_fit import check_prompts_fit
from nemo_tau2.algorithms.sft_config import SFTMasterConfig
from nemo_tau2.algorithms.sft_data import training_sequence
from nemo_tau2.generation.launch import GenerationHandle
from nemo_tau2.gym.environment import Tau2Environment
from nemo_tau2.models.memory_plan import MemoryPlan
from nemo_tau2.models.policy.checkpoint import prune_checkpoints, step_dir
from nemo_tau2.models.policy.data import TrainingSequence
from nemo_tau2.models.policy.lm_policy import Policy
from nemo_tau2.trained_tasks import trained_on_record, write_trained_on
from nemo_tau2.utils.metrics_logger import MetricsLogger

logger = logging.getLogger(__name__)

FINAL_HF_DIR = "final_hf"


@dataclass
class SFTSetup:
    """Everything the loop needs, built by :func:`setup`; ``close()`` stops servers and workers."""

    cfg: SFTMasterConfig
    policy: Policy
    train_sequences: list[TrainingSequence]
    val_sequences: list[TrainingSequence]
    eval_rows: list[dict]
    metrics_logger: MetricsLogger
    generation: GenerationHandle | None = None
    environment: Tau2Environment | None = None
    start_step: int = 0
    resources: ExitStack = field(default_factory=ExitStack)
    trained_on: dict = field(default_factory=dict)  # tau2 release and retrieval variant, in every checkpoint
    export_record: dict = field(default_factory=dict)  # what the exported model records it trained on (tasks too)

    def close(self) -> None:
        self.resources.close()


# ================================================================================================ setup


def plan_memory(cfg: SFTMasterConfig) -> MemoryPlan:
    return training_setup.plan_memory(cfg, reference=False)


def sequences_of(rows: list[dict], max_total_sequence_length: int) -> list[TrainingSequence]:
    """Training sequences of SFT rows; a row left without assistant tokens by the length limit is dropped."""
    sequences = [training_sequence(row, max_total_sequence_length) for row in rows]
    kept = [seq for seq in sequences if any(seq.token_mask)]
    if len(kept) < len(sequences):
        logger.warning(
            "%d of %d rows have no assistant token within policy.max_total_sequence_length %d: dropped",
            len(sequences) - len(kept), len(sequences), max_total_sequence_length,
        )  # fmt: skip
    return kept


def check_vocabulary(sequences: list[TrainingSequence], model_name: str) -> None:
    """Refuse rows made with another tokenizer (a token id beyond the model's vocabulary) before anything starts."""
    from nemo_tau2.models.model_shape import find_model_config

    config, _ = find_model_config(model_name)
    vocab_size = (config.get_text_config() if hasattr(config, "get_text_config") else config).vocab_size
    largest = max((max(seq.token_ids, default=0) for seq in sequences), default=0)
    if largest >= vocab_size:
        raise ValueError(
            f"the SFT rows hold token id {largest}, beyond {model_name}'s vocabulary of {vocab_size}: they were made "
            f"with another tokenizer; remake them with prepare_sft_data.py (--tokenizer {model_name})"
        )


def setup(cfg: SFTMasterConfig, train_rows: list[dict], val_rows: list[dict], eval_rows: list[dict]) -> SFTSetup:
    """Start the trainer (and, for validation pass@1, the generation backend and the tau2 environment); resume."""
    resources = ExitStack()
    try:
        check_prompts_fit(cfg.policy, cfg.tau2.retrieval_variant, eval_rows)
        training_setup.open_cluster(cfg, resources)  # first: the trainer's workers and the Gym servers join it
        torch.manual_seed(cfg.sft.seed)
        limit = cfg.policy.max_total_sequence_length
        train_sequences = sequences_of(train_rows, limit)
        if not train_sequences:
            raise ValueError("no SFT row has an assistant token to train on")
        val_sequences = sequences_of(val_rows, limit)
        check_vocabulary(train_sequences + val_sequences, cfg.policy.model_name)
        policy = Policy(cfg.policy, seed=cfg.sft.seed)
        resources.callback(policy.shutdown)
        generation = environment = None
        if eval_rows:
            generation, environment = training_setup.start_rollout_stack(
                cfg, [str(row["domain"]) for row in eval_rows], resources
            )
        metrics_logger = resources.enter_context(MetricsLogger(cfg.logger))
        s = SFTSetup(
            cfg, policy, train_sequences, val_sequences, eval_rows, metrics_logger,
            generation, environment, resources=resources,
            trained_on=(played := training_setup.trained_on(cfg, train_rows + val_rows + eval_rows)),
            export_record=trained_on_record(played, train_rows, cfg.policy.model_name),
        )  # fmt: skip
        latest = (
            training_setup.resumable_checkpoint(cfg.checkpointing.checkpoint_dir, cfg.policy, played=played)
            if cfg.checkpointing.enabled
            else None
        )
        if latest is not None:
            s.start_step = int(policy.load_checkpoint(latest)["step"])
            logger.info("resumed from %s at step %d", latest, s.start_step)
        return s
    except BaseException:
        resources.close()
        raise


# ================================================================================================ the steps


def batch_schedule(num_rows: int, batch_size: int, num_epochs: int, seed: int, shuffle: bool) -> list[list[int]]:
    """Row indices of every step: each epoch a seeded permutation cut into batches (the last one may be smaller).

    A function of its arguments only, so a resumed run (or an RFT round) knows which rows step ``k`` trains on.
    """
    steps = []
    for epoch in range(num_epochs):
        if shuffle:
            order = torch.randperm(num_rows, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
        else:
            order = list(range(num_rows))
        steps += [order[i : i + batch_size] for i in range(0, num_rows, batch_size)]
    return steps


def train_step(policy: Policy, sequences: list[TrainingSequence]) -> dict[str, float]:
    """One optimizer step of NLL on the assistant tokens; ``train/tokens_per_s`` counts every token processed."""
    start = time.perf_counter()
    metrics = policy.train(sequences, NLLLossFn())
    elapsed = time.perf_counter() - start
    metrics["tokens_per_s"] = metrics["num_tokens"] / max(elapsed, 1e-9)
    return {f"train/{key}": value for key, value in metrics.items()}


def validation_loss(policy: Policy, sequences: list[TrainingSequence]) -> dict[str, float]:
    """Mean NLL per assistant token on held-out rows under the current weights (no update)."""
    total, count = 0.0, 0
    for sequence, logprobs in zip(sequences, policy.get_logprobs(sequences), strict=True):
        total -= math.fsum(lp for lp, m in zip(logprobs, sequence.token_mask, strict=True) if m)
        count += sum(sequence.token_mask)
    return {"val/loss": total / max(count, 1), "val/num_tokens": float(count)}


def validate(s: SFTSetup, step: int) -> dict[str, float]:
    """Validation loss on ``val_batches`` batches of held-out rows, and pass@1 on the validation tasks (episodes in
    ``<logger.log_dir>/validation/step_<step>/rollouts.jsonl``)."""
    sft = s.cfg.sft
    metrics: dict[str, float] = {}
    if s.val_sequences:
        count = sft.val_batches * sft.val_global_batch_size if sft.val_batches else len(s.val_sequences)
        metrics |= validation_loss(s.policy, s.val_sequences[:count])
    if s.environment is not None and s.generation is not None:
        training_setup.sync_policy_weights(s.policy, s.generation, s.cfg.checkpointing.checkpoint_dir)
        metrics |= training_setup.validation_metrics(
            s.environment, s.eval_rows[: sft.max_val_samples], s.cfg.policy.generation,
            num_generations=sft.val_num_generations_per_prompt, max_concurrency=sft.max_rollout_concurrency,
            seed=sft.seed, save_dir=training_setup.validation_dir(s.cfg.logger.log_dir, step),
        )  # fmt: skip
    return metrics


def save_checkpoint(s: SFTSetup, step: int, epoch: int) -> Path:
    directory = s.policy.save_checkpoint(
        step_dir(s.cfg.checkpointing.checkpoint_dir, step),
        {"step": step, "epoch": epoch, **s.trained_on},
    )
    if s.cfg.checkpointing.keep_top_k is not None:
        prune_checkpoints(s.cfg.checkpointing.checkpoint_dir, s.cfg.checkpointing.keep_top_k)
    return directory


def export_hf(policy: Policy, directory: str | Path, trained_on: dict) -> Path:
    """Write the weights as a Hugging Face model, whole or not at all: into a sibling, then renamed into place; with
    them ``trained_on`` (:func:`~nemo_tau2.trained_tasks.trained_on_record`), which an eval of the folder reads."""
    final = Path(directory)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save_hf_model(tmp)
    write_trained_on(tmp, trained_on)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def total_steps(cfg: SFTMasterConfig, num_sequences: int) -> int:
    """``max_num_steps``, or fewer when ``max_num_epochs`` over the rows end first."""
    per_epoch = math.ceil(num_sequences / cfg.policy.train_global_batch_size)
    return min(cfg.sft.max_num_steps, cfg.sft.max_num_epochs * per_epoch)


def final_hf_dir(cfg: SFTMasterConfig) -> Path:
    return Path(cfg.checkpointing.checkpoint_dir) / FINAL_HF_DIR


# ================================================================================================ the loop


def sft_train(s: SFTSetup, on_step: Callable[[int, dict[str, Any]], None] | None = None) -> list[dict]:
    """Train from ``s.start_step`` to the end of the schedule; export the final weights; ``on_step`` after each."""
    cfg, sft = s.cfg, s.cfg.sft
    batch_size = cfg.policy.train_global_batch_size
    schedule = batch_schedule(len(s.train_sequences), batch_size, sft.max_num_epochs, sft.seed, sft.shuffle)
    steps_per_epoch = math.ceil(len(s.train_sequences) / batch_size)
    total = total_steps(cfg, len(s.train_sequences))
    history = []
    if sft.val_at_start and s.start_step == 0:
        s.metrics_logger.log(0, validate(s, 0))
    for step in range(s.start_step, total):
        epoch = step // steps_per_epoch
        metrics = train_step(s.policy, [s.train_sequences[i] for i in schedule[step]])
        metrics["train/epoch"] = epoch
        done = step + 1
        last = done == total
        if (sft.val_period and done % sft.val_period == 0) or (last and sft.val_at_end):
            metrics |= validate(s, done)
        s.metrics_logger.log(done, metrics)  # before the checkpoint: a kill in between re-runs and re-logs the step
        if cfg.checkpointing.enabled and (done % cfg.checkpointing.save_period == 0 or last):
            save_checkpoint(s, done, epoch)
        history.append(metrics)
        if on_step is not None:
            on_step(done, metrics)
    export_hf(s.policy, final_hf_dir(cfg), s.export_record)
    return history
