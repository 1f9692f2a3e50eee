"""The policy training backend: torch + transformers, in-process or on Ray, replicated or FSDP2-sharded (README.md).

The package exports what every trainer backend shares (configs, training records, the loss interface, checkpoint
folders); the Megatron backend (``nemo_tau2.models.megatron``) imports them. The front door that chooses between
the backends, :class:`~nemo_tau2.models.policy.lm_policy.Policy`, sits above both and is imported from its module:
exporting it here would make every import of the shared parts load the torch worker, which loads the Megatron
worker, which imports the shared parts (a circle).
"""

from nemo_tau2.models.policy.checkpoint import (
    CheckpointingConfig,
    latest_checkpoint,
    list_checkpoints,
    prune_checkpoints,
    step_dir,
)
from nemo_tau2.models.policy.config import (
    DTensorConfig,
    OptimizerConfig,
    PolicyConfig,
    SchedulerConfig,
    SequencePackingConfig,
)
from nemo_tau2.models.policy.data import TrainingBatch, TrainingSequence, collate, sequence_from_message_log
from nemo_tau2.models.policy.interfaces import LossFunction

__all__ = [
    "CheckpointingConfig",
    "DTensorConfig",
    "LossFunction",
    "OptimizerConfig",
    "PolicyConfig",
    "SchedulerConfig",
    "SequencePackingConfig",
    "TrainingBatch",
    "TrainingSequence",
    "collate",
    "latest_checkpoint",
    "list_checkpoints",
    "prune_checkpoints",
    "sequence_from_message_log",
    "step_dir",
]
