"""Megatron distributed checkpoints of one stack: model weights and optimizer state with
``megatron.core.dist_checkpointing`` (every rank writes its own shards, in parallel), plus the TP/PP/DP layout that
wrote them. The LR schedule's state and the RNG states travel as the torch backend's do (see ``Policy``).

The distributed optimizer's state is saved in the format ``megatron_cfg.optimizer.dist_ckpt_optim_fully_reshardable``
picks (``MegatronOptimizerConfig.checkpoint_format``), recorded in ``layout.json`` and read back from there:

- ``fully_reshardable`` (default): each TP/PP shard's state is gathered over DP (gloo, to DP rank 0's host memory:
  the ``mem_efficient`` variant, which needs no CUDA) and saved in model space, each tensor by its global shape and
  offsets like the model's own shards, so the checkpoint loads into any TP/PP/DP sizes; the embedding and output
  rows load with megatron-core's ``allow_shape_mismatch`` (another vocabulary padding: the padding rows are zero).
- ``dp_reshardable``: each rank writes its buffer shard as it is, without a gather; tied to the TP x PP layout, so
  the checkpoint loads only into the layout that wrote it (the Policy refuses any other in one line, before
  loading: ``megatron_config.layout_refusal``).

(megatron-core's default, ``fully_sharded_model_space``, uses flattened ranges that dist_checkpointing refuses to
save.) A replicated optimizer's state is in model space by construction and reshards the same way.

Three traps of loading into torch's AdamW (what megatron-core uses without Transformer Engine or Apex), handled here:

- Adam creates its state on its first step, and the distributed optimizer's ``state_dict()`` cannot name the step
  of an optimizer that never stepped: the state is created first by one step with zero gradients (every value it
  writes, weights included, is then overwritten by the load).
- The step count lives in the saved param groups, not beside ``exp_avg``: the distributed optimizer's load sets one
  step tensor shared by every parameter (AdamW then adds 1 per parameter to it at each step) and its buffer loader
  copies the step held before the load back over it. Each parameter gets its own tensor with the saved step.
- ``OptimizerParamScheduler.load_state_dict`` steps by the saved count from wherever the schedule is.

Without the first two the next step after resuming is equal (the weights load exactly) but the one after differs
(measured on 2 gloo ranks: loss 0.192437 vs 0.192275). A fourth trap is megatron-core's (0.19.2): its
``fully_reshardable`` loader leaves torch Adam's ``step`` out of what it copies, then looks each state key of the
parameter up in it, ``step`` included (a KeyError); :func:`_step_left_in_place` hands it the parameter's own step
while it loads (a copy onto itself), and the step is set from the saved param groups afterwards as above.
``dist_checkpointing`` needs ``psutil`` (megatron extra).
"""

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nemo_tau2.models.megatron.training import MegatronStack
from nemo_tau2.models.policy.checkpoint import MEGATRON_LAYOUT_FILE


def stack_layout(stack: MegatronStack) -> dict[str, Any]:
    """This process's megatron-core layout, the vocabulary padding its shards were cut with and its optimizer's
    checkpoint format, as ``megatron_config.megatron_layout`` computes them from the config."""
    from megatron.core import parallel_state

    return {
        "tensor_model_parallel_size": parallel_state.get_tensor_model_parallel_world_size(),
        "pipeline_model_parallel_size": parallel_state.get_pipeline_model_parallel_world_size(),
        "data_parallel_size": parallel_state.get_data_parallel_world_size(),
        "make_vocab_size_divisible_by": stack.make_vocab_size_divisible_by,
        "use_distributed_optimizer": stack.checkpoint_format != "model_space",
        "optimizer_format": stack.checkpoint_format,
    }


def _megatron_optimizers(stack: MegatronStack) -> list:
    return list(getattr(stack.optimizer, "chained_optimizers", [stack.optimizer]))


def _sharded_state(stack: MegatronStack, is_loading: bool, optimizer_format: str) -> dict:
    model = stack.gpt_model.sharded_state_dict()  # the GPTModel's names (DDP would prefix "module.")
    metadata = {"distrib_optim_sharding_type": optimizer_format, "distrib_optim_fully_reshardable_mem_efficient": True}
    optimizer = stack.optimizer.sharded_state_dict(model, is_loading=is_loading, metadata=metadata)
    return {"model": model, "optimizer": optimizer}


@contextlib.contextmanager
def _step_left_in_place() -> Iterator[None]:
    """While loading a ``fully_reshardable`` state: each parameter's loaded tensors get its current ``step`` (see the
    module's docs), restored to megatron-core's own method afterwards."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    original = DistributedOptimizer._set_main_param_and_optimizer_states

    def with_step(self: Any, model_param: Any, tensors: dict) -> None:
        group, order = self.model_param_group_index_map[model_param]
        state = self.optimizer.state[self.optimizer.param_groups[group]["params"][order]]
        if isinstance(state.get("step"), torch.Tensor) and "step" not in tensors:
            tensors = {**tensors, "step": state["step"]}
        original(self, model_param, tensors)

    DistributedOptimizer._set_main_param_and_optimizer_states = with_step
    try:
        yield
    finally:
        DistributedOptimizer._set_main_param_and_optimizer_states = original


def save_megatron_checkpoint(stack: MegatronStack, directory: str | Path) -> Path:
    """Write this rank's shards and (rank 0) the layout to ``directory``, created (a collective)."""
    from megatron.core import dist_checkpointing

    directory = Path(directory)
    if dist.get_rank() == 0:
        directory.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(_sharded_state(stack, False, stack.checkpoint_format), str(directory))
    if dist.get_rank() == 0:
        (directory / MEGATRON_LAYOUT_FILE).write_text(json.dumps(stack_layout(stack), sort_keys=True))
    dist.barrier()
    return directory


@torch.no_grad()
def _create_optimizer_state(stack: MegatronStack) -> None:
    """One step with zero gradients where the torch optimizer has no state yet (it creates state on a step)."""
    for optimizer in _megatron_optimizers(stack):
        inner = optimizer.optimizer
        if inner.state:
            continue
        params = [p for group in inner.param_groups for p in group["params"]]
        for param in params:
            param.grad = torch.zeros_like(param)
        inner.step()
        for param in params:
            param.grad = None


def _own_step_per_parameter(stack: MegatronStack, loaded: Any) -> None:
    """Give each parameter's state its own step tensor holding the saved step (see the module's docs)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    optimizers = _megatron_optimizers(stack)
    states = [loaded] if len(optimizers) == 1 else [loaded[index] for index in sorted(loaded)]
    for optimizer, state in zip(optimizers, states, strict=True):
        if not isinstance(optimizer, DistributedOptimizer):
            continue  # torch's own state dict: each parameter's step is saved and loaded with it
        steps = {group["step"] for group in state["optimizer"]["param_groups"] if group.get("step") is not None}
        if not steps:
            continue  # Transformer Engine / Apex Adam keeps the step in its param groups, loaded as they are
        (step,) = steps
        for param_state in optimizer.optimizer.state.values():
            if isinstance(param_state.get("step"), torch.Tensor):
                param_state["step"] = torch.tensor(float(step), dtype=param_state["step"].dtype)


def load_megatron_checkpoint(stack: MegatronStack, directory: str | Path, scheduler_state: dict) -> None:
    """Read this rank's shards of ``directory`` into ``stack`` (any layout, or the one that wrote it: see the
    module's docs), and the LR schedule's state (a collective). The next steps are those of the run that saved it
    (bit for bit in the same layout; to float rounding in another, where sums are ordered otherwise)."""
    from megatron.core import dist_checkpointing

    directory = Path(directory)
    written = json.loads((directory / MEGATRON_LAYOUT_FILE).read_text())
    optimizer_format = written.get("optimizer_format", "dp_reshardable")  # not recorded before it was a choice
    _create_optimizer_state(stack)
    loaded = dist_checkpointing.load(_sharded_state(stack, True, optimizer_format), str(directory))
    stack.gpt_model.load_state_dict(loaded["model"])
    reshardable = optimizer_format == "fully_reshardable"
    with torch.no_grad(), _step_left_in_place() if reshardable else contextlib.nullcontext():
        stack.optimizer.load_state_dict(loaded["optimizer"])  # fp32 main params: copied into without autograd
    _own_step_per_parameter(stack, loaded["optimizer"])
    stack.scheduler.num_steps = 0  # its load_state_dict steps by the saved count from here
    stack.scheduler.load_state_dict(scheduler_state)
