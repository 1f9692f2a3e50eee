"""Rejection-sampling fine-tuning (RFT) on tau2, one loop that reads top to bottom.

Each round: (1) **sample** ``num_generations_per_prompt`` episodes of every train task through
``run_async_nemo_gym_rollout`` with the current weights (served by ``policy.generation``); their success is the
round's train pass@1; (2) **keep** the episodes with reward >= ``min_reward`` (1.0: the successes), deduplicated and
capped per task, as SFT rows with the generator's own token ids (``sft_data.row_from_result``); (3) **fine-tune** on
them with SFT's step (NLL on assistant tokens); (4) **validate** (pass@1 on the validation tasks), **log** and
**checkpoint** the round. A round in which no episode succeeds is reported (``rft/num_kept`` 0 and a warning) and
trains nothing; the next round samples again. The final weights go to ``<checkpoint_dir>/final_hf`` for GRPO.

slime's tau2 pipeline runs this between SFT and GRPO (SFT 8.6% -> RFT 27.0% pass@4 for Qwen3-4B, peers.md).
"""

import logging
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nemo_tau2.algorithms import training_setup
from nemo_tau2.algorithms.prompt_fit import check_prompts_fit
from nemo_tau2.algorithms.reward_shaping import partial_credit
from nemo_tau2.algorithms.rft_config import RFTMasterConfig, RFTSettings
from nemo_tau2.algorithms.sft import FINAL_HF_DIR, batch_schedule, export_hf, sequences_of, train_step
from nemo_tau2.algorithms.sft_data import ConversionReport, row_from_result, select_rows
from nemo_tau2.experience.rollouts import RolloutResult, SamplingParams, rollout_metrics, run_nemo_gym_rollout_sync
from nemo_tau2.generation.launch import GenerationHandle
from nemo_tau2.gym.environment import Tau2Environment
from nemo_tau2.models.memory_plan import MemoryPlan
from nemo_tau2.models.policy.checkpoint import prune_checkpoints, step_dir
from nemo_tau2.models.policy.lm_policy import Policy
from nemo_tau2.trained_tasks import trained_on_record
from nemo_tau2.utils.metrics_logger import MetricsLogger

logger = logging.getLogger(__name__)


@dataclass
class RFTSetup:
    """Everything the loop needs, built by :func:`setup`; ``close()`` stops servers and workers."""

    cfg: RFTMasterConfig
    policy: Policy
    generation: GenerationHandle
    environment: Tau2Environment
    train_rows: list[dict]
    val_rows: list[dict]
    metrics_logger: MetricsLogger
    start_round: int = 0
    kept_so_far: list[dict] = field(default_factory=list)
    resources: ExitStack = field(default_factory=ExitStack)
    trained_on: dict = field(default_factory=dict)  # tau2 release and retrieval variant, in every checkpoint
    export_record: dict = field(default_factory=dict)  # what the exported model records it trained on (tasks too)

    def close(self) -> None:
        self.resources.close()


# ================================================================================================ setup


def plan_memory(cfg: RFTMasterConfig) -> MemoryPlan:
    return training_setup.plan_memory(cfg, reference=False)


def load_rows(cfg: RFTMasterConfig) -> tuple[list[dict], list[dict]]:
    """Training and validation rows, as GRPO's ``data`` block selects them (of the release ``tau2`` names)."""
    return training_setup.train_and_val_rows(cfg.data, tau2=cfg.tau2)


def setup(cfg: RFTMasterConfig, train_rows: list[dict], val_rows: list[dict]) -> RFTSetup:
    """Start the trainer, the generation backend, the tau2 environment; resume from the latest round's checkpoint."""
    resources = ExitStack()
    try:
        check_prompts_fit(cfg.policy, cfg.tau2.retrieval_variant, train_rows, val_rows)
        training_setup.open_cluster(cfg, resources)  # first: the trainer's workers and the Gym servers join it
        torch.manual_seed(cfg.rft.seed)
        policy = Policy(cfg.policy, seed=cfg.rft.seed)
        resources.callback(policy.shutdown)
        generation, environment = training_setup.start_rollout_stack(
            cfg, [str(row["domain"]) for row in train_rows + val_rows], resources
        )
        metrics_logger = resources.enter_context(MetricsLogger(cfg.logger))
        played = training_setup.trained_on(cfg, train_rows + val_rows)
        s = RFTSetup(cfg, policy, generation, environment, train_rows, val_rows, metrics_logger, resources=resources,
                     trained_on=played,
                     export_record=trained_on_record(played, train_rows, cfg.policy.model_name))  # fmt: skip
        latest = (
            training_setup.resumable_checkpoint(cfg.checkpointing.checkpoint_dir, cfg.policy, played=played)
            if cfg.checkpointing.enabled
            else None
        )
        if latest is not None:
            state = policy.load_checkpoint(latest)
            s.start_round, s.kept_so_far = int(state["step"]), list(state.get("kept_so_far", []))
            sync_weights(s)  # the generation backend must serve the resumed weights
            logger.info("resumed from %s after round %d", latest, s.start_round)
        return s
    except BaseException:
        resources.close()
        raise


# ================================================================================================ the steps


def sync_weights(s: RFTSetup) -> None:
    training_setup.sync_policy_weights(s.policy, s.generation, s.cfg.checkpointing.checkpoint_dir)


def sample(s: RFTSetup) -> list[RolloutResult]:
    """``n`` episodes of every train task with the served weights (groups of ``n``, sample indices 0..n-1)."""
    n = s.cfg.rft.num_generations_per_prompt
    rows = [row for row in s.train_rows for _ in range(n)]
    return run_nemo_gym_rollout_sync(
        rows, s.environment.agent_urls, SamplingParams.from_generation(s.cfg.policy.generation), n,
        max_concurrency=s.cfg.rft.max_rollout_concurrency,
    )  # fmt: skip


def keep(s: RFTSetup, results: list[RolloutResult]) -> tuple[list[dict], dict[str, float]]:
    """The episodes to fine-tune on, as SFT rows (the generator's token ids), and how many were dropped why."""
    rft = s.cfg.rft
    report = ConversionReport()
    rows = []
    for result in results:
        row = row_from_result(result)
        if row is None:
            report.skip("no trainable tokens")
        else:
            rows.append(row)
    kept = select_rows(
        rows, report, min_reward=rft.min_reward, max_per_task=rft.max_per_task, dedup=rft.dedup,
        allow_test_split=rft.allow_test_split, tau2=s.cfg.tau2,
    )  # fmt: skip
    fallback = best_partial_rows(rows, results, {(row["domain"], row["task_id"]) for row in kept}, rft)
    metrics = {"rft/num_kept": float(len(kept) + len(fallback)), "rft/num_sampled": float(len(results))}
    metrics["rft/num_partial_kept"] = float(len(fallback))
    kept += fallback
    metrics["rft/num_tasks_kept"] = float(len({(row["domain"], row["task_id"]) for row in kept}))
    for reason, count in report.skipped.items():
        metrics[f"rft/skipped/{reason}"] = float(count)
    return kept, metrics


def best_partial_rows(
    rows: list[dict], results: list[RolloutResult], tasks_kept: set[tuple[str, str]], rft: RFTSettings
) -> list[dict]:
    """slime's fallback: each task with nothing kept gives its best episode if its partial credit (tau2's action,
    environment and communication checks, weighted as ``rft.reward_shaping``) reaches ``rft.partial_fallback``."""
    if rft.partial_fallback is None:
        return []
    credit = {
        (r.domain, r.task_id, r.sample_index): partial_credit(
            r.reward_components, rft.reward_shaping.weights_for(r.domain)
        )
        for r in results
        if r.ok
    }
    best: dict[tuple[str, str], tuple[float, dict]] = {}
    for row in rows:
        task = (row["domain"], row["task_id"])
        score = credit.get((row["domain"], row["task_id"], row["sample_index"]), 0.0)
        if task not in tasks_kept and score >= rft.partial_fallback and score > best.get(task, (-1.0, {}))[0]:
            best[task] = (score, row)
    return [row for _, row in best.values()]


def fine_tune(s: RFTSetup, rows: list[dict], round_index: int) -> dict[str, float]:
    """SFT's step over the kept rows, ``num_epochs_per_round`` passes; metrics are the mean over the steps."""
    cfg = s.cfg
    sequences = sequences_of(rows, cfg.policy.max_total_sequence_length)
    if not sequences:
        return {}
    schedule = batch_schedule(
        len(sequences), cfg.policy.train_global_batch_size, cfg.rft.num_epochs_per_round, cfg.rft.seed + round_index,
        shuffle=True,
    )  # fmt: skip
    steps = [train_step(s.policy, [sequences[i] for i in batch]) for batch in schedule]
    mean = {key: sum(step[key] for step in steps) / len(steps) for key in steps[0]}
    return mean | {"train/num_optimizer_steps": float(len(steps))}


def validate(s: RFTSetup, round_done: int) -> dict[str, float]:
    """pass@k on the validation tasks after ``round_done`` rounds (episodes in ``<log_dir>/validation/step_<N>``)."""
    rft = s.cfg.rft
    return training_setup.validation_metrics(
        s.environment, s.val_rows[: rft.max_val_samples], s.cfg.policy.generation,
        num_generations=rft.val_num_generations_per_prompt, max_concurrency=rft.max_rollout_concurrency, seed=rft.seed,
        save_dir=training_setup.validation_dir(s.cfg.logger.log_dir, round_done),
    )  # fmt: skip


def save_checkpoint(s: RFTSetup, round_done: int) -> Path:
    state = {"step": round_done, "kept_so_far": s.kept_so_far if s.cfg.rft.accumulate else []}
    state |= s.trained_on
    directory = s.policy.save_checkpoint(step_dir(s.cfg.checkpointing.checkpoint_dir, round_done), state)
    if s.cfg.checkpointing.keep_top_k is not None:
        prune_checkpoints(s.cfg.checkpointing.checkpoint_dir, s.cfg.checkpointing.keep_top_k)
    return directory


# ================================================================================================ the loop


def rft_train(s: RFTSetup, on_round: Callable[[int, dict[str, Any]], None] | None = None) -> list[dict]:
    """Rounds ``s.start_round + 1 .. num_rounds``; ``on_round(round, metrics)`` after each; exports the final model."""
    cfg, rft = s.cfg, s.cfg.rft
    history = []
    if rft.val_at_start and s.start_round == 0 and s.val_rows:
        start = validate(s, 0)
        s.metrics_logger.log(0, start)
        if on_round is not None:
            on_round(0, start)
    for round_index in range(s.start_round, rft.num_rounds):
        results = sample(s)
        metrics = {f"train/rollout/{k}": v for k, v in rollout_metrics(results).items()}
        metrics |= training_setup.rollout_pass_metrics(results, rft.num_generations_per_prompt, rft.seed, "train")
        kept, keep_metrics = keep(s, results)
        metrics |= keep_metrics
        if not kept:
            logger.warning(
                "RFT round %d: no episode of %d reached reward %.2f: nothing to fine-tune on this round",
                round_index + 1, len(results), rft.min_reward,
            )  # fmt: skip
        s.kept_so_far = (s.kept_so_far + kept) if rft.accumulate else kept
        if s.kept_so_far:
            metrics |= fine_tune(s, s.kept_so_far, round_index)
            sync_weights(s)
        if s.val_rows:
            metrics |= validate(s, round_index + 1)
        done = round_index + 1
        s.metrics_logger.log(done, metrics)
        if cfg.checkpointing.enabled:
            save_checkpoint(s, done)
        history.append(metrics)
        if on_round is not None:
            on_round(done, metrics)
    export_hf(s.policy, Path(cfg.checkpointing.checkpoint_dir) / FINAL_HF_DIR, s.export_record)
    return history
