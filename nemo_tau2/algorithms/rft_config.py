"""The RFT config (``examples/configs/rft_*.yaml``): the ``rft`` loop block, the rest as in GRPO.

``rft`` (rounds, episodes per task, the keep filter, fine-tuning per round, validation), ``policy`` (trainer and
``policy.generation``, whose ``temperature``/``top_p`` the episodes are sampled with), ``user``, ``env.nemo_gym``,
``data`` (GRPO's: train and validation tasks), ``checkpointing``, ``logger``, ``cluster`` and ``tiny_policy``.

Defaults follow slime's tau2 pipeline (peers.md, section 1): keep episodes with reward >= 1 (its RFT filter), else
a task's best episode with partial credit >= 0.6 (its fallback), 4 samples per task (its GRPO group size); its
rollouts sample at temperature 0.7 (set in ``policy.generation``).
"""

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_tau2.algorithms.grpo_config import (
    GRPODataConfig,
    GRPOEnvConfig,
    GRPOPolicyConfig,
    LoggerConfig,
    data_split_problems,
)
from nemo_tau2.algorithms.reward_shaping import RewardShapingConfig
from nemo_tau2.algorithms.sft_data import TEST_SPLIT
from nemo_tau2.algorithms.tiny_policy import TinyPolicyConfig
from nemo_tau2.cluster import ClusterConfig
from nemo_tau2.evals.config import UserSimulatorConfig
from nemo_tau2.models.policy.config import CheckpointingConfig
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig


class RFTSettings(BaseModel):
    """``rft``: R rounds of sample -> keep the successes -> fine-tune on them."""

    model_config = ConfigDict(extra="forbid")

    num_rounds: int = Field(default=2, ge=1, description="R: sample/filter/fine-tune rounds.")
    num_generations_per_prompt: int = Field(default=4, ge=1, description="n episodes per train task per round.")
    min_reward: float = Field(default=1.0, description="Keep episodes with reward >= this (1.0: success only).")
    max_per_task: int | None = Field(default=None, ge=1, description="Keep at most this many episodes per task.")
    partial_fallback: float | None = Field(
        default=0.6,
        ge=0.0,
        le=1.0,
        description="A task with no episode at min_reward keeps its best episode whose partial credit (tau2's "
        "components, weighted as reward_shaping) is >= this; null: successes only.",
    )
    reward_shaping: RewardShapingConfig = Field(
        default_factory=RewardShapingConfig, description="Component weights of the partial credit (GRPO's block)."
    )
    dedup: bool = Field(default=True, description="Drop identical trajectories (same token ids).")
    accumulate: bool = Field(default=False, description="Fine-tune on every round's kept episodes so far.")
    num_epochs_per_round: int = Field(default=1, ge=1, description="Passes over the kept episodes per round.")
    seed: int = 42
    max_rollout_concurrency: int = Field(default=64, ge=1)
    val_at_start: bool = Field(default=True, description="Validate the starting policy (round 0).")
    val_num_generations_per_prompt: int = Field(default=1, ge=1)
    max_val_samples: int | None = Field(default=None, ge=1)
    allow_test_split: bool = Field(default=False, description="Allow sampling training episodes on tau2 test tasks.")


class RFTMasterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rft: RFTSettings = RFTSettings()
    policy: GRPOPolicyConfig
    user: UserSimulatorConfig
    env: GRPOEnvConfig = GRPOEnvConfig()
    data: GRPODataConfig
    checkpointing: CheckpointingConfig = CheckpointingConfig(checkpoint_dir="results/rft/checkpoints", save_period=1)
    logger: LoggerConfig = LoggerConfig(log_dir="results/rft/logs")
    cluster: ClusterConfig = ClusterConfig()
    tiny_policy: TinyPolicyConfig | None = None
    tau2: Tau2ReleaseConfig = Field(default_factory=Tau2ReleaseConfig, description="Which tau2 release scores.")

    @model_validator(mode="after")
    def _consistent(self) -> "RFTMasterConfig":
        problems = []
        if self.policy.generation is None:
            problems.append("policy.generation is required: the backend serving the current weights to rollouts")
        if not self.env.nemo_gym.return_token_ids:
            problems.append("env.nemo_gym.return_token_ids must be true: fine-tuning needs the generated token ids")
        problems += data_split_problems(self.data, self.tau2.version)
        if self.data.train_split == TEST_SPLIT and not self.rft.allow_test_split:
            problems.append(
                "data.train_split is tau2's test split: training on it leaks the test set; set "
                "rft.allow_test_split=true if that is what you want"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self
