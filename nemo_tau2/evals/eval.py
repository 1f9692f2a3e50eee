"""The evaluator: ``examples/run_eval.py --config ... eval.rollout_mode=nemo_gym``.

Order of work (NeMo-RL's ``run_eval``, extended to multi-turn tau2): validate the whole config, including the gym
rollout rules, before anything starts; write the resolved config (secrets redacted); read back any episodes a
previous run with the same ``save_path`` finished; start the environment; run the remaining (task, sample) episodes
through :func:`run_async_nemo_gym_rollout`, appending each to ``rollouts.jsonl`` as it finishes, with a progress
bar showing the running pass rate and, inside running episodes, turns and tokens/s; then compute pass@k, pass^k
and mean reward per domain and overall (bootstrap 95% intervals), write ``summary.json`` and return it with a
readable table.
"""

import asyncio
import logging
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nemo_tau2.config import ConfigError, redact_secrets, validate_config
from nemo_tau2.evals.config import EvalMasterConfig
from nemo_tau2.evals.metrics import EpisodeRecord, compute_eval_metrics, format_summary_table
from nemo_tau2.evals.nemo_rl_layout import translate_eval_config
from nemo_tau2.evals.progress_display import EpisodeProgress
from nemo_tau2.evals.results import (
    CONFIG_FILE,
    SUMMARY_FILE,
    RolloutLog,
    describe_causes,
    episode_key,
    infrastructure_causes,
    record_of,
    write_evaluation_data,
    write_json_atomic,
    write_system_prompts,
)
from nemo_tau2.experience.rollouts import OK, SamplingParams, run_async_nemo_gym_rollout
from nemo_tau2.generation.llamacpp_server import SMOLLM2_FILE
from nemo_tau2.generation.local_models import register_local_model_resolver
from nemo_tau2.generation.prefix_cache import PrefixCacheCounters
from nemo_tau2.gym.environment import Tau2Environment, Tau2EnvironmentSpec
from nemo_tau2.tau2_env.gym_rows import load_rows
from nemo_tau2.tau2_release.client import KNOWLEDGE_DOMAINS, Tau2WorkerError
from nemo_tau2.tau2_release.results_export import RESULTS_DIR, export_results
from nemo_tau2.tau2_release.rows import check_release, release_rows
from nemo_tau2.trained_tasks import describe as describe_trained_on
from nemo_tau2.trained_tasks import evaluated_tasks_trained_on, task_keys
from nemo_tau2.utils.metrics_logger import MetricsLogger

logger = logging.getLogger(__name__)


def setup_eval(raw: DictConfig, *, config_name: str = "eval") -> EvalMasterConfig:
    """Translate (NeMo-RL's layout or ours), parse and check the config, before anything starts or is written.

    Every problem (structure, values we cannot honour, gym rules) is reported in one error, one line each, naming
    the key and the fix. ``config_name`` names the default results folder when ``eval.save_path`` is null.
    """
    register_local_model_resolver()
    try:
        data = OmegaConf.to_container(raw, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as e:
        raise ConfigError(f"cannot resolve config: {e}") from e
    try:
        translation = translate_eval_config(data, config_name=config_name)
    except ConfigError as e:
        _raise_problems(e.problems)
    try:
        cfg = validate_config(translation.config, EvalMasterConfig)
    except ConfigError as e:  # the gym rules are validators of the config models; name the key the user wrote
        problems = [p.replace("policy.generation", translation.generation_key) for p in e.problems]
        _raise_problems(problems)
    for note in translation.notes:
        logger.info("%s", note)
    return cfg


def _raise_problems(problems: list[str]) -> NoReturn:
    """One line for one problem; a numbered list for several (each line names its key and the fix)."""
    if len(problems) == 1:
        raise ConfigError(problems[0])
    lines = "\n".join(f"  - {problem}" for problem in problems)
    raise ConfigError(f"{len(problems)} problems in the config:\n{lines}", problems=problems)


def build_eval_rows(cfg: EvalMasterConfig) -> list[dict]:
    """One Gym row per task: from ``data.data_path`` (Gym JSONL), or the split's tasks of each domain.

    Raises:
        ConfigError: A rows file that is missing or not Gym rows, an unknown split or task id, or no task at all;
            raised before anything is started or written.
    """
    data = cfg.data
    try:
        if cfg.tau2.version != "v0.2.1" and not data.data_path:  # the release's own tasks, from its worker
            rows = release_rows(cfg.tau2, data.domains or [], data.split, data.task_ids, data.num_tasks)
        else:
            rows = load_rows(
                data_path=data.data_path,
                domains_=data.domains,
                split=data.split,
                task_ids=data.task_ids,
                num_tasks=data.num_tasks,
                what="data",
            )
        check_release(rows, cfg.tau2.version, "data.data_path", cfg.tau2.retrieval_variant)
    except (ValueError, Tau2WorkerError) as e:
        raise ConfigError(str(e)) from e
    if not rows:
        raise ConfigError("the evaluation selects no tasks; check data.domains, data.split, data.task_ids")
    return rows


def environment_spec(cfg: EvalMasterConfig, rows: Sequence[dict], log_dir: Path) -> Tau2EnvironmentSpec:
    return Tau2EnvironmentSpec(
        policy=cfg.policy.generation,
        user=cfg.user,
        domains=sorted({str(row["domain"]) for row in rows}),
        gym=cfg.gym_env(),
        log_dir=log_dir,
        cluster=cfg.cluster,
        tau2=cfg.tau2,
    )


def pending_episodes(rows: Sequence[dict], n: int, done: set) -> list[dict]:
    """Rows still to run: each task's samples 0..n-1 minus those a previous run finished."""
    return [
        row | {"sample_index": sample}
        for row in rows
        for sample in range(n)
        if episode_key(row | {"sample_index": sample}) not in done
    ]


def summarize(cfg: EvalMasterConfig, raw: DictConfig, log: RolloutLog) -> dict[str, Any]:
    records = [EpisodeRecord.from_dict(record) for record in log]
    # logs written before records named their model have no policy_model: they are read, not refused
    produced_by = sorted({str(record["policy_model"]) for record in log if record.get("policy_model")})
    knowledge = any(record.get("domain") in KNOWLEDGE_DOMAINS for record in log)
    metrics = compute_eval_metrics(
        records, ks=cfg.eval.k_values, num_bootstrap=cfg.eval.bootstrap_samples, seed=cfg.eval.seed
    )
    return {
        **policy_model_names(cfg, raw),
        "tau2_version": cfg.tau2.version,
        # banking_knowledge's scores are the variant's (its prompt, tools and retrieval): None without the domain
        "retrieval_variant": cfg.tau2.retrieval_variant if knowledge else None,
        "episodes_produced_by": produced_by,  # what the policy's server called itself, per record
        "num_tests_per_prompt": cfg.eval.num_tests_per_prompt,
        "k_values": cfg.eval.k_values,
        "metrics": metrics,
        # the episodes left without an outcome, counted by cause (each one's latest attempt; a rerun retries them)
        "infrastructure_causes": dict(infrastructure_causes(log).most_common()),
        # a model a training run exported: which of the tasks played it trained on (None: no record to say)
        "checkpoint_trained_on": evaluated_tasks_trained_on(
            cfg.policy.generation.model_name, task_keys(log), cfg.tau2.retrieval_variant if knowledge else None
        ),
    }


def policy_model(cfg: EvalMasterConfig) -> str:
    """The evaluated model as resolved: its name or path, an endpoint's model, or the backend (the fake has none)."""
    return model_of(cfg.policy.generation)


def user_model(cfg: EvalMasterConfig) -> str:
    """The user simulator's model (the policy's endpoint when the config has no ``user`` block)."""
    return model_of(cfg.user_simulator().generation)


def model_of(generation: Any) -> str:
    """A ``generation`` block's model: its name or path, an endpoint's model, llama.cpp's GGUF file, or the backend
    (the fake has none)."""
    if generation.model_name:
        return generation.model_name
    if generation.openai_cfg is not None:
        return f"{generation.openai_cfg.model} at {generation.openai_cfg.base_url}"
    if generation.backend == "llamacpp":
        return Path((generation.llamacpp_cfg and generation.llamacpp_cfg.model_path) or SMOLLM2_FILE).name
    return generation.backend


_LOCAL_MODEL = re.compile(r"^\$\{local_model:\s*([^}\s]+)\s*\}$")


def policy_model_names(cfg: EvalMasterConfig, raw: DictConfig) -> dict[str, str]:
    """The model as the user configured it, for results and tables: ``${local_model:smollm2-135m-instruct}`` is
    ``smollm2-135m-instruct``, not the cache folder it resolves to, which is kept beside it as
    ``policy_model_resolved`` (only when it differs)."""
    resolved = policy_model(cfg)
    written = None
    for path in ("policy.generation", "generation"):  # ours, or NeMo-RL's layout
        node = OmegaConf.select(raw, path, default=None)
        if isinstance(node, DictConfig) and "model_name" in node:
            written = node._get_node("model_name")._value()
            break
    match = _LOCAL_MODEL.match(written) if isinstance(written, str) else None
    if match is None or match.group(1) == resolved:
        return {"policy_model": resolved}
    return {"policy_model": match.group(1), "policy_model_resolved": resolved}


async def _run_episodes(
    cfg: EvalMasterConfig, env: Tau2Environment, pending: list[dict], log: RolloutLog, progress: EpisodeProgress
) -> None:
    generation = cfg.policy.generation
    sampling = SamplingParams.from_generation(generation)
    async for group in run_async_nemo_gym_rollout(
        pending,
        env.agent_urls,
        sampling,
        num_generations=1,
        max_concurrency=cfg.eval.max_concurrency,
        keep_full_result=cfg.eval.keep_transcripts,
        on_progress=progress.on_progress,
    ):
        for result in group.results:
            log.append(record_of(result, cfg.eval.keep_transcripts))
            if result.status != OK:
                logger.warning(
                    "infrastructure error in %s/%s sample %d: %s",
                    result.domain,
                    result.task_id,
                    result.sample_index,
                    result.error,
                )
            progress.update(result.status == OK, bool(result.success))


def run_eval(cfg: EvalMasterConfig, raw: DictConfig) -> tuple[dict[str, Any], str]:
    """Run (or resume) the evaluation; returns the summary and the table to print.

    Raises:
        ConfigError: The data selects nothing runnable (see :func:`build_eval_rows`); nothing is written then.
    """
    if cfg.eval.rollout_mode == "single_turn":
        from nemo_tau2.evals.single_turn import run_single_turn_eval

        return run_single_turn_eval(cfg, raw)
    rows = build_eval_rows(cfg)
    save_dir = Path(cfg.eval.save_path)
    save_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(save_dir / CONFIG_FILE, redact_secrets(raw) | policy_model_names(cfg, raw))
    write_system_prompts(save_dir, rows)
    log = RolloutLog(save_dir)
    try:
        done = {key for key in log.done() if key[:2] in {episode_key(r | {"sample_index": 0})[:2] for r in rows}}
        pending = pending_episodes(rows, cfg.eval.num_tests_per_prompt, done)
        total = len(rows) * cfg.eval.num_tests_per_prompt
        cache_rate = None
        if not pending:
            logger.info("nothing left to do: all %d episodes are already done in %s", total, save_dir)
        elif done:
            logger.info("resuming: %d of %d episodes already done", total - len(pending), total)
        if pending:
            with (
                Tau2Environment(environment_spec(cfg, rows, save_dir / "server_logs")) as env,
                EpisodeProgress(total, total - len(pending)) as progress,
            ):
                cache_before = env.policy.prefix_cache_counters() if env.policy is not None else None
                asyncio.run(_run_episodes(cfg, env, pending, log, progress))
                cache_rate = _prefix_cache_hit_rate(env, cache_before)
        summary = summarize(cfg, raw, log)
        if cache_rate is not None:  # this run's episodes only (a resumed run's earlier ones were counted then)
            summary["metrics"]["eval/overall/prefix_cache_hit_rate"] = cache_rate
        write_evaluation_data(save_dir, list(log), rows, cfg.eval.num_tests_per_prompt, cfg.eval.keep_transcripts)
        if cfg.tau2.version != "v0.2.1" and cfg.eval.keep_transcripts:  # the release's own results files
            files = export_results(cfg.tau2, log.latest().values(), save_dir / RESULTS_DIR, release_run(cfg, raw))
            summary["tau2_results"] = {domain: str(path) for domain, path in files.items()}
    finally:
        log.close()
    write_json_atomic(save_dir / SUMMARY_FILE, summary)
    log_metrics(cfg, summary["metrics"])
    table = format_summary_table(summary["metrics"], show_ci=cfg.eval.bootstrap_samples > 0)
    if summary["checkpoint_trained_on"] is not None:
        table += f"\n{describe_trained_on(summary['checkpoint_trained_on'])}"
    if causes := summary["infrastructure_causes"]:
        table += f"\ninfrastructure errors (no outcome; a rerun retries them): {describe_causes(Counter(causes))}"
    return summary, f"{headline(cfg, summary['metrics'])}\n{run_line(cfg, raw)}\n\n{table}"


def run_line(cfg: EvalMasterConfig, raw: DictConfig) -> str:
    """What a leaderboard row names beside the scores: the tau2 release, the policy (as the user wrote it) and the
    user simulator."""
    policy = policy_model_names(cfg, raw)["policy_model"]
    return f"tau2 {cfg.tau2.version}, policy {policy}, user simulator {user_model(cfg)}"


def release_run(cfg: EvalMasterConfig, raw: DictConfig) -> dict[str, Any]:
    """The run settings a tau2 results file records (its ``TextRunConfig``), from this evaluation's config."""
    gym = cfg.gym_env()
    return {
        "llm_agent": policy_model_names(cfg, raw)["policy_model"], "llm_user": user_model(cfg),
        "num_trials": cfg.eval.num_tests_per_prompt, "max_steps": gym.max_steps, "max_errors": gym.max_errors,
        "seed": cfg.user_simulator().seed,
    }  # fmt: skip


def _prefix_cache_hit_rate(env: Tau2Environment, before: PrefixCacheCounters | None) -> float | None:
    """The share of prompt tokens vLLM served from its prefix cache during the run (None: not vLLM)."""
    after = env.policy.prefix_cache_counters() if before is not None and env.policy is not None else None
    return after.hit_rate_since(before) if after is not None and before is not None else None


def headline(cfg: EvalMasterConfig, metrics: dict[str, float]) -> str:
    """NeMo-RL's one-line result for ``eval.metric`` (``pass@k`` at the largest k, or ``mean_reward``)."""
    name = f"pass@{max(cfg.eval.k_values)}" if cfg.eval.metric == "pass@k" else "mean_reward"
    episodes = int(metrics.get("eval/overall/num_episodes", 0))
    line = f"metric={name} score={metrics.get(f'eval/overall/{name}', float('nan')):.4f} ({episodes} episodes)"
    if (cache_rate := metrics.get("eval/overall/prefix_cache_hit_rate")) is not None:
        line += f"; vLLM prefix cache hit rate {cache_rate:.1%}"
    return line


def log_metrics(cfg: EvalMasterConfig, metrics: dict[str, float]) -> None:
    """The summary's metrics to GRPO's sinks: ``<log_dir>/metrics.jsonl``, TensorBoard and W&B when enabled."""
    log_dir = cfg.logger.log_dir or str(Path(cfg.eval.save_path) / "logs")
    with MetricsLogger(cfg.logger.model_copy(update={"log_dir": log_dir})) as metrics_logger:
        metrics_logger.log(0, metrics)


def episodes_done(save_path: str | Path) -> set:
    """(domain, task_id, sample_index) of every finished episode under ``save_path`` (tests, tooling)."""
    log = RolloutLog(Path(save_path))
    try:
        return {episode_key(record) for record in log if record["status"] == OK}
    finally:
        log.close()
