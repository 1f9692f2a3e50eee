"""WORK IN PROGRESS (not on branch megatron): on a DP=2 CPU run the model weights resume exactly (next-step loss
equal) but the step after that differs (0.192437 vs 0.192275), so the distributed optimizer's state does not load
right yet; ``fully_reshardable`` needs CUDA in ``get_parameter_state_dp_zero`` (not patched).

Megatron distributed checkpoints of one stack: model and optimizer with ``megatron.core.dist_checkpointing`` (every
rank writes its shards, so a checkpoint of one TP/PP/DP layout is readable by the same layout), the LR schedule as
a small file from rank 0.

Loading into a stack built from the initial HF weights on the same ranks makes the next step identical to the
uninterrupted run. ``dist_checkpointing`` needs ``psutil`` (in the ``megatron`` extra); scripts that spawn its
processes need a ``__main__`` guard (without one a 2-process save hung).
"""

from pathlib import Path

import torch
import torch.distributed as dist

from nemo_tau2.models.megatron.training import MegatronStack

SCHEDULER_FILE = "megatron_scheduler.pt"


def _sharded_state(stack: MegatronStack, is_loading: bool) -> dict:
    model = stack.model.module.sharded_state_dict()  # the GPTModel's names (DDP would prefix "module.")
    # dp_reshardable: each rank writes its own optimizer shard as it is (no gather); the default layout
    # (fully_sharded_model_space) uses flattened ranges that dist_checkpointing 0.19 refuses to save
    optimizer = stack.optimizer.sharded_state_dict(
        model, is_loading=is_loading, metadata={"distrib_optim_sharding_type": "dp_reshardable"}
    )
    return {"model": model, "optimizer": optimizer}


def save_megatron_checkpoint(stack: MegatronStack, directory: str | Path) -> Path:
    """Write this rank's shards to ``directory`` (created; a collective: every rank calls it)."""
    from megatron.core import dist_checkpointing

    directory = Path(directory)
    if dist.get_rank() == 0:
        directory.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(_sharded_state(stack, is_loading=False), str(directory))
    if dist.get_rank() == 0:
        torch.save(stack.scheduler.state_dict(), directory / SCHEDULER_FILE)
    dist.barrier()
    return directory


def load_megatron_checkpoint(stack: MegatronStack, directory: str | Path) -> None:
    """Read the model, optimizer and LR schedule of ``directory`` into ``stack`` (a collective)."""
    from megatron.core import dist_checkpointing

    directory = Path(directory)
    loaded = dist_checkpointing.load(_sharded_state(stack, is_loading=True), str(directory))
    stack.model.module.load_state_dict(loaded["model"])
    with torch.no_grad():  # fp32 main params are views of the trained parameters: copied into without autograd
        stack.optimizer.load_state_dict(loaded["optimizer"])
    stack.scheduler.load_state_dict(torch.load(directory / SCHEDULER_FILE, weights_only=False))
