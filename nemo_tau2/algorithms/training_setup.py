"""Setup pieces shared by the training loops (GRPO, SFT, RFT): one mechanism each, used by all of them.

The memory plan from the model's config.json, the task rows of a config, the rollout stack (the generation backend
serving the trainer's weights and the tau2 Gym servers), the weight sync into that backend, validation through the
evaluator's metrics, and the newest whole checkpoint to resume from. The configs they read share the blocks
``policy``, ``user``, ``env.nemo_gym``, ``checkpointing``, ``logger``, ``cluster`` and ``tiny_policy``.
"""

import json
import logging
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from nemo_tau2.evals.metrics import EpisodeRecord, compute_eval_metrics
from nemo_tau2.experience.rollouts import RolloutResult, SamplingParams, run_nemo_gym_rollout_sync
from nemo_tau2.generation.launch import GenerationHandle, start_generation
from nemo_tau2.gym.environment import Tau2Environment, Tau2EnvironmentSpec
from nemo_tau2.models.memory_plan import MemoryPlan, make_plan
from nemo_tau2.models.model_shape import find_model_config, model_shape
from nemo_tau2.models.policy import checkpoint as ckpt
from nemo_tau2.models.policy.lm_policy import Policy

logger = logging.getLogger(__name__)


def plan_memory(cfg: Any, *, reference: bool) -> MemoryPlan:
    """The run's memory plan (see ``models.memory_plan``), from the model's config.json only: nothing starts.

    A tiny policy that is built on first use has the tiny Llama's architecture until it exists.
    """
    name = cfg.policy.model_name
    if getattr(cfg, "tiny_policy", None) is not None and not Path(name).exists():
        from nemo_tau2.algorithms.tiny_policy import tiny_policy_architecture

        architecture, source = tiny_policy_architecture(cfg.tiny_policy), "tiny_policy (built on first run)"
    else:
        architecture, source = find_model_config(name)
    shape = model_shape(architecture, name, source)
    return make_plan(cfg.policy, cfg.cluster, reference=reference, shape=shape)


def resumable_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """The newest checkpoint that is whole: every part present and a trainer state that parses with its step.

    Checkpoints are renamed into place only once complete, but a copy, a sync or a crash of the filesystem can
    still leave a ``step_<N>`` folder with a part missing or cut short; resuming from it would fail or, worse,
    resume from garbage. Such folders are skipped with a warning naming what is wrong, and never deleted.
    """
    for step, path in reversed(ckpt.list_checkpoints(checkpoint_dir)):
        try:
            ckpt.check_checkpoint_dir(path)
            if int(ckpt.read_trainer_state(path)["step"]) != step:
                raise ValueError(f"its trainer state is for another step than {step}")
        except (OSError, ValueError, KeyError, TypeError) as e:  # JSONDecodeError is a ValueError
            logger.warning("not resuming from %s, it is incomplete: %s", path, e)
            continue
        return path
    return None


def task_rows(
    domain_names: list[str] | None,
    split: str | None,
    *,
    task_ids: list[str] | None = None,
    compact: bool = False,
    path: str | None = None,
) -> list[dict]:
    """Gym rows: from a JSONL file, or the tasks of ``split`` in each domain (only ``task_ids`` if given)."""
    from nemo_tau2.algorithms.tiny_policy import compact_rows
    from nemo_tau2.tau2_env import domains
    from nemo_tau2.tau2_env.gym_rows import task_row

    if path:
        return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if split is None:
        return []
    rows = []
    for domain in domain_names or []:
        ids = [task.id for task in domains.get_tasks(domain, split) if task_ids is None or task.id in task_ids]
        rows += compact_rows(domain, ids) if compact else [task_row(domain, i, split=split) for i in ids]
    return rows


def start_rollout_stack(
    cfg: Any, domain_names: list[str], resources: ExitStack
) -> tuple[GenerationHandle, Tau2Environment]:
    """The generation backend serving the policy's weights and the tau2 Gym servers playing episodes against it.

    Both are closed by ``resources``. Reads ``policy.generation``, ``user``, ``env.nemo_gym`` and ``logger.log_dir``.
    """
    generation = resources.enter_context(start_generation(cfg.policy.generation))
    env_cfg = cfg.env.nemo_gym
    spec = Tau2EnvironmentSpec(
        policy=generation,
        user=cfg.user.generation,
        domains=sorted(set(domain_names)),
        agent_config={
            "max_steps": env_cfg.max_steps,
            "max_errors": env_cfg.max_errors,
            "max_turns": env_cfg.max_turns,
            "user_empty_retries": env_cfg.user_empty_retries,
            "user_seed": cfg.user.seed,
            "user_strategy": cfg.user.strategy_config().model_dump(exclude_unset=True),
            "user_responses_create_params": cfg.user.responses_params(),
            "policy_retry": env_cfg.policy_retry.model_dump(),
            "user_retry": env_cfg.user_retry.model_dump(),
        },
        policy_model_server=env_cfg.policy_model_server,
        user_model_server=env_cfg.user_model_server,
        return_token_ids=True,
        log_dir=Path(cfg.logger.log_dir) / "server_logs",
        startup_timeout_s=env_cfg.server_startup_timeout_s,
    )
    environment = resources.enter_context(Tau2Environment(spec))
    return generation, environment


def sync_policy_weights(policy: Policy, generation: GenerationHandle, scratch_dir: str | Path) -> None:
    """Load the trainer's weights into the generation backend in place (no restart).

    Both ways take the same gathered stream of full tensors: copied straight into the in-process engine, or
    written as safetensors files (under ``scratch_dir``) a server reloads (vLLM, hf subprocess)."""
    if generation.engine is not None:  # hf in this process: copy tensors as they are gathered
        generation.update_weights(policy.stream_weights_for_generation())
    else:  # a generation server in another process (vLLM, hf subprocess): through a checkpoint directory
        directory = Path(scratch_dir) / "weights_for_generation"
        generation.update_weights(checkpoint_dir=str(policy.save_hf_model(directory)))


def sampling_params(generation_cfg: Any) -> SamplingParams:
    return SamplingParams(generation_cfg.temperature, generation_cfg.top_p, generation_cfg.max_new_tokens)


def rollout_pass_metrics(results: list[RolloutResult], n: int, seed: int, prefix: str) -> dict[str, float]:
    """The evaluator's metrics (pass@k, pass^k, mean reward per domain) of finished episodes, keys under ``prefix``."""
    records = [
        EpisodeRecord(
            r.domain, r.task_id, r.success, r.reward, r.status, r.termination_reason, r.num_turns, r.total_tokens
        )
        for r in results
    ]
    metrics = compute_eval_metrics(records, ks=sorted({1, n}), num_bootstrap=0, seed=seed)
    return {f"{prefix}/" + key.removeprefix("eval/"): value for key, value in metrics.items()}


def validation_metrics(
    environment: Tau2Environment,
    rows: list[dict],
    generation_cfg: Any,
    *,
    num_generations: int,
    max_concurrency: int,
    seed: int,
    prefix: str = "val",
) -> dict[str, float]:
    """Roll out ``num_generations`` episodes of each row with the served weights; the evaluator's metrics."""
    repeated = [row | {"sample_index": k} for row in rows for k in range(num_generations)]
    results = run_nemo_gym_rollout_sync(
        repeated, environment.agent_urls, sampling_params(generation_cfg), 1, max_concurrency=max_concurrency
    )
    return rollout_pass_metrics(results, num_generations, seed, prefix)
