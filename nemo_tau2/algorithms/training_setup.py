"""Setup pieces shared by the training loops (GRPO, SFT, RFT): one mechanism each, used by all of them.

The memory plan from the model's config.json, the task rows of a ``data`` block, the rollout stack (the generation
backend serving the trainer's weights and the tau2 Gym servers), the weight sync into that backend, validation through
the evaluator's metrics, and the newest whole checkpoint to resume from. The configs they read share the blocks
``policy``, ``user``, ``env.nemo_gym``, ``checkpointing``, ``logger``, ``cluster`` and ``tiny_policy``.
"""

import asyncio
import logging
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from nemo_tau2.evals.metrics import EpisodeRecord, compute_eval_metrics
from nemo_tau2.evals.results import RolloutLog, record_of, write_system_prompts
from nemo_tau2.experience.progress import RolloutProgress
from nemo_tau2.experience.rollouts import RolloutResult, SamplingParams, run_async_nemo_gym_rollout
from nemo_tau2.generation.launch import GenerationHandle, start_generation
from nemo_tau2.gym.environment import Tau2Environment, Tau2EnvironmentSpec, run_ray
from nemo_tau2.models.memory_plan import MemoryPlan, make_plan
from nemo_tau2.models.model_shape import find_model_config, model_shape
from nemo_tau2.models.policy import checkpoint as ckpt
from nemo_tau2.models.policy.config import PolicyConfig
from nemo_tau2.models.policy.lm_policy import Policy
from nemo_tau2.models.policy.megatron_config import megatron_layout
from nemo_tau2.ray_output import RAY_LOG_FILE
from nemo_tau2.tau2_env import gym_rows
from nemo_tau2.tau2_release.client import KNOWLEDGE_DOMAINS
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig
from nemo_tau2.tau2_release.rows import check_release, release_rows

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


def trained_on(cfg: Any, rows: Iterable[dict]) -> dict[str, str | None]:
    """What a run's checkpoints record they were trained on, and what a resume must match: the tau2 release, and the
    retrieval variant (``tau2.retrieval_variant``) when a row is a knowledge domain's, whose prompts, tools and
    retrieval are the variant's (None otherwise: nothing the run plays depends on it)."""
    knowledge = any(str(row.get("domain")) in KNOWLEDGE_DOMAINS for row in rows)
    return {"tau2_version": cfg.tau2.version, "retrieval_variant": cfg.tau2.retrieval_variant if knowledge else None}


def resumable_checkpoint(checkpoint_dir: str | Path, policy: PolicyConfig, *, played: dict) -> Path | None:
    """The newest checkpoint that is whole: every part present and a trainer state that parses with its step.

    Checkpoints are renamed into place only once complete, but a copy, a sync or a crash of the filesystem can
    still leave a ``step_<N>`` folder with a part missing or cut short; resuming from it would fail or, worse,
    resume from garbage. Such folders are skipped with a warning naming what is wrong, and never deleted. A whole
    checkpoint this run cannot resume (the other backend, another Megatron layout than ``policy``'s, another tau2
    release or retrieval variant than ``played``, :func:`trained_on`'s) stops the run in one line
    (:class:`~nemo_tau2.models.policy.checkpoint.CheckpointMismatchError`), before anything starts: starting afresh
    beside it would train from scratch without a word.
    """
    layout = megatron_layout(policy.megatron_cfg, policy.num_workers)
    for step, path in reversed(ckpt.list_checkpoints(checkpoint_dir)):
        try:
            ckpt.check_checkpoint_dir(path, layout)
            if int(ckpt.read_trainer_state(path)["step"]) != step:
                raise ValueError(f"its trainer state is for another step than {step}")
            check_checkpoint_release(path, played)
        except ckpt.CheckpointMismatchError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as e:  # JSONDecodeError is a ValueError
            logger.warning("not resuming from %s, it is incomplete: %s", path, e)
            continue
        return path
    return None


def check_checkpoint_release(path: Path, played: dict) -> None:
    """Refuse to resume from a checkpoint trained on another tau2 release (its tasks, tools and scores were that
    release's) or another retrieval variant than the run's (:func:`trained_on`; every training loop saves it in its
    trainer state). A checkpoint that names no release predates the choice: v0.2.1; one that names no variant
    played no knowledge domain."""
    state = ckpt.read_trainer_state(path)
    trained = state.get("tau2_version", "v0.2.1")
    if trained != played["tau2_version"]:
        raise ckpt.CheckpointMismatchError(
            f"{path} was trained on tau2 {trained}, this run is tau2.version {played['tau2_version']}: resume with "
            "that release, or set another checkpointing.checkpoint_dir"
        )
    variant = state.get("retrieval_variant")
    if variant != played["retrieval_variant"]:
        raise ckpt.CheckpointMismatchError(
            f"{path} was trained with retrieval variant {variant}, this run plays {played['retrieval_variant']} "
            "(tau2.retrieval_variant, data.domains): resume with that variant, or set another "
            "checkpointing.checkpoint_dir"
        )


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint (from :func:`resumable_checkpoint`) was taken after."""
    return int(ckpt.read_trainer_state(path)["step"])


def train_and_val_rows(
    data: Any, what: str = "data", tau2: Tau2ReleaseConfig | None = None
) -> tuple[list[dict], list[dict]]:
    """Training and validation rows of a ``data`` block with GRPO's keys (``train_split`` / ``train_data_path``,
    ``val_split`` / ``val_data_path``, ``domains``, ``task_ids``, ``compact_rows``); messages name those keys.
    A release other than v0.2.1 (``tau2``) gives its own tasks and splits, through its worker."""
    release = tau2 if tau2 is not None and tau2.version != "v0.2.1" else None
    common = {"domains_": data.domains, "task_ids": data.task_ids, "compact": data.compact_rows, "what": what}

    def rows_of(split: str | None, split_key: str, path: str | None, path_key: str) -> list[dict]:
        if release is None or path or split is None:
            rows = gym_rows.load_rows(data_path=path, split=split, split_key=split_key, path_key=path_key, **common)
            check_release(rows, tau2.version if tau2 is not None else "v0.2.1", f"{what}.{path_key}")
            return rows
        return release_rows(release, data.domains or [], split, data.task_ids, what=what, compact=data.compact_rows)

    train_rows = rows_of(data.train_split, "train_split", data.train_data_path, "train_data_path")
    if not train_rows:
        raise ValueError(f"the config selects no training rows ({what}.domains, {what}.train_split, {what}.task_ids)")
    val_rows = rows_of(data.val_split, "val_split", data.val_data_path, "val_data_path")
    return train_rows, val_rows


def open_cluster(cfg: Any, resources: ExitStack) -> None:
    """Join (or start) the run's Ray before anything that uses it, closed by ``resources`` after them.

    The trainer's Ray workers (``policy.num_workers`` > 1) and the Ray-placed Gym servers then share one cluster:
    ``cluster.ray_address``'s when set, so the trainer's ranks are placed there too, or a local one sized for both
    (a Ray started by the trainer alone would hold only its own ranks' CPUs, and the Gym servers found no room).
    A run that uses no Ray starts none.
    """
    cluster, gym = cfg.cluster, cfg.env.nemo_gym
    on_ray = cluster.gym_placement == "ray" or cluster.generation_placement == "ray"
    if cluster.ray_address is None and not on_ray and cfg.policy.num_workers == 1:
        return
    trainer_cpus = cfg.policy.num_workers if cfg.policy.num_workers > 1 else 0
    output_log = Path(cfg.logger.log_dir) / RAY_LOG_FILE  # Ray's node-death dumps: not between the step rows
    resources.enter_context(
        run_ray(cluster, gym, cfg.policy.generation, trainer_cpus=trainer_cpus, output_log=output_log)
    )


def start_rollout_stack(
    cfg: Any, domain_names: list[str], resources: ExitStack
) -> tuple[GenerationHandle, Tau2Environment]:
    """The generation backend serving the policy's weights and the tau2 Gym servers playing episodes against it.

    Both are closed by ``resources``. Reads ``policy.generation``, ``user``, ``env.nemo_gym``, ``cluster`` (where the
    Gym servers run) and ``logger.log_dir``.
    """
    server_logs = Path(cfg.logger.log_dir) / "server_logs"
    generation = resources.enter_context(
        start_generation(cfg.policy.generation, cluster=cfg.cluster, log_dir=server_logs)
    )
    spec = Tau2EnvironmentSpec(
        policy=generation,
        user=cfg.user,
        domains=sorted(set(domain_names)),
        gym=cfg.env.nemo_gym,
        log_dir=server_logs,
        cluster=cfg.cluster,
        tau2=getattr(cfg, "tau2", None) or Tau2ReleaseConfig(),
    )
    environment = resources.enter_context(Tau2Environment(spec))
    return generation, environment


def sync_policy_weights(
    policy: Policy,
    generation: GenerationHandle,
    scratch_dir: str | Path,
    weight_version: int | None = None,
    recompute_kv_cache: bool = True,
) -> None:
    """Load the trainer's weights into the generation backend in place (no restart), labelled ``weight_version``
    (the trainer step that made them: each completion they generate reports it); ``recompute_kv_cache`` False
    keeps the KV the servers cached from the old weights (see ``GenerationHandle.update_weights``).

    Both ways take the same gathered stream of full tensors: copied straight into the in-process engine, or
    written as safetensors files (under ``scratch_dir``) a server reloads (vLLM, hf subprocess)."""
    labels = {"weight_version": weight_version, "recompute_kv_cache": recompute_kv_cache}
    if generation.engine is not None:  # hf in this process: copy tensors as they are gathered
        generation.update_weights(policy.stream_weights_for_generation(), **labels)
    else:  # a generation server in another process (vLLM, hf subprocess): through a checkpoint directory
        directory = Path(scratch_dir) / "weights_for_generation"
        generation.update_weights(checkpoint_dir=str(policy.save_hf_model(directory)), **labels)


def rollout_pass_metrics(results: list[RolloutResult], n: int, seed: int, prefix: str) -> dict[str, float]:
    """The evaluator's metrics (pass@k, pass^k, mean reward per domain) of finished episodes, keys under ``prefix``."""
    records = [EpisodeRecord.from_dict(vars(result)) for result in results]
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
    save_dir: Path | None = None,
    prefix: str = "val",
    on_progress: Callable[[RolloutProgress], None] | None = None,
) -> dict[str, float]:
    """Roll out ``num_generations`` episodes of each row with the served weights; the evaluator's metrics.

    With ``save_dir``, each episode goes to ``<save_dir>/rollouts.jsonl`` as it finishes, in the evaluator's format
    with its transcript and token ids: ``prepare_sft_data.py --rollouts <save_dir>`` turns them into SFT rows."""
    repeated = [row | {"sample_index": k} for row in rows for k in range(num_generations)]
    results: list[RolloutResult] = []
    log = RolloutLog(Path(save_dir)) if save_dir is not None else None
    if save_dir is not None:
        write_system_prompts(Path(save_dir), rows)

    async def collect() -> None:
        async for group in run_async_nemo_gym_rollout(
            repeated,
            environment.agent_urls,
            SamplingParams.from_generation(generation_cfg),
            1,
            max_concurrency=max_concurrency,
            keep_full_result=log is not None,
            on_progress=on_progress,
        ):
            for result in group.results:
                if log is not None:
                    log.append(record_of(result, keep_transcript=True))
                results.append(result)

    cache_before = environment.policy.prefix_cache_counters() if environment.policy is not None else None
    try:
        asyncio.run(collect())
    finally:
        if log is not None:
            log.close()
    metrics = rollout_pass_metrics(results, num_generations, seed, prefix)
    cache_after = environment.policy.prefix_cache_counters() if cache_before is not None else None
    if cache_after is not None and (rate := cache_after.hit_rate_since(cache_before)) is not None:
        metrics[f"{prefix}/prefix_cache_hit_rate"] = rate  # vLLM: share of prompt tokens served from its cache
    return metrics


def validation_dir(log_dir: str | Path, step: int) -> Path:
    """Where a training run keeps the validation episodes of ``step`` (``validation_metrics``' ``save_dir``)."""
    return Path(log_dir) / "validation" / f"step_{step}"
