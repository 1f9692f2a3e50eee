"""Truncated importance sampling (TIS): bounding the generator-mismatch weight of the clipped PG loss.

The loss weights each policy token by ``w = exp(log pi_old - log pi_gen)`` (trainer over generator probability,
``loss_fn.use_importance_sampling_correction``). When generation runs ahead of training (async GRPO) or with
other numerics, a few tokens get huge or tiny weights and dominate the gradient; TIS bounds their effect.
NeMo-RL's ``loss_fn.truncated_importance_sampling_{type,ratio,ratio_min}`` keys and semantics, with
``lower = truncated_importance_sampling_ratio_min`` and ``upper = truncated_importance_sampling_ratio``:

- ``tis``: ``w'_{b,t} = clamp(w_{b,t}, lower or 0, upper)`` (clip each token's weight).
- ``icepop``: ``w'_{b,t} = w_{b,t}`` if ``lower <= w_{b,t} <= upper`` else 0 (drop tokens far off the generator).
- ``seq-mask-tis``: ``g_b = exp(sum_t m_{b,t} (log pi_old - log pi_gen)_{b,t} / sum_t m_{b,t})``, the geometric
  mean of sequence b's token weights over its valid tokens ``m``; ``w'_{b,t} = w_{b,t}`` (raw, unclipped) if
  ``lower <= g_b <= upper`` else 0 on every token of b.

References: TIS https://fengyao.notion.site/off-policy-rl; IcePop and seq-mask-tis: "When Speed Kills Stability"
https://yingru.notion.site/When-Speed-Kills-Stability-Demystifying-RL-Collapse-from-the-Training-Inference-Mismatch-271211a558b7808d8b12d403fd15edda
"""

from dataclasses import dataclass

import torch

from nemo_tau2.algorithms.loss_config import TruncatedImportanceSamplingType


@dataclass
class TruncatedWeights:
    """The weights the loss applies and what truncation did to them, all ``[B, T]`` except ``sequence_out_of_bounds``.

    ``changed``: tokens whose weight was clipped (tis) or zeroed (icepop, seq-mask-tis). ``out_of_bounds``: tokens
    whose own weight lies outside the bounds (tis, icepop), or every token of a sequence whose geometric mean does
    (seq-mask-tis). ``sequence_out_of_bounds`` (``[B]``, seq-mask-tis only, else None): the masked sequences.
    """

    weight: torch.Tensor
    changed: torch.Tensor
    out_of_bounds: torch.Tensor
    sequence_out_of_bounds: torch.Tensor | None = None


def truncate_importance_weights(
    weight: torch.Tensor,
    log_weight: torch.Tensor,
    mask: torch.Tensor,
    kind: TruncatedImportanceSamplingType,
    lower: float | None,
    upper: float,
) -> TruncatedWeights:
    """Bound the per-token importance weights as ``kind`` says (module docstring).

    Args:
        weight: ``[B, T]`` raw weights ``w = exp(log pi_old - log pi_gen)``, detached, finite.
        log_weight: ``[B, T]`` ``log pi_old - log pi_gen``, 0 where ``mask`` is 0 (for seq-mask-tis's mean).
        mask: ``[B, T]`` 1.0 on the tokens that carry loss.
        kind: ``tis``, ``icepop`` or ``seq-mask-tis``.
        lower: Lower bound; None means 0 for tis (the config requires it for icepop and seq-mask-tis).
        upper: Upper bound.
    """
    low = 0.0 if lower is None else lower
    valid = mask > 0
    if kind == "tis":
        truncated = weight.clamp(low, upper)
        outside = ((weight < low) | (weight > upper)) & valid
        return TruncatedWeights(truncated, changed=outside, out_of_bounds=outside)
    if kind == "icepop":
        outside = ((weight < low) | (weight > upper)) & valid
        return TruncatedWeights(torch.where(outside, 0.0, weight), changed=outside, out_of_bounds=outside)
    if kind == "seq-mask-tis":
        tokens = mask.sum(dim=-1)
        geometric_mean = torch.exp((log_weight * mask).sum(dim=-1) / tokens.clamp(min=1))
        masked_seq = ((geometric_mean < low) | (geometric_mean > upper)) & (tokens > 0)
        outside = masked_seq.unsqueeze(-1) & valid
        kept = torch.where(outside, 0.0, weight)
        return TruncatedWeights(kept, changed=outside, out_of_bounds=outside, sequence_out_of_bounds=masked_seq)
    raise ValueError(f"truncated_importance_sampling_type must be one of tis, icepop, seq-mask-tis, got {kind!r}")


def truncation_metrics(truncated: TruncatedWeights, mask: torch.Tensor, kind: str) -> dict[str, float]:
    """Loss metrics of the truncation over the valid tokens of ``mask`` (``[B, T]``).

    ``truncated_importance_weight_{mean,min,max}``: the weights applied; ``importance_weight_clipped_fraction``
    (tis) or ``importance_weight_masked_fraction`` (icepop, seq-mask-tis): the share of valid tokens changed;
    ``is_oob_ratio`` (NeMo-RL's name): the share out of bounds, of valid tokens (tis, icepop) or of valid
    sequences (seq-mask-tis).
    """
    valid = mask > 0
    num_tokens = valid.sum().clamp(min=1)
    applied = truncated.weight[valid]
    changed = (truncated.changed & valid).sum() / num_tokens
    if truncated.sequence_out_of_bounds is not None:
        sequences = valid.any(dim=-1)
        oob = (truncated.sequence_out_of_bounds & sequences).sum() / sequences.sum().clamp(min=1)
    else:
        oob = (truncated.out_of_bounds & valid).sum() / num_tokens
    empty = applied.numel() == 0
    return {
        "truncated_importance_weight_mean": float("nan") if empty else applied.mean().item(),
        "truncated_importance_weight_min": float("nan") if empty else applied.min().item(),
        "truncated_importance_weight_max": float("nan") if empty else applied.max().item(),
        f"importance_weight_{'clipped' if kind == 'tis' else 'masked'}_fraction": changed.item(),
        "is_oob_ratio": oob.item(),
    }
