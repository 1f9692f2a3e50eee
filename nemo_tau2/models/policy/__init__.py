"""The policy training backend: torch + transformers, in-process or on Ray, replicated or FSDP2-sharded (README.md).

The package exports what every trainer backend shares (configs, training records, the loss interface, checkpoint
folders); the Megatron backend (``nemo_tau2.models.megatron``) imports them. The front door that chooses between
the backends, :class:`~nemo_tau2.models.policy.lm_policy.Policy`, sits above both and is imported from its module:
exporting it here would make every import of the shared parts load the torch worker, which loads the Megatron
worker, which imports the shared parts (a circle).

Each export is imported on first use (PEP 562): reading a run's config (``PolicyConfig``) must not import torch,
which the checkpoint and data modules do, so that a config is refused in a second rather than after torch's import.
"""

import importlib

_NAMES_BY_MODULE = {
    "checkpoint": ("latest_checkpoint", "list_checkpoints", "prune_checkpoints", "step_dir"),
    "config": (
        "CheckpointingConfig", "DTensorConfig", "OptimizerConfig", "PolicyConfig", "SchedulerConfig",
        "SequencePackingConfig",
    ),
    "data": ("TrainingBatch", "TrainingSequence", "collate", "sequence_from_message_log"),
    "interfaces": ("LossFunction",),
}  # fmt: skip
_EXPORTS = {name: module for module, names in _NAMES_BY_MODULE.items() for name in names}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
