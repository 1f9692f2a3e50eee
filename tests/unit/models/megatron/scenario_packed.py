"""Scenario bodies of the packed-row attention (run in the shared spawns, see ``scenario_bodies._in_sequence``): the
Megatron stage on one packed row against transformers on each sequence alone, and a recorder of the shapes a run
makes, which sees any ``N x N`` tensor over a whole packed row (a dense block-causal mask or dense scores)."""

from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from nemo_tau2.models.megatron.hf_weights import full_hf_state, load_hf_state, read_hf_state
from nemo_tau2.models.megatron.model import build_gpt_model, hf_vocab_logits, transformer_config
from nemo_tau2.models.megatron.packed_attention import SDPA, packed_seq_params, sequence_lengths
from nemo_tau2.models.megatron.parallel import destroy_megatron, initialize_megatron
from nemo_tau2.models.policy.data import token_logprobs
from tests.unit.models.megatron.scenarios import tiny_hf_model

LENGTHS = (7, 12, 5, 9)  # a row of 33 tokens: no other dimension of the tiny model is 33


class RowSquares(TorchDispatchMode):
    """Records the shape of every tensor an op makes that ends in ``width x width`` (an ``N x N`` matrix over a
    packed row of ``width`` tokens: a mask ``[1, 1, N, N]``, scores ``[heads, N, N]``), and how many tensors had
    ``width`` at all (the recorder saw the row)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width, self.squares, self.row_tensors = width, [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, tuple | list) else (out,):
            if isinstance(tensor, torch.Tensor):
                self.row_tensors += self.width in tensor.shape
                if tuple(tensor.shape[-2:]) == (self.width, self.width):
                    self.squares.append(tuple(tensor.shape))
        return out


def _row(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(0, vocab, (sum(LENGTHS),), generator=generator)
    positions = torch.cat([torch.arange(n) for n in LENGTHS])
    weights = torch.rand(sum(LENGTHS), generator=generator) * (positions > 0)  # no prediction across sequences
    return ids, positions, weights


def _sum_qk_norm_grads_over_tp(model) -> None:
    """Each TP rank's q/k norm weights see only its heads: their gradients are summed over TP (as the training
    step's ``finalize_model_grads`` does), the others are whole or slices already."""
    from megatron.core import parallel_state

    for name, param in model.named_parameters():
        if "q_layernorm" in name or "k_layernorm" in name:
            dist.all_reduce(param.grad, group=parallel_state.get_tensor_model_parallel_group())


def _grads_as_hf(model, hf_config) -> dict[str, torch.Tensor] | None:
    """Every parameter's gradient in HF names and shapes (TP slices gathered), through the weight export: the
    gradients are swapped in as the parameters' values for it."""
    values = {name: p.data for name, p in model.named_parameters()}
    for param in model.parameters():
        param.data = param.grad
    try:
        return full_hf_state(model, hf_config)
    finally:
        for name, param in model.named_parameters():
            param.data = values[name]


def packed_attention(tmp: Path, tp: int = 1) -> dict:
    """One packed row of 4 sequences through the Megatron stage (fp32, TP=``tp``), forward and backward of a
    weighted sum of its logprobs; the same per sequence through transformers (eager attention, each sequence
    alone). Logprobs and every parameter's gradient, and the ``N x N`` tensors the Megatron run made."""
    initialize_megatron(tp, 1, seed=0)
    hf_model, hf_config = tiny_hf_model("qwen3")
    if dist.get_rank() == 0:
        hf_model.save_pretrained(tmp / "hf")
    dist.barrier()
    model = build_gpt_model(hf_config, transformer_config(hf_config, tensor_model_parallel_size=tp),
                            padded_vocab_size=128 * tp)  # fmt: skip
    load_hf_state(model, read_hf_state(tmp / "hf"), hf_config)
    ids, positions, weights = _row(hf_config.vocab_size)
    recorder = RowSquares(len(ids))
    with recorder:
        params = packed_seq_params(sequence_lengths(positions[None]), "cpu", SDPA)
        logits = hf_vocab_logits(model(ids[None], positions[None], None, packed_seq_params=params), hf_config)
        logprobs = token_logprobs(logits, ids[None])[0]
        (logprobs * weights).sum().backward()
    _sum_qk_norm_grads_over_tp(model)
    grads = _grads_as_hf(model, hf_config)
    destroy_megatron()
    hf_logprobs = []
    for piece_ids, piece_weights in zip(ids.split(LENGTHS), weights.split(LENGTHS), strict=True):
        piece = token_logprobs(hf_model(piece_ids[None]).logits, piece_ids[None])[0]
        (piece * piece_weights).sum().backward()
        hf_logprobs.append(piece)
    if grads is None:  # not rank 0
        return {}
    hf_grads = {name: p.grad for name, p in hf_model.named_parameters()}
    if "lm_head.weight" in grads and "lm_head.weight" not in hf_grads:  # tied: the export names both
        grads.pop("lm_head.weight")
    in_frame = positions > 0
    return {
        "logprob_max_abs_diff": (logprobs - torch.cat(hf_logprobs)).abs()[in_frame].max().item(),
        "logprob_scale": logprobs[in_frame].abs().mean().item(),
        "grad_names_equal": sorted(grads) == sorted(hf_grads),
        "grad_max_rel_diff": max(
            ((grads[name] - hf_grads[name]).abs().max() / hf_grads[name].abs().max()).item() for name in hf_grads
        ),
        "grad_scale": min(hf_grads[name].abs().max().item() for name in hf_grads),
        "row_squares": recorder.squares,
        "row_tensors": recorder.row_tensors,
    }


def packed_attention_tp2(tmp: Path) -> dict:
    return packed_attention(tmp, tp=2)
