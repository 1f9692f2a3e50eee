"""Attention for packed rows that costs what the sequences cost: each sequence attends within itself only.

transformers already understands packed rows (position ids restarting at 0): flash-attention 2/3 run them as
variable-length batches, but ``sdpa`` and ``eager`` build a dense ``N x N`` block-causal mask for the whole row, so a
row packing k sequences pays ``(sum L)^2`` attention instead of ``sum L^2`` (and ``N^2`` bytes of mask). With
packing on, the trainer switches such models to ``packed_sdpa`` (models already on flash-attention keep it).

Where the sequences start (``policy.sequence_packing.attention``):

- ``varlen`` (default): planned once per micro-batch, on the host, from the sequence lengths the collation already
  knows (:func:`attention_plan`), and handed to every layer as transformers' variable-length keywords
  (``cu_seq_lens_q/k``, ``max_length_q/k``, which its flash-attention path reads too). On a CUDA device in bf16/fp16
  the whole row runs as one variable-length flash-attention call (``torch.nn.attention.varlen.varlen_attn``);
  elsewhere (CPU, fp32) one ``scaled_dot_product_attention(is_causal=True)`` per sequence from the planned bounds,
  which is exact and needs no device sync;
- ``per_sequence``: each layer finds the bounds itself from the position ids (a host sync per layer on a GPU), then
  one SDPA call per sequence: what the trainer did before the plan, kept to measure the plan against.
"""

from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AttentionMaskInterface, PreTrainedModel

PACKED_SDPA = "packed_sdpa"
NATIVELY_PACKED = ("flash_attention_2", "flash_attention_3")
VARLEN_DTYPES = (torch.bfloat16, torch.float16)


def attention_plan(segment_lengths: list[int], device: torch.device, kernel: bool) -> dict[str, Any]:
    """The keywords every layer's attention gets for one packed row whose segments (sequences, then the padding)
    have ``segment_lengths`` tokens: cumulative bounds (int32) and the longest segment.

    ``kernel``: the bounds go to ``device`` for the variable-length kernel; otherwise they stay on the host, where the
    exact per-sequence path reads them without a device sync.
    """
    bounds = torch.zeros(len(segment_lengths) + 1, dtype=torch.int32)
    bounds[1:] = torch.tensor(segment_lengths, dtype=torch.int32).cumsum(0)
    if kernel:
        bounds = bounds.to(device, non_blocking=True)
    longest = max(segment_lengths)
    return {"cu_seq_lens_q": bounds, "cu_seq_lens_k": bounds, "max_length_q": longest, "max_length_k": longest}


def _bounds_from_positions(position_ids: torch.Tensor) -> list[int]:
    starts = (position_ids[0] == 0).nonzero().flatten().tolist()
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    return [*starts, position_ids.shape[1]]


@torch.compiler.disable  # compiled, every new set of bounds would be a recompile; it runs eager between graphs
def _per_sequence(query, key, value, bounds: list[int], dropout: float, scaling: float | None) -> torch.Tensor:
    gqa = key.shape[1] != query.shape[1]
    pieces = [
        F.scaled_dot_product_attention(
            query[:, :, start:end], key[:, :, start:end], value[:, :, start:end],
            dropout_p=dropout, is_causal=True, scale=scaling, enable_gqa=gqa,
        )
        for start, end in zip(bounds[:-1], bounds[1:], strict=True)
    ]  # fmt: skip
    return torch.cat(pieces, dim=2).transpose(1, 2)


def _varlen(query, key, value, bounds: torch.Tensor, longest: int, scaling: float | None) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    # [1, H, N, D] -> [N, H, D]; flash-attention takes fewer key/value heads than query heads (GQA) as they are
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    out = varlen_attn(q, k, v, bounds, bounds, longest, longest, scale=scaling, window_size=(-1, 0))
    return out[None]


def packed_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention within each sequence of a packed row (query ``[1, H, N, D]``, key/value ``[1, KV, N, D]``);
    returns ``[1, N, H, D]`` as transformers' attention functions do."""
    if query.shape[0] != 1:
        raise ValueError("packed_sdpa attention runs on one packed row")
    bounds = kwargs.get("cu_seq_lens_q")
    if bounds is None:  # no plan: find the sequences here (sequence_packing.attention: per_sequence)
        position_ids = kwargs.get("position_ids")
        if not isinstance(position_ids, torch.Tensor):
            raise ValueError("packed_sdpa attention needs the row's position_ids or a plan (cu_seq_lens_q)")
        out = _per_sequence(query, key, value, _bounds_from_positions(position_ids), dropout, scaling)
    elif query.is_cuda and bounds.device == query.device and query.dtype in VARLEN_DTYPES and dropout == 0.0:
        out = _varlen(query, key, value, bounds, int(kwargs["max_length_q"]), scaling)
    else:
        out = _per_sequence(query, key, value, bounds.tolist(), dropout, scaling)
    return out.contiguous(), None


def _no_mask(*args: object, **kwargs: object) -> None:
    return None  # the attention function finds the sequences from the plan or the position ids


AttentionInterface.register(PACKED_SDPA, packed_sdpa_attention)
AttentionMaskInterface.register(PACKED_SDPA, _no_mask)


def use_packed_attention(model: PreTrainedModel) -> None:
    """Switch ``model`` to per-sequence attention for packed rows (unless it runs flash-attention already)."""
    if model.config._attn_implementation not in NATIVELY_PACKED:
        model.set_attn_implementation(PACKED_SDPA)


def uses_varlen_kernel(model: PreTrainedModel, device: torch.device, compute_dtype: torch.dtype) -> bool:
    """Whether a plan's bounds should live on the device: the CUDA variable-length kernel (or transformers' own
    flash-attention path) reads them there."""
    native = model.config._attn_implementation in NATIVELY_PACKED
    return device.type == "cuda" and (native or compute_dtype in VARLEN_DTYPES)
