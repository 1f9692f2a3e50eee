"""The SFT config (``examples/configs/sft_*.yaml``): NeMo-RL's ``sft`` block, the rest as in GRPO.

``sft`` (NeMo-RL's keys: ``max_num_epochs``, ``max_num_steps``, ``val_period``, ``val_batches``,
``val_global_batch_size``, ``val_at_start``, ``seed``), ``policy`` (the trainer, FSDP2, and ``policy.generation``:
the backend that serves the weights for validation episodes), ``user`` and ``env.nemo_gym`` (only for validation
pass@1), ``data`` (SFT rows from ``prepare_sft_data.py``; validation tasks), ``checkpointing``, ``logger``,
``cluster`` and ``tiny_policy``, with GRPO's types.
"""

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_tau2.algorithms.grpo_config import GRPOEnvConfig, GRPOPolicyConfig, LoggerConfig
from nemo_tau2.algorithms.tiny_policy import TinyPolicyConfig
from nemo_tau2.cluster import ClusterConfig
from nemo_tau2.evals.config import UserSimulatorConfig
from nemo_tau2.models.policy.config import CheckpointingConfig
from nemo_tau2.tau2_env import ALL_DOMAINS, training_domain_problem
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SFTSettings(_Strict):
    """``sft``: the loop. A step is one optimizer step on ``policy.train_global_batch_size`` rows."""

    max_num_epochs: int = Field(default=1, ge=1)
    max_num_steps: int = Field(default=100, ge=1, description="Stop after this many steps even mid-epoch.")
    val_period: int = Field(default=0, ge=0, description="Validate every this many steps; 0 never (but at end).")
    val_batches: int = Field(default=1, ge=0, description="Validation-loss batches of val_global_batch_size; 0 all.")
    val_global_batch_size: int = Field(default=32, ge=1)
    val_at_start: bool = False
    val_at_end: bool = True
    seed: int = 42
    shuffle: bool = Field(default=True, description="A new seeded order of the rows every epoch.")
    val_num_generations_per_prompt: int = Field(default=1, ge=1, description="Validation episodes per task.")
    max_val_samples: int | None = Field(default=None, ge=1, description="First N validation tasks; null all.")
    max_rollout_concurrency: int = Field(default=64, ge=1, description="Validation episodes in flight at once.")


class SFTDataConfig(_Strict):
    """SFT rows for training and validation loss; tau2 tasks for validation pass@1 (as GRPO's ``data``)."""

    train_data_path: str = Field(description="SFT rows (examples/prepare_sft_data.py output).")
    val_data_path: str | None = Field(default=None, description="SFT rows for the validation loss.")
    domains: list[str] | None = Field(default=None, description="Validation pass@1 on these domains' val_split.")
    val_split: str | None = None
    task_ids: list[str] | None = None
    compact_rows: bool = False
    val_rows_path: str | None = Field(default=None, description="Gym JSONL rows for validation pass@1.")

    @model_validator(mode="after")
    def _known_domains(self) -> "SFTDataConfig":
        unknown = [domain for domain in self.domains or [] if domain not in ALL_DOMAINS]
        if unknown:
            known = ", ".join(ALL_DOMAINS)
            raise ValueError(f"data.domains: unknown domain {unknown[0]!r}; tau2 domains are: {known}")
        if self.domains and self.val_split is None:
            raise ValueError("data.domains needs data.val_split (the tasks validation pass@1 plays)")
        return self

    @property
    def has_eval_tasks(self) -> bool:
        return bool(self.val_rows_path or (self.domains and self.val_split))


class SFTMasterConfig(_Strict):
    sft: SFTSettings = SFTSettings()
    policy: GRPOPolicyConfig
    user: UserSimulatorConfig | None = None
    env: GRPOEnvConfig = GRPOEnvConfig()
    data: SFTDataConfig
    checkpointing: CheckpointingConfig = CheckpointingConfig(checkpoint_dir="results/sft/checkpoints")
    logger: LoggerConfig = LoggerConfig(log_dir="results/sft/logs")
    cluster: ClusterConfig = ClusterConfig()
    tiny_policy: TinyPolicyConfig | None = Field(
        default=None, description="Build a tiny model into policy.model_name if it does not exist (CPU)."
    )
    tau2: Tau2ReleaseConfig = Field(
        default_factory=Tau2ReleaseConfig, description="Which tau2 release the rows and validation tasks are of."
    )

    @model_validator(mode="after")
    def _validation_can_run(self) -> "SFTMasterConfig":
        for domain in self.data.domains or []:
            problem = training_domain_problem(domain, self.tau2.version, self.data.val_split, self.data.task_ids,
                                              "data.val_split")  # fmt: skip
            if problem is not None:
                raise ValueError(problem)
        if self.data.has_eval_tasks:
            missing = [name for name, value in (("policy.generation", self.policy.generation), ("user", self.user))
                       if value is None]  # fmt: skip
            if missing:
                raise ValueError(
                    f"validation pass@1 (data.domains / data.val_rows_path) needs {' and '.join(missing)}"
                )
        return self
