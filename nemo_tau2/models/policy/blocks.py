"""How each transformer block runs in training: what it keeps for its backward pass, and whether it is compiled.

**Activation checkpointing** (``policy.dtensor_cfg.activation_checkpointing``), per block, around its forward
(inside FSDP2's unit, so a recompute finds the block's weights gathered):

- ``none``: autograd keeps everything (no recompute);
- ``selective``: the block's forward runs under ``torch.utils.checkpoint`` with an op-level policy that *saves* the
  outputs of its matrix multiplies and of its attention kernel and *recomputes* everything else (RMSNorms with
  their fp32 copies, rotary embedding, SiLU and the gate product, residual adds). Those elementwise ops hold about
  half of a Qwen3 block's activation bytes but cost no matrix FLOPs to redo, only a memory-bound pass; the
  matmuls and attention, which are the block's compute, never run twice. (Checkpointing a whole sub-layer instead,
  the MLP or the attention, would recompute matmuls: the MLP alone is about two thirds of a block's FLOPs.);
- ``full``: only the block's input is kept, the whole block is recomputed in the backward (a third more compute);
- ``auto``: the first of ``none``, ``selective``, ``full`` whose memory plan (``models.memory_plan``) fits this
  rank's memory (the visible GPU's, on CPU the host's share).

**torch.compile** (``policy.dtensor_cfg.torch_compile``): each block (with its checkpointing, so the compiler sees
the policy) is compiled on its own, before FSDP2 wraps it (its hooks stay outside the graph); every block of a
model shares one compiled graph, shapes become dynamic after the first micro-batch of another length.
"""

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
from transformers import PreTrainedModel

from nemo_tau2.models.model_shape import model_shape, transformer_blocks
from nemo_tau2.models.policy.config import PolicyConfig

logger = logging.getLogger(__name__)

_SAVED_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._flash_attention_forward.default,
}
"""Ops whose outputs selective checkpointing keeps: the matrix multiplies and attention kernels of a block."""


def _keep_matmuls_and_attention(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    if op in _SAVED_OPS or getattr(op, "namespace", None) == "torch_attn":  # varlen_attn's custom ops
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts() -> Any:
    return create_selective_checkpoint_contexts(_keep_matmuls_and_attention)


def _checkpointed(forward: Callable, context_fn: Callable | None) -> Callable:
    extra = {"context_fn": context_fn} if context_fn is not None else {}

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # logprobs: nothing is kept anyway
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)

    return run


def checkpointing_mode(cfg: PolicyConfig, model: PreTrainedModel, *, reference: bool) -> str:
    """``cfg``'s mode, ``auto`` resolved by the memory plan of ``model``'s shape on this rank's memory."""
    if cfg.activation_checkpointing != "auto":
        return cfg.activation_checkpointing
    from nemo_tau2.cluster import ClusterConfig
    from nemo_tau2.models.memory_plan import resolve_activation_checkpointing, trainer_budget

    shape = model_shape(model.config, cfg.model_name, "the policy's model")
    budget = trainer_budget(cfg, ClusterConfig(), None)
    return resolve_activation_checkpointing(cfg, shape, reference=reference, budget=budget)


def prepare_blocks(model: PreTrainedModel, cfg: PolicyConfig, *, reference: bool) -> str:
    """Give every block of ``model`` its checkpointing and compile it (see the module docstring), in place, before
    sharding; returns the checkpointing mode used."""
    mode = checkpointing_mode(cfg, model, reference=reference)
    blocks = transformer_blocks(model)
    if mode != "none":
        context_fn = _selective_contexts if mode == "selective" else None
        for block in blocks:
            block.forward = _checkpointed(block.forward, context_fn)
    if cfg.dtensor_cfg.compiles(cfg.device):
        for block in blocks:
            block.compile()
    logger.info(
        "policy blocks: activation checkpointing %s%s, torch.compile %s",
        mode,
        " (auto, from the memory plan)" if cfg.activation_checkpointing == "auto" else "",
        "on" if cfg.dtensor_cfg.compiles(cfg.device) else "off",
    )
    return mode
