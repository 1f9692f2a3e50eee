"""HF Llama/Qwen3 weights <-> megatron-core ``GPTModel`` weights: names, fused layouts, tensor-parallel shards.

Three layouts differ from HF's:

- **QKV** is one ``linear_qkv`` matrix ordered per query group: for group ``g`` the ``heads / groups`` query heads
  of that group, then its key head, then its value head (each ``head_dim`` rows). Grouping this way lets tensor
  parallelism hand each rank whole groups by cutting rows.
- **Gated MLP**: ``linear_fc1`` is ``[gate; up]`` stacked (SwiGLU computes ``silu(gate) * up``); under tensor
  parallelism each rank holds its slice of gate then its slice of up.
- **Tied embeddings**: HF's ``lm_head.weight`` is absent (or equal to the embedding); Megatron shares the embedding
  with the output layer (``share_embeddings_and_output_weights``) and exports no ``output_layer.weight``.

- **Padded vocabulary**: the embedding and output layer may hold more rows than the HF vocabulary (Megatron's
  ``make_vocab_size_divisible_by x TP``, so any vocabulary splits over the TP ranks); the extra rows are zeros in,
  dropped out.

Qwen3's per-head ``q_norm`` / ``k_norm`` become ``q_layernorm`` / ``k_layernorm``. Full (unsharded) Megatron state
uses global layer numbers; :func:`stage_state` renumbers the layers one pipeline stage holds.
"""

import re
from collections.abc import Mapping

import torch

from nemo_tau2.models.megatron.model import check_supported, head_dim

_LAYER = re.compile(r"^(?:model\.layers|decoder\.layers)\.(\d+)\.(.+)$")

# per-layer HF name -> Megatron name, for the tensors copied as they are
_LAYER_DIRECT = {
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
    "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
}
_FUSED_HF = {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}
_FUSED_HF |= {"mlp.gate_proj.weight", "mlp.up_proj.weight"}

# which dimension tensor parallelism cuts (column-parallel: 0, row-parallel: 1); other tensors are replicated
_TP_DIM = {
    "embedding.word_embeddings.weight": 0,
    "output_layer.weight": 0,
    "self_attention.linear_qkv.weight": 0,
    "mlp.linear_fc1.weight": 0,
    "self_attention.linear_proj.weight": 1,
    "mlp.linear_fc2.weight": 1,
}


def _tied(hf_config) -> bool:
    return bool(getattr(hf_config, "tie_word_embeddings", False))


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hf_config) -> torch.Tensor:
    """HF ``q_proj``/``k_proj``/``v_proj`` -> Megatron's per-query-group ``linear_qkv``."""
    groups, d = hf_config.num_key_value_heads, head_dim(hf_config)
    heads_per_group = hf_config.num_attention_heads // groups
    hidden = q.shape[1]
    per_group = torch.cat(
        [q.reshape(groups, heads_per_group * d, hidden), k.reshape(groups, d, hidden), v.reshape(groups, d, hidden)],
        dim=1,
    )
    return per_group.reshape(-1, hidden)


def split_qkv(qkv: torch.Tensor, hf_config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of :func:`fuse_qkv`."""
    groups, d = hf_config.num_key_value_heads, head_dim(hf_config)
    heads_per_group = hf_config.num_attention_heads // groups
    hidden = qkv.shape[1]
    q, k, v = qkv.reshape(groups, (heads_per_group + 2) * d, hidden).split([heads_per_group * d, d, d], dim=1)
    return q.reshape(-1, hidden), k.reshape(-1, hidden), v.reshape(-1, hidden)


_VOCAB_ROWS = ("embedding.word_embeddings.weight", "output_layer.weight")


def _pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    if rows < tensor.shape[0]:
        raise ValueError(f"megatron conversion: padded vocabulary {rows} is smaller than the HF one {tensor.shape[0]}")
    return torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])])


def hf_to_megatron(
    hf_state: Mapping[str, torch.Tensor], hf_config, padded_vocab_size: int | None = None
) -> dict[str, torch.Tensor]:
    """A full HF state dict -> the full (unsharded, all layers) Megatron state dict; unknown names are refused.
    ``padded_vocab_size``: the embedding and output rows the model has (zero rows added; None: the HF vocabulary)."""
    check_supported(hf_config)
    rows = padded_vocab_size or hf_config.vocab_size
    out: dict[str, torch.Tensor] = {
        "embedding.word_embeddings.weight": _pad_rows(hf_state["model.embed_tokens.weight"], rows)
    }
    out["decoder.final_layernorm.weight"] = hf_state["model.norm.weight"]
    if not _tied(hf_config):
        out["output_layer.weight"] = _pad_rows(hf_state["lm_head.weight"], rows)
    known = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for layer in range(hf_config.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        for hf_name, megatron_name in _LAYER_DIRECT.items():
            if prefix + hf_name in hf_state:
                out[f"decoder.layers.{layer}.{megatron_name}"] = hf_state[prefix + hf_name]
        q, k, v = (hf_state[f"{prefix}self_attn.{p}_proj.weight"] for p in "qkv")
        out[f"decoder.layers.{layer}.self_attention.linear_qkv.weight"] = fuse_qkv(q, k, v, hf_config)
        gate, up = hf_state[prefix + "mlp.gate_proj.weight"], hf_state[prefix + "mlp.up_proj.weight"]
        out[f"decoder.layers.{layer}.mlp.linear_fc1.weight"] = torch.cat([gate, up], dim=0)
        known |= {prefix + name for name in (*_LAYER_DIRECT, *_FUSED_HF)}
    unknown = sorted(set(hf_state) - known - {"lm_head.weight"})
    if unknown:
        raise ValueError(f"megatron conversion: HF tensor(s) {unknown[:3]} have no Megatron counterpart")
    return out


def megatron_to_hf(megatron_state: Mapping[str, torch.Tensor], hf_config) -> dict[str, torch.Tensor]:
    """The full Megatron state dict -> HF names and layouts (``save_pretrained``'s keys; tied: no ``lm_head``; the
    vocabulary's padding rows dropped)."""
    inverse = {megatron_name: hf_name for hf_name, megatron_name in _LAYER_DIRECT.items()}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in megatron_state.items():
        if name in _VOCAB_ROWS:
            tensor = tensor[: hf_config.vocab_size]
        if name == "embedding.word_embeddings.weight":
            out["model.embed_tokens.weight"] = tensor
        elif name == "decoder.final_layernorm.weight":
            out["model.norm.weight"] = tensor
        elif name == "output_layer.weight":
            if not _tied(hf_config):
                out["lm_head.weight"] = tensor
        elif (match := _LAYER.match(name)) is None:
            raise ValueError(f"megatron conversion: {name!r} has no HF counterpart")
        else:
            prefix, rest = f"model.layers.{match.group(1)}.", match.group(2)
            if rest == "self_attention.linear_qkv.weight":
                for part, value in zip("qkv", split_qkv(tensor, hf_config), strict=True):
                    out[f"{prefix}self_attn.{part}_proj.weight"] = value
            elif rest == "mlp.linear_fc1.weight":
                gate, up = tensor.chunk(2, dim=0)
                out[prefix + "mlp.gate_proj.weight"], out[prefix + "mlp.up_proj.weight"] = gate, up
            elif rest in inverse:
                out[prefix + inverse[rest]] = tensor
            else:
                raise ValueError(f"megatron conversion: {name!r} has no HF counterpart")
    return out


def _tp_dim(name: str) -> int | None:
    match = _LAYER.match(name)
    return _TP_DIM.get(match.group(2) if match else name)


def tp_shard(name: str, tensor: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    """This tensor-parallel rank's slice of a full Megatron tensor (the full tensor if it is replicated)."""
    dim = _tp_dim(name)
    if dim is None or tp_size == 1:
        return tensor
    if tensor.shape[dim] % tp_size:
        raise ValueError(f"megatron conversion: {name} dim {dim} ({tensor.shape[dim]}) does not split in {tp_size}")
    if name.endswith("mlp.linear_fc1.weight"):  # each rank: its slice of gate, then its slice of up
        gate, up = tensor.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp_size, dim=0)[tp_rank], up.chunk(tp_size, dim=0)[tp_rank]], dim=0)
    return tensor.chunk(tp_size, dim=dim)[tp_rank]


def tp_merge(name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """The inverse of :func:`tp_shard` given every rank's slice in rank order."""
    dim = _tp_dim(name)
    if dim is None or len(shards) == 1:
        return shards[0]
    if name.endswith("mlp.linear_fc1.weight"):
        gates, ups = zip(*(shard.chunk(2, dim=0) for shard in shards), strict=True)
        return torch.cat([*gates, *ups], dim=0)
    return torch.cat(shards, dim=dim)


def stage_state(
    full: Mapping[str, torch.Tensor], *, first_layer: int, num_layers: int, pre_process: bool, post_process: bool
) -> dict[str, torch.Tensor]:
    """The entries of one pipeline stage, its layers renumbered from 0 (how its ``GPTModel`` names them)."""
    out = {}
    for name, tensor in full.items():
        match = _LAYER.match(name)
        if match:
            layer = int(match.group(1))
            if first_layer <= layer < first_layer + num_layers:
                out[f"decoder.layers.{layer - first_layer}.{match.group(2)}"] = tensor
        elif name == "embedding.word_embeddings.weight":
            if pre_process:
                out[name] = tensor
        elif post_process:
            out[name] = tensor
    return out
