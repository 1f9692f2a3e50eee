"""The GRPO config (``examples/configs/grpo_*.yaml``): NeMo-RL's keys where they exist.

``grpo`` (loop, advantages, sampling, reward shaping, curriculum), ``loss_fn`` (clipped PG loss), ``policy``
(trainer and ``policy.generation``, the rollout backend serving the current weights), ``user`` (the simulated
user's own endpoint), ``env.nemo_gym`` (the tau2 Gym servers), ``data`` (train and validation tasks),
``checkpointing``, ``logger`` and ``cluster`` (the GPUs the memory plan checks the run against).
"""

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_tau2.algorithms.curriculum import CurriculumConfig
from nemo_tau2.algorithms.loss_config import AdvantageConfig, ClippedPGLossConfig
from nemo_tau2.algorithms.reward_shaping import RewardShapingConfig
from nemo_tau2.algorithms.sampling import SamplingConfig
from nemo_tau2.algorithms.tiny_policy import TinyPolicyConfig
from nemo_tau2.algorithms.train_rollouts import SaveRollouts
from nemo_tau2.cluster import ClusterConfig
from nemo_tau2.generation.validation import GymGenerationConfig
from nemo_tau2.gym.episode_config import CLUSTER_FOR_REPLICAS, NemoGymEnvConfig, UserSimulatorConfig
from nemo_tau2.models.policy.config import CheckpointingConfig, PolicyConfig
from nemo_tau2.tau2_env import ALL_DOMAINS, training_domain_problem
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig
from nemo_tau2.utils.metrics_logger import LoggerConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AsyncGRPOConfig(_Strict):
    """``grpo.async_grpo``: generation overlapping training with bounded staleness (NeMo-RL's keys and defaults).

    The collector and replay buffer: :mod:`nemo_tau2.algorithms.async_collector`. Each policy turn records the
    ``weight_version`` that sampled it; a group's age counts from its oldest turn.
    """

    enabled: bool = Field(default=False, description="Generate the next steps' groups while the trainer trains.")
    max_trajectory_age_steps: int = Field(
        default=1,
        ge=1,
        description="A trajectory generated with the weights of step s trains at a step <= s + this; older ones "
        "are dropped and counted.",
    )
    in_flight_weight_updates: bool = Field(
        default=False,
        description="New weights reach the generation servers while episodes run (the turns after the update use "
        "them; a turn in progress finishes on the weights it started with); false waits for the running episodes "
        "to finish first.",
    )
    recompute_kv_cache_after_weight_updates: bool = Field(
        default=False,
        description="With in-flight updates: drop the KV the generation servers cached from the old weights (vLLM's "
        "prefix cache), so the episodes that run on recompute their history with the new weights; false keeps it "
        "(faster, stale). Without in-flight updates the cache is always dropped.",
    )

    def recompute_kv_cache(self) -> bool:
        """Whether a weight update drops the KV cached from the old weights (see the two keys above)."""
        return not self.in_flight_weight_updates or self.recompute_kv_cache_after_weight_updates


class GRPOSettings(AdvantageConfig, SamplingConfig):
    """``grpo``: the loop, plus NeMo-RL's flat advantage keys (``use_leave_one_out_baseline``,
    ``normalize_rewards``, ...) and sampling keys (``use_dynamic_sampling``, ``overlong_filtering``, ...)."""

    model_config = ConfigDict(extra="forbid")

    num_prompts_per_step: int = Field(default=8, ge=1, description="Task rows (prompt groups) per training step.")
    num_generations_per_prompt: int = Field(default=8, ge=2, description="Episodes per row (the GRPO group).")
    max_num_steps: int = Field(default=100, ge=1)
    seed: int = 42
    max_rollout_concurrency: int = Field(default=64, ge=1, description="Episodes in flight at once.")
    val_period: int = Field(default=0, ge=0, description="Validate every this many steps; 0 never.")
    val_at_start: bool = False
    val_at_end: bool = True
    max_val_samples: int | None = Field(default=None, ge=1, description="First N validation rows; null all.")
    val_num_generations_per_prompt: int = Field(default=1, ge=1)
    reward_shaping: RewardShapingConfig = RewardShapingConfig()
    curriculum: CurriculumConfig = CurriculumConfig()
    async_grpo: AsyncGRPOConfig = AsyncGRPOConfig()

    def advantage_config(self) -> AdvantageConfig:
        return AdvantageConfig.model_validate(self.model_dump(include=set(AdvantageConfig.model_fields)))

    def sampling_config(self) -> SamplingConfig:
        return SamplingConfig.model_validate(self.model_dump(include=set(SamplingConfig.model_fields)))


class GRPODataConfig(_Strict):
    domains: list[str] | None = Field(default=None, description="tau2 domains (with train_split / val_split).")
    train_split: str = "train"
    val_split: str | None = Field(default="test", description="null: no validation rows (unless val_data_path).")
    task_ids: list[str] | None = Field(default=None, description="Only these tasks of the train split.")
    compact_rows: bool = Field(
        default=False,
        description="Rows with a short system prompt and only each task's gold tools (toy models with small "
        "contexts, e.g. tiny_policy); scores are then not comparable with tau2's prompts.",
    )
    train_data_path: str | None = Field(default=None, description="Gym JSONL rows to train on instead of a split.")
    val_data_path: str | None = Field(default=None, description="Gym JSONL rows to validate on instead of a split.")

    @model_validator(mode="after")
    def _rows_from_somewhere(self) -> "GRPODataConfig":
        unknown = [domain for domain in self.domains or [] if domain not in ALL_DOMAINS]
        if unknown:
            known = ", ".join(ALL_DOMAINS)
            raise ValueError(f"data.domains: unknown domain {unknown[0]!r}; tau2 domains are: {known}")
        if not self.domains and not self.train_data_path:
            raise ValueError("data.domains or data.train_data_path is required")
        return self


def data_split_problems(data: GRPODataConfig, version: str) -> list[str]:
    """The first reason GRPO or RFT cannot train on ``data.train_split`` or validate on ``data.val_split`` of
    ``data.domains`` under tau2 ``version`` (a domain of another release; one with no train/test split)."""
    checks = [(data.train_split, data.task_ids, "data.train_split"), (data.val_split, data.task_ids, "data.val_split")]
    for domain in data.domains or []:
        for split, task_ids, key in checks:
            if (problem := training_domain_problem(domain, version, split, task_ids, key)) is not None:
                return [problem]
    return []


class GRPOPolicyConfig(PolicyConfig):
    """``policy``: the trainer's config, whose ``generation`` block drives the Gym rollouts (so obeys the gym
    rules, as ``user.generation`` does)."""

    generation: GymGenerationConfig | None = PolicyConfig.model_fields["generation"]


class GRPOEnvConfig(_Strict):
    nemo_gym: NemoGymEnvConfig = NemoGymEnvConfig(return_token_ids=True)


class GRPOLoggerConfig(LoggerConfig):
    """``logger``: GRPO's sinks, and which training episodes go to disk."""

    save_rollouts: SaveRollouts = Field(
        default="failed",
        description="Each step's episodes in <log_dir>/train/step_<N>/rollouts.jsonl (eval's record shape): failed: "
        "the infrastructure errors with their cause; all: every episode with its transcript and token ids; none.",
    )


class GRPOMasterConfig(_Strict):
    grpo: GRPOSettings = GRPOSettings()
    loss_fn: ClippedPGLossConfig = ClippedPGLossConfig()
    policy: GRPOPolicyConfig
    user: UserSimulatorConfig
    env: GRPOEnvConfig = GRPOEnvConfig()
    data: GRPODataConfig
    checkpointing: CheckpointingConfig = CheckpointingConfig()
    logger: GRPOLoggerConfig = GRPOLoggerConfig()
    cluster: ClusterConfig = ClusterConfig()
    tiny_policy: TinyPolicyConfig | None = Field(
        default=None, description="Build a warm-started tiny model into policy.model_name if it does not exist (CPU)."
    )
    tau2: Tau2ReleaseConfig = Field(default_factory=Tau2ReleaseConfig, description="Which tau2 release scores.")

    @model_validator(mode="after")
    def _consistent(self) -> "GRPOMasterConfig":
        problems = []
        if self.policy.generation is None:
            problems.append("policy.generation is required: the backend serving the current weights to rollouts")
        if not self.env.nemo_gym.return_token_ids:
            problems.append("env.nemo_gym.return_token_ids must be true: training needs the generated token ids")
        gym = self.env.nemo_gym
        if gym.agent_replicas * gym.resources_replicas > 1 and self.cluster.gym_placement != "ray":
            problems.append(CLUSTER_FOR_REPLICAS)
        if self.policy.generation is not None:
            problems += self.policy.generation.ray_placement_problems(self.cluster)
        shaping = self.grpo.reward_shaping
        if shaping.enabled and self.data.domains:
            missing = [d for d in self.data.domains if d not in shaping.domain_scale]
            if missing:
                problems.append(f"grpo.reward_shaping.domain_scale has no entry for {missing}")
        problems += self._async_grpo_problems()
        problems += data_split_problems(self.data, self.tau2.version)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _async_grpo_problems(self) -> list[str]:
        """NeMo-RL's refusals of ``grpo.async_grpo.enabled``: stale trajectories need the importance correction,
        and generation cannot run beside training on devices it shares with the trainer."""
        if not self.grpo.async_grpo.enabled:
            return []
        problems = []
        if not self.loss_fn.use_importance_sampling_correction:
            problems.append(
                "grpo.async_grpo.enabled requires loss_fn.use_importance_sampling_correction=true (trajectories "
                "come from older weights than the trainer's)"
            )
        generation = self.policy.generation
        if generation is not None and generation.backend == "hf" and generation.backend_block.in_process:
            problems.append(
                "grpo.async_grpo.enabled cannot run with colocated generation: policy.generation.hf_cfg.in_process "
                "is true (the hf engine shares the trainer's process and devices); set it to false or use vllm"
            )
        return problems
