"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for a transformers causal LM, as NeMo-RL's DTensor policy does it.

- **Mesh**: one data-parallel dimension over every trainer rank (``init_device_mesh(device, (world_size,))``).
- **Units**: each transformer block (the classes the model lists in ``_no_split_modules``, e.g.
  ``LlamaDecoderLayer``) is sharded on its own, then the root (embeddings, final norm, LM head). With several ranks
  a block's full weights exist only while it computes (resharded after its forward and its backward); on one rank
  (``dtensor_cfg.reshard_after_forward``'s default) they stay gathered from its forward to its backward, as the
  root's always do: the "gather" there is a cast-copy of the rank's own weights, done once per micro-batch instead
  of twice. Blocks arrive checkpointed and compiled (``blocks``).
- **Mixed precision** (``policy.precision``): parameters are kept in fp32 (the master copy the optimizer steps),
  gathered in the compute dtype (bf16 or fp32) and gradients are reduced in fp32. The gradient reduction is a sum
  (not FSDP's default mean): each rank's loss already carries the global batch's normalisers.
- **Initialisation**: rank 0 holds the real weights; the other ranks build the same architecture on the meta device
  (no memory), shard it, and receive their shards from rank 0 (``set_model_state_dict(broadcast_from_rank0=True)``).
  Buffers that are not in the state dict (rotary frequencies) are broadcast too. No rank but 0 ever holds a full
  copy of the model.
- **Reference model** (KL penalty): the same architecture sharded the same way, its shards copied locally from the
  initial policy shards (no communication), stored in the compute dtype; with ``cpu_offload`` its shards live in
  host memory like the policy's.
"""

import copy
import logging

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from nemo_tau2.models.model_shape import transformer_blocks
from nemo_tau2.models.policy.config import PolicyConfig

logger = logging.getLogger(__name__)


def empty_model(config: PretrainedConfig) -> PreTrainedModel:
    """The architecture of ``config`` on the meta device (no memory, no initialisation)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.float32, attn_implementation=config._attn_implementation
        )
    return model


def _shard(model: PreTrainedModel, mesh: DeviceMesh, cfg: PolicyConfig, *, reshard: bool) -> None:
    mp_policy = MixedPrecisionPolicy(param_dtype=cfg.compute_dtype, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy(pin_memory=True) if cfg.dtensor_cfg.cpu_offload else OffloadPolicy()
    for block in transformer_blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=mp_policy, offload_policy=offload, reshard_after_forward=reshard)
    # The root (embeddings, LM head) stays gathered from its forward to its backward, as FSDP2 does by default.
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, offload_policy=offload)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no pre-multiplied sum


def device_mesh(device: torch.device, world_size: int) -> DeviceMesh:
    return init_device_mesh(device.type, (world_size,), mesh_dim_names=("dp",))


def _materialise(model: PreTrainedModel, cfg: PolicyConfig, device: torch.device) -> None:
    """Allocate a sharded meta model: shards where FSDP keeps them, buffers on the compute device."""
    model.to_empty(device=torch.device("cpu") if cfg.dtensor_cfg.cpu_offload else device)
    for module in model.modules():
        for name, buffer in module.named_buffers(recurse=False):
            module._buffers[name] = buffer.to(device)


def shard_policy_model(
    model: PreTrainedModel, cfg: PolicyConfig, mesh: DeviceMesh, device: torch.device, rank: int
) -> PreTrainedModel:
    """Shard ``model`` in place over ``mesh`` and give every rank rank 0's weights (see the module docstring).

    Args:
        model: On rank 0 the real model (fp32, any device); on other ranks :func:`empty_model` of its config.
    """
    full_state = model.state_dict() if rank == 0 else {}
    # moves rank 0's shards and buffers to the device (shards to host with cpu_offload)
    _shard(model, mesh, cfg, reshard=cfg.dtensor_cfg.reshards(mesh.size()))
    if rank != 0:
        _materialise(model, cfg, device)
    set_model_state_dict(model, full_state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    del full_state
    with torch.no_grad():
        for buffer in model.buffers():  # not in the state dict (e.g. rotary inv_freq): meta garbage on ranks > 0
            dist.broadcast(buffer, src=0)
    return model


def sharded_reference_model(
    policy_model: PreTrainedModel, cfg: PolicyConfig, mesh: DeviceMesh, device: torch.device
) -> PreTrainedModel:
    """A frozen copy of the (initial) sharded policy, sharded the same way, stored in the compute dtype."""
    reference = empty_model(policy_model.config)
    for param in reference.parameters():  # parameters in the compute dtype; buffers (rotary) stay fp32
        param.data = param.data.to(cfg.compute_dtype)
    _shard(reference, mesh, cfg, reshard=True)  # no backward comes to free what a forward gathered
    _materialise(reference, cfg, device)
    with torch.no_grad():
        for target, source in zip(reference.parameters(), policy_model.parameters(), strict=True):
            local = target.to_local() if isinstance(target, DTensor) else target
            source_local = source.to_local() if isinstance(source, DTensor) else source
            local.copy_(source_local)
        for target, source in zip(reference.buffers(), policy_model.buffers(), strict=True):
            target.copy_(source)
    return reference.eval().requires_grad_(False)


def unsharded_reference_model(policy_model: PreTrainedModel) -> PreTrainedModel:
    """A frozen full copy of the initial policy (replicated training)."""
    return copy.deepcopy(policy_model).eval().requires_grad_(False)
