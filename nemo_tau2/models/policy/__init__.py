"""The policy training backend: torch + transformers, in-process or data-parallel on Ray. See README.md here."""

from nemo_tau2.models.policy.checkpoint import (
    CheckpointingConfig,
    latest_checkpoint,
    list_checkpoints,
    prune_checkpoints,
    step_dir,
)
from nemo_tau2.models.policy.config import OptimizerConfig, PolicyConfig, SchedulerConfig
from nemo_tau2.models.policy.data import TrainingBatch, TrainingSequence, collate, sequence_from_message_log
from nemo_tau2.models.policy.lm_policy import Policy

__all__ = [
    "CheckpointingConfig",
    "OptimizerConfig",
    "Policy",
    "PolicyConfig",
    "SchedulerConfig",
    "TrainingBatch",
    "TrainingSequence",
    "collate",
    "latest_checkpoint",
    "list_checkpoints",
    "prune_checkpoints",
    "sequence_from_message_log",
    "step_dir",
]
