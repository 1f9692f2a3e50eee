"""GRPO on tau2, one loop that reads top to bottom.

Each step: (1) **generate** ``num_prompts_per_step`` train rows (curriculum-weighted) x
``num_generations_per_prompt`` episodes through ``run_async_nemo_gym_rollout`` against the generation backend that
serves the current weights, repeating with dynamic sampling until the batch has enough groups with reward variance;
(2) **score**: the training reward is tau2's binary success plus optional partial credit (slime's shaping);
episodes with infrastructure errors are dropped, over-long ones filtered or penalised; (3) **advantages**:
leave-one-out group baseline, optionally std-normalised; (4) **train** on exactly the sampled token ids (loss only
on policy-generated tokens; clipped ratio, optional KL, importance correction between generation and training
logprobs); (5) **sync** the new weights into the generation backend in place; (6) **log**, validate every
``val_period`` steps with the evaluator's metrics, checkpoint every ``save_period`` steps.

Async GRPO (``grpo.async_grpo.enabled``, NeMo-RL's semantics) is the same loop: step (1) takes the oldest groups
within ``max_trajectory_age_steps`` from the replay buffer that :class:`AsyncCollector` fills beside the trainer
(scored and filtered as in (1)-(2)), and (5) pauses the collector while the weights load; see
:mod:`nemo_tau2.algorithms.async_collector` for its bound, weight updates and checkpoints.

References: GRPO (Shao et al. 2024, https://arxiv.org/abs/2402.03300); RLOO baseline (Ahmadian et al. 2024,
https://arxiv.org/abs/2402.14740); dynamic sampling (DAPO, https://arxiv.org/abs/2503.14476); NeMo-RL's
``grpo_train`` for names and semantics.
"""

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nemo_tau2.algorithms import training_setup
from nemo_tau2.algorithms.advantages import compute_advantages
from nemo_tau2.algorithms.agreement import generation_agreement
from nemo_tau2.algorithms.async_collector import AsyncCollector
from nemo_tau2.algorithms.curriculum import TaskCurriculum, record_successes, task_key
from nemo_tau2.algorithms.grpo_config import GRPOMasterConfig
from nemo_tau2.algorithms.loss import ClippedPGLossFn
from nemo_tau2.algorithms.prompt_fit import check_prompts_fit
from nemo_tau2.algorithms.sampling import DynamicSampler, EpisodeGroup, flatten_groups, score_rollouts
from nemo_tau2.algorithms.train_rollouts import TrainRolloutLog, failure_causes
from nemo_tau2.algorithms.training_setup import (  # noqa: F401  (resumable_checkpoint, checkpoint_step: this module's API)
    checkpoint_step,
    resumable_checkpoint,
    start_rollout_stack,
    sync_policy_weights,
    train_and_val_rows,
    validation_dir,
    validation_metrics,
)
from nemo_tau2.evals.results import describe_causes
from nemo_tau2.experience.progress import RolloutProgress
from nemo_tau2.experience.rollouts import RolloutResult, SamplingParams, rollout_metrics, run_async_nemo_gym_rollout
from nemo_tau2.generation.launch import GenerationHandle
from nemo_tau2.gym.environment import Tau2Environment
from nemo_tau2.models.memory_plan import MemoryPlan
from nemo_tau2.models.policy.checkpoint import prune_checkpoints, step_dir
from nemo_tau2.models.policy.data import TrainingSequence, sequence_from_message_log
from nemo_tau2.models.policy.lm_policy import Policy
from nemo_tau2.utils.metrics_logger import MetricsLogger

logger = logging.getLogger(__name__)


@dataclass
class GRPOSetup:
    """Everything the loop needs, built by :func:`setup`; ``close()`` stops servers and workers."""

    cfg: GRPOMasterConfig
    policy: Policy
    generation: GenerationHandle
    environment: Tau2Environment
    train_rows: list[dict]
    val_rows: list[dict]
    curriculum: TaskCurriculum
    metrics_logger: MetricsLogger
    start_step: int = 0
    resources: ExitStack = field(default_factory=ExitStack)
    on_rollout_progress: Callable[[RolloutProgress], None] | None = None  # e.g. a progress bar's postfix
    collector: AsyncCollector | None = None  # async GRPO (grpo.async_grpo.enabled): generates beside the trainer
    rollout_log: TrainRolloutLog | None = None  # each step's episodes on disk (logger.save_rollouts)
    trained_on: dict = field(default_factory=dict)  # tau2 release and retrieval variant, in every checkpoint

    def close(self) -> None:
        self.resources.close()


def _task_key(row: dict) -> str:
    return task_key(row["domain"], row["task_id"], row.get("pivot_id"))


@contextmanager
def _timed(timings: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    timings[f"timing/{name}_s"] = time.perf_counter() - start


# ================================================================================================ setup


def plan_memory(cfg: GRPOMasterConfig) -> MemoryPlan:
    """The run's memory plan (see ``training_setup.plan_memory``): nothing starts."""
    return training_setup.plan_memory(cfg, reference=cfg.loss_fn.reference_policy_kl_penalty > 0)


def setup(cfg: GRPOMasterConfig, train_rows: list[dict], val_rows: list[dict]) -> GRPOSetup:
    """Start the trainer, the generation backend, the tau2 environment; resume from the latest checkpoint."""
    resources = ExitStack()
    try:
        check_prompts_fit(cfg.policy, cfg.tau2.retrieval_variant, train_rows, val_rows)
        training_setup.open_cluster(cfg, resources)  # first: the trainer's workers and the Gym servers join it
        torch.manual_seed(cfg.grpo.seed)
        policy = Policy(
            cfg.policy, init_reference_model=cfg.loss_fn.reference_policy_kl_penalty > 0, seed=cfg.grpo.seed
        )
        resources.callback(policy.shutdown)
        generation, environment = start_rollout_stack(
            cfg, [str(row["domain"]) for row in train_rows + val_rows], resources
        )
        curriculum = TaskCurriculum([_task_key(row) for row in train_rows], cfg.grpo.curriculum, cfg.grpo.seed)
        metrics_logger = resources.enter_context(MetricsLogger(cfg.logger))
        start_step, state = 0, None
        played = training_setup.trained_on(cfg, train_rows + val_rows)
        latest = (
            resumable_checkpoint(cfg.checkpointing.checkpoint_dir, cfg.policy, played=played)
            if cfg.checkpointing.enabled
            else None
        )
        if latest is not None:
            state = policy.load_checkpoint(latest)
            start_step = int(state["step"])
            curriculum.load_state_dict(state["curriculum"])
            logger.info("resumed from %s at step %d", latest, start_step)
        rollout_log = TrainRolloutLog(cfg.logger.log_dir, cfg.logger.save_rollouts, start_step)
        resources.callback(rollout_log.close)
        collector = None
        if cfg.grpo.async_grpo.enabled:  # started by grpo_train; restores the prompts not yet trained (its docs)
            sampling = SamplingParams.from_generation(cfg.policy.generation)
            collector = AsyncCollector(
                cfg.grpo, train_rows, curriculum, environment.agent_urls, sampling, start_step, state, rollout_log
            )
            resources.callback(collector.stop)  # before the servers it talks to stop
        s = GRPOSetup(
            cfg,
            policy,
            generation,
            environment,
            train_rows,
            val_rows,
            curriculum,
            metrics_logger,
            start_step,
            resources,
            collector=collector,
            rollout_log=rollout_log,
            trained_on=played,
        )
        if latest is not None:  # the generation backend must serve the resumed weights, labelled with their step
            sync_policy_weights(policy, generation, cfg.checkpointing.checkpoint_dir, weight_version=start_step)
        return s
    except BaseException:
        resources.close()
        raise


# ================================================================================================ the steps


def generate(s: GRPOSetup, step: int) -> tuple[list[EpisodeGroup], list[RolloutResult], dict[str, float]]:
    """Roll out prompt groups (several generation batches with dynamic sampling) and score each episode."""
    grpo, generation = s.cfg.grpo, s.cfg.policy.generation
    n = grpo.num_generations_per_prompt
    sampling = SamplingParams.from_generation(generation)
    sampler = DynamicSampler(grpo.sampling_config(), target_num_groups=grpo.num_prompts_per_step)
    all_results: list[RolloutResult] = []
    batch = 0
    while not sampler.is_full:
        too_few_rows = len(s.train_rows) < grpo.num_prompts_per_step
        indices = s.curriculum.sample(grpo.num_prompts_per_step, replace=too_few_rows)
        rows = [s.train_rows[i] for i in indices for _ in range(n)]
        results = _roll_out(s, rows, sampling, step)
        group_ids = [f"{step}.{batch}.{result.group_index}" for result in results]
        record_successes(s.curriculum, results)
        sampler.add_generation_batch(score_rollouts(results, group_ids, grpo.reward_shaping))
        all_results += results
        batch += 1
    groups, sampling_metrics = sampler.take()
    return groups, all_results, sampling_metrics


def _roll_out(s: GRPOSetup, rows: list[dict], sampling: SamplingParams, step: int) -> list[RolloutResult]:
    """One generation batch's episodes in input order; each group's go to the step's episode file as it ends."""
    log = s.rollout_log

    async def collect() -> list[RolloutResult]:
        results: list[RolloutResult] = []
        async for group in run_async_nemo_gym_rollout(
            rows,
            s.environment.agent_urls,
            sampling,
            s.cfg.grpo.num_generations_per_prompt,
            max_concurrency=s.cfg.grpo.max_rollout_concurrency,
            keep_full_result=log is not None and log.keeps_transcripts,
            on_progress=s.on_rollout_progress,
        ):
            if log is not None:
                log.write(step + 1, group.results)  # numbered as metrics.jsonl numbers the step
            results.extend(group.results)
        return sorted(results, key=lambda r: r.row_index)

    return asyncio.run(collect())


def training_sequences(s: GRPOSetup, groups: list[EpisodeGroup]) -> tuple[list[TrainingSequence], dict]:
    """Advantages per episode, then one training sequence per episode that has generated tokens."""
    episodes, group_ids = flatten_groups(groups)
    if not episodes:  # every episode of the step failed: nothing to weigh
        return [], {"train/num_untrainable_episodes": 0, "train/num_sequences": 0}
    rewards = torch.tensor([episode.reward for episode in episodes], dtype=torch.float32)
    advantages = compute_advantages(rewards, torch.tensor(group_ids), s.cfg.grpo.advantage_config())
    sequences, untrainable = [], 0
    for episode, advantage in zip(episodes, advantages.tolist(), strict=True):
        result: RolloutResult = episode.data
        if not result.message_log:
            untrainable += 1  # no token data (or broken at its first turn): counted, not trained on
            continue
        sequences.append(
            sequence_from_message_log(
                result.message_log,
                advantage,
                loss_multiplier=episode.loss_multiplier,
                max_total_sequence_length=s.cfg.policy.max_total_sequence_length,
                truncate=True,
            )
        )
    metrics = {
        "train/advantages/mean": float(advantages.mean()),
        "train/advantages/std": float(advantages.std()) if len(advantages) > 1 else 0.0,
        "train/advantages/abs_max": float(advantages.abs().max()),
        "train/shaped_reward/mean": float(rewards.mean()),
        "train/num_untrainable_episodes": untrainable,
        "train/num_sequences": len(sequences),
    }
    return sequences, metrics


def train(s: GRPOSetup, sequences: list[TrainingSequence], step: int) -> dict[str, float]:
    """Attach the trainer's (and reference) logprobs, check them against the generator's on the episodes its
    current weights (those of ``step``) sampled (the last weight sync must be what generated them; async GRPO's
    older turns differ by their staleness, which the importance correction weighs), then one update on exactly the
    sampled tokens. A step with no episode to train on (none has token data: every generation cut at its first turn,
    or every episode failed) updates nothing, with a warning: ``train/num_sequences`` 0 in its metrics."""
    if not sequences:
        logger.warning("step %d: no episode has tokens to train on; the weights stay as they were", step + 1)
        return {}
    for sequence, logprobs in zip(sequences, s.policy.get_logprobs(sequences), strict=True):
        sequence.prev_logprobs = logprobs
    agreement = generation_agreement(sequences, weight_version=step)
    agreement = {f"generation_agreement/{key}": value for key, value in agreement.items()}
    if s.policy.has_reference_model:
        for sequence, logprobs in zip(sequences, s.policy.get_reference_policy_logprobs(sequences), strict=True):
            sequence.reference_logprobs = logprobs
    metrics = agreement | s.policy.train(sequences, ClippedPGLossFn(s.cfg.loss_fn))
    return {f"train/{key}": value for key, value in metrics.items()}


def sync_weights(s: GRPOSetup, weight_version: int) -> None:
    """Load the trainer's weights (those after ``weight_version`` steps, the label each completion they generate
    reports) into the generation backend in place.

    Async: the collector stops starting episodes meanwhile; without in-flight updates it first lets the running
    ones finish (no episode mixes two weight versions), with them they run on and their later turns use the new
    weights (a turn never mixes: the servers finish the turns in progress first)."""
    async_grpo = s.cfg.grpo.async_grpo
    with s.collector.paused(weight_version) if s.collector is not None else nullcontext():
        sync_policy_weights(
            s.policy, s.generation, s.cfg.checkpointing.checkpoint_dir, weight_version, async_grpo.recompute_kv_cache()
        )


def validate(s: GRPOSetup, step: int) -> dict[str, float]:
    """The evaluator's metrics (pass@k, pass^k, mean reward per domain) on the validation rows; the episodes go to
    ``<logger.log_dir>/validation/step_<step>/rollouts.jsonl``. The async collector waits meanwhile."""
    grpo = s.cfg.grpo
    with s.collector.paused() if s.collector is not None else nullcontext():
        return validation_metrics(
            s.environment, s.val_rows[: grpo.max_val_samples], s.cfg.policy.generation,
            num_generations=grpo.val_num_generations_per_prompt, max_concurrency=grpo.max_rollout_concurrency,
            seed=grpo.seed, save_dir=validation_dir(s.cfg.logger.log_dir, step), on_progress=s.on_rollout_progress,
        )  # fmt: skip


def save_checkpoint(s: GRPOSetup, step: int) -> Path:
    """Weights, optimizer, the curriculum and (async) the prompts drawn but not yet trained (regenerated on resume);
    the tau2 release trained on."""
    state = s.collector.state_dict() if s.collector is not None else {"curriculum": s.curriculum.state_dict()}
    state |= {"step": step, **s.trained_on}
    directory = s.policy.save_checkpoint(step_dir(s.cfg.checkpointing.checkpoint_dir, step), state)
    if s.cfg.checkpointing.keep_top_k is not None:
        prune_checkpoints(s.cfg.checkpointing.checkpoint_dir, s.cfg.checkpointing.keep_top_k)
    return directory


# ================================================================================================ the loop


def grpo_train(s: GRPOSetup, on_step: Callable[[int, dict[str, float]], None] | None = None) -> list[dict]:
    """Train from ``s.start_step`` to ``grpo.max_num_steps``; ``on_step(step, metrics)`` after each step."""
    cfg = s.cfg
    history = []
    if cfg.grpo.val_at_start and s.start_step == 0 and s.val_rows:
        s.metrics_logger.log(0, validate(s, 0))
    if s.collector is not None:
        s.collector.start()  # async: from here on, groups are generated while the trainer trains
    for step in range(s.start_step, cfg.grpo.max_num_steps):
        timings: dict[str, float] = {}
        with _timed(timings, "step"):
            with _timed(timings, "rollout"):  # async: take the oldest groups within the age bound from the buffer
                groups, results, metrics = s.collector.take(step) if s.collector else generate(s, step)
            with _timed(timings, "train"):
                sequences, advantage_metrics = training_sequences(s, groups)
                metrics |= advantage_metrics | train(s, sequences, step)
            with _timed(timings, "weight_sync"):
                sync_weights(s, weight_version=step + 1)
        metrics |= s.collector.step_metrics() if s.collector else {}
        metrics |= timings | {f"train/rollout/{k}": v for k, v in rollout_metrics(results).items()}
        metrics |= _per_domain_success(results)
        metrics["train/tokens_per_s"] = sum(len(q) for q in sequences) / max(timings["timing/train_s"], 1e-9)
        done = step + 1
        _log_failures(s, done, results)
        last = done == cfg.grpo.max_num_steps
        if s.val_rows and (
            (cfg.grpo.val_period and done % cfg.grpo.val_period == 0) or (last and cfg.grpo.val_at_end)
        ):
            with _timed(metrics, "validation"):  # timing/validation_s: the report stacks it on the step's time
                metrics |= validate(s, done)
        s.metrics_logger.log(done, metrics)  # before the checkpoint: a kill in between re-runs and re-logs the step
        if cfg.checkpointing.enabled and (done % cfg.checkpointing.save_period == 0 or last):
            save_checkpoint(s, done)
        history.append(metrics)
        if on_step is not None:
            on_step(done, metrics)
    return history


def _log_failures(s: GRPOSetup, step: int, results: list[RolloutResult]) -> None:
    """One line per step with failed episodes: how many, their most frequent causes, and where each is recorded."""
    causes = failure_causes(results)
    if not causes:
        return
    where = (
        f"; each with its cause in {s.rollout_log.path(step)}"
        if s.rollout_log and s.rollout_log.save != "none"
        else ""
    )
    logger.warning(
        "step %d: %d of %d episode(s) dropped with infrastructure errors: %s%s",
        step, causes.total(), len(results), describe_causes(causes), where,
    )  # fmt: skip


def _per_domain_success(results: list[RolloutResult]) -> dict[str, Any]:
    out = {}
    for domain in sorted({r.domain for r in results}):
        valid = [r for r in results if r.domain == domain and r.ok]
        if valid:
            out[f"train/{domain}/success_rate"] = sum(r.success for r in valid) / len(valid)
            out[f"train/{domain}/mean_reward"] = sum(r.reward for r in valid) / len(valid)
    return out


def load_rows(cfg: GRPOMasterConfig) -> tuple[list[dict], list[dict]]:
    """Training and validation rows: from JSONL files, or the configured splits of ``data.domains``."""
    return train_and_val_rows(cfg.data, tau2=cfg.tau2)
