"""The Megatron stage's core attention, costing what the sequences cost: no ``N x N`` mask or scores for a packed row.

A packed micro-batch is one ``[1, N]`` row of sequences (``PackedRow``); each token attends causally within its own
sequence. megatron-core's unfused ``DotProductAttention`` (the local spec's) can only do that with a dense
block-causal ``[1, 1, N, N]`` mask and ``[heads, N, N]`` scores (and a softmax copy of them in fp32), which is what
ran out of memory on an H200 down to 4k tokens and made attention cost ``N^2`` instead of ``sum L^2``. Two backends
take the sequence boundaries instead, chosen once per stage by :func:`attention_backend`:

- ``"sdpa"`` (no Transformer Engine, or no CUDA): :class:`SequenceAttention`, this module's core attention. Padded
  rows run one causal ``scaled_dot_product_attention`` (flash kernels on GPUs); a packed row runs one causal SDPA
  per sequence, on views of the row (what the torch backend's ``packed_sdpa`` does, measured on an H200 there), so
  its memory and work are ``sum L^2``. Grouped-query attention is SDPA's own (``enable_gqa``: no repeated key/value
  heads). The row keeps megatron-core's ``sbhd`` layout, so RoPE rotates by the row position (one kernel, no host
  sync): scores depend on relative positions within a sequence only, so this equals per-sequence positions up to
  float rounding.
- ``"thd"`` (Transformer Engine importable and the stage on CUDA): megatron-core's ``TEDotProductAttention`` with
  ``PackedSeqParams(qkv_format="thd")``, TE's fused variable-length kernels and its fused THD RoPE (per-sequence
  positions; ``model.transformer_config`` turns ``apply_rope_fusion`` on for it). Not run here: TE has no CPU build.

The boundaries of a micro-batch's sequences are found once, on the host, before the batch moves to the device
(:func:`sequence_lengths`), and travel to every layer in the ``packed_seq_params`` megatron-core already passes down
(:func:`packed_seq_params`); no layer reads them back from the device.
"""

import importlib.util
import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.module import MegatronModule

SDPA = "sdpa"
THD = "thd"


def attention_backend(device: str, transformer_engine: bool | None = None) -> str:
    """``"thd"`` where Transformer Engine imports and the stage runs on CUDA, else ``"sdpa"`` (``transformer_engine``:
    whether TE is importable; None looks)."""
    if transformer_engine is None:
        transformer_engine = importlib.util.find_spec("transformer_engine") is not None
    return THD if transformer_engine and device == "cuda" else SDPA


def core_attention_module(backend: str) -> type:
    """The class the layer spec builds as ``self_attention.core_attention`` for ``backend``."""
    if backend == THD:
        from megatron.core.extensions import transformer_engine

        if not transformer_engine.HAVE_TE:  # megatron-core then puts mocks in TE's place
            raise ImportError("megatron backend: the thd attention needs Transformer Engine, which does not import")
        return transformer_engine.TEDotProductAttention
    return SequenceAttention


@dataclass
class RowSequences(PackedSeqParams):
    """A packed row for :class:`SequenceAttention`: ``qkv_format="sbhd"`` (the row stays ``[N, 1, ...]``),
    ``max_seqlen_q/kv`` the row's width ``N`` (megatron-core sizes RoPE by it: row positions), and the sequence
    ``lengths`` on the host, so no layer syncs with the device to split the row (``cu_seqlens_q/kv``, the same
    boundaries on the device, for code that reads them)."""

    lengths: tuple[int, ...] = ()


def sequence_lengths(position_ids: torch.Tensor) -> list[int]:
    """The lengths of the sequences of a packed row ``[1, N]`` (a sequence starts where its position id is 0), read
    on the host: call it before the row moves to the device."""
    starts = (position_ids[0] == 0).nonzero().flatten().tolist()
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    ends = [*starts[1:], position_ids.shape[1]]
    return [end - start for start, end in zip(starts, ends, strict=True)]


def packed_seq_params(lengths: list[int], device: torch.device | str, backend: str) -> PackedSeqParams:
    """What megatron-core passes to every layer for a packed row of sequences of ``lengths``."""
    cumulative = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32).to(device, non_blocking=True)
    if backend == THD:
        longest = max(lengths)
        return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cumulative, cu_seqlens_kv=cumulative,
                               max_seqlen_q=longest, max_seqlen_kv=longest)  # fmt: skip
    width = sum(lengths)
    return RowSequences(qkv_format="sbhd", cu_seqlens_q=cumulative, cu_seqlens_kv=cumulative, max_seqlen_q=width,
                        max_seqlen_kv=width, lengths=tuple(lengths))  # fmt: skip


class SequenceAttention(MegatronModule):
    """Causal core attention per sequence (the ``"sdpa"`` backend; module docstring). Takes and returns what
    megatron-core's ``DotProductAttention`` does: query ``[s, b, heads, d]``, key/value ``[s, b, groups, d]`` (this
    TP rank's heads), out ``[s, b, heads x d]``."""

    def __init__(self, config, layer_number: int, attn_mask_type, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None, cp_comm_type=None,
                 pg_collection: ProcessGroupCollection | None = None) -> None:  # fmt: skip
        super().__init__(config=config)
        refused = {
            "context_parallel_size > 1": config.context_parallel_size != 1,
            "apply_query_key_layer_scaling": config.apply_query_key_layer_scaling,
            "window_size": config.window_size is not None,
            f"softmax_type {config.softmax_type!r}": config.softmax_type != "vanilla",
        }
        for what, present in refused.items():
            if present:
                raise ValueError(f"megatron backend: the sdpa core attention does not do {what}")
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        tp = pg_collection.tp.size()
        self.heads = config.num_attention_heads // tp
        self.groups = config.num_query_groups // tp
        self.scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
                attn_mask_type=None, attention_bias=None,
                packed_seq_params: PackedSeqParams | None = None) -> torch.Tensor:  # fmt: skip
        if attention_mask is not None or attention_bias is not None:
            raise ValueError("megatron backend: the sdpa core attention is causal: give packed rows' sequences as "
                             "packed_seq_params, not a mask")  # fmt: skip
        width, rows = query.shape[:2]
        dropout = self.dropout if self.training else 0.0
        if packed_seq_params is None:
            out = self._causal(query, key, value, dropout)
        elif isinstance(packed_seq_params, RowSequences):
            if rows != 1:
                raise ValueError(f"megatron backend: a packed row is one row, got {rows}")
            out = self._per_sequence(query, key, value, packed_seq_params, dropout)
        else:
            raise ValueError(f"megatron backend: the sdpa core attention takes RowSequences, not "
                             f"qkv_format={packed_seq_params.qkv_format!r} (Transformer Engine's)")  # fmt: skip
        return out.reshape(width, rows, -1)

    def _causal(self, query, key, value, dropout: float) -> torch.Tensor:
        """Whole rows, ``[s, b, h, d]`` in and out (right padding never reaches a real token under a causal mask)."""
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=self.scale,
                                             enable_gqa=self.groups != self.heads)  # fmt: skip
        return out.permute(2, 0, 1, 3)

    def _per_sequence(self, query, key, value, sequences: RowSequences, dropout: float) -> torch.Tensor:
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [1, heads or groups, N, d]: views
        pieces, start = [], 0
        for length in sequences.lengths:
            piece = slice(start, start + length)
            pieces.append(F.scaled_dot_product_attention(
                q[:, :, piece], k[:, :, piece], v[:, :, piece], dropout_p=dropout, is_causal=True, scale=self.scale,
                enable_gqa=self.groups != self.heads))  # fmt: skip
            start += length
        return torch.cat(pieces, 2).permute(2, 0, 1, 3)
