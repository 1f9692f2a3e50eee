"""Clipped policy-gradient loss (PPO / GRPO) with optional reference KL and generator importance correction.

Per policy-generated token t (all tensors in the same next-token frame, see ``clipped_pg_loss``):

    r_t    = exp(log pi_theta(a_t) - log pi_old(a_t))                         probability ratio
    L^PG_t = max(-A_t r_t, -A_t clip(r_t, 1 - ratio_clip_min, 1 + ratio_clip_max))
    L^PG_t = min(L^PG_t, -c A_t)   where A_t < 0, if ratio_clip_c = c is set    (dual clip)
    w_t    = exp(log pi_old(a_t) - log pi_gen(a_t)), detached                 (if use_importance_sampling_correction)
    w'_t   = TIS(w_t), if truncated_importance_sampling_ratio is set              (see below)
    L_t    = w'_t L^PG_t + beta w'_t KL_t(pi_theta || pi_ref)                   (beta = reference_policy_kl_penalty)

and the loss is the mean of L_t over every valid token of the batch (``token_level_loss``) or the mean over
sequences of each sequence's token mean. Minimising it maximises the clipped surrogate
E[min(r A, clip(r) A)] - beta KL.

References: PPO https://arxiv.org/abs/1707.06347; GRPO https://arxiv.org/abs/2402.03300; asymmetric clip
(DAPO) https://arxiv.org/abs/2503.14476; dual clip https://arxiv.org/abs/1912.09729; KL estimators k1/k2/k3
http://joschu.net/blog/kl-approx.html. Config keys and semantics follow NeMo-RL's ``ClippedPGLossFn``.

``pi_old`` (``prev_logprobs``) is the trainer's view of the sampling policy; ``pi_gen``
(``generation_logprobs``) is what the generator (vLLM, llama.cpp, ...) reported. They differ through numerics
or staleness; the importance weight corrects for it. Truncated importance sampling (TIS) bounds that weight, with
``lower = truncated_importance_sampling_ratio_min``, ``upper = truncated_importance_sampling_ratio``, ``m`` the
``[B, T]`` mask of valid tokens and ``w`` the ``[B, T]`` weights (``truncated_importance_sampling_type``):

    tis           w'_{b,t} = clamp(w_{b,t}, lower or 0, upper)
    icepop        w'_{b,t} = w_{b,t} if lower <= w_{b,t} <= upper, else 0
    seq-mask-tis  g_b = exp(sum_t m_{b,t} log w_{b,t} / sum_t m_{b,t})                 ([B], geometric mean)
                  w'_{b,t} = w_{b,t} if lower <= g_b <= upper, else 0 (the whole sequence)

(:mod:`nemo_tau2.algorithms.importance_sampling`; references there).
"""

import torch

from nemo_tau2.algorithms.importance_sampling import truncate_importance_weights, truncation_metrics
from nemo_tau2.algorithms.loss_config import ClippedPGLossConfig, KLType
from nemo_tau2.models.policy.data import entropy_from_logits


def calculate_kl(
    logprobs: torch.Tensor,
    reference_logprobs: torch.Tensor,
    kl_type: KLType = "k3",
    input_clamp_value: float | None = 20.0,
    output_clamp_value: float | None = 10.0,
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled tokens (Schulman 2020), shape of the inputs.

    With ``x = log pi_ref - log pi`` (clamped to ``+-input_clamp_value``): k1 = -x, k2 = x^2 / 2,
    k3 = exp(x) - 1 - x; the result is clamped to ``+-output_clamp_value``.
    """
    x = reference_logprobs - logprobs
    if input_clamp_value is not None:
        x = x.clamp(-input_clamp_value, input_clamp_value)
    if kl_type == "k1":
        kl = -x
    elif kl_type == "k2":
        kl = x.square() / 2
    elif kl_type == "k3":
        kl = torch.exp(x) - 1 - x
    else:
        raise ValueError(f"reference_policy_kl_type must be one of k1, k2, k3, got {kl_type!r}")
    if output_clamp_value is not None:
        kl = kl.clamp(-output_clamp_value, output_clamp_value)
    return kl


def _check_shapes(named: dict[str, torch.Tensor | None], advantages: torch.Tensor, sample_mask: torch.Tensor) -> None:
    shape = named["curr_logprobs"].shape
    if len(shape) != 2:
        raise ValueError(f"curr_logprobs must have shape [B, T], got {tuple(shape)}")
    for name, tensor in named.items():
        if tensor is not None and tensor.shape != shape:
            raise ValueError(f"{name} must have shape {tuple(shape)} like curr_logprobs, got {tuple(tensor.shape)}")
    if advantages.shape not in (shape, shape[:1]):
        raise ValueError(f"advantages must have shape [B] or [B, T] = {tuple(shape)}, got {tuple(advantages.shape)}")
    if sample_mask.shape != shape[:1]:
        raise ValueError(f"sample_mask must have shape [B] = {tuple(shape[:1])}, got {tuple(sample_mask.shape)}")


def _masked_stats(values: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float]:
    selected = values[mask.bool()]
    if selected.numel() == 0:
        return float("nan"), float("nan"), float("nan")
    return selected.mean().item(), selected.min().item(), selected.max().item()


def clipped_pg_loss(
    cfg: ClippedPGLossConfig,
    *,
    curr_logprobs: torch.Tensor,
    prev_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    token_mask: torch.Tensor,
    sample_mask: torch.Tensor,
    reference_logprobs: torch.Tensor | None = None,
    logits: torch.Tensor | None = None,
    global_valid_tokens: float | None = None,
    global_valid_seqs: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped policy-gradient loss of the module docstring, and diagnostics.

    Position t of every ``[B, T]`` tensor refers to the same token: ``*_logprobs[b, t]`` is the log-probability
    of token t of sequence b under that policy.

    Args:
        cfg: Loss settings.
        curr_logprobs: ``[B, T]`` under the policy being trained (carries the gradient).
        prev_logprobs: ``[B, T]`` under the sampling policy, computed by the trainer.
        generation_logprobs: ``[B, T]`` reported by the generator when it sampled the tokens.
        advantages: ``[B]`` (one per episode) or ``[B, T]``.
        token_mask: ``[B, T]`` 1 on policy-generated tokens only (prompt, user and tool tokens are 0).
        sample_mask: ``[B]`` 0 removes a whole episode from the loss (e.g. overlong filtering).
        reference_logprobs: ``[B, T]`` under the reference policy; required when the KL penalty is on.
        logits: ``[B, T, V]`` of the current policy, for the exact entropy metric only.
        global_valid_tokens: Token-level normaliser when the batch is one microbatch of a larger one
            (the count of valid tokens in the whole batch); defaults to this batch's count.
        global_valid_seqs: Sequence-level normaliser, likewise (valid sequences in the whole batch).

    Returns:
        ``(loss, metrics)``: the scalar loss to minimise and float metrics (``loss``, ``pg_loss``,
        ``kl_penalty``, ``clip_fraction``, ``dual_clip_fraction``, ``approx_kl``, ``probs_ratio_{mean,min,max}``,
        ``importance_weight_{mean,min,max}``, ``token_mult_prob_error``, ``num_valid_tokens``,
        ``num_valid_samples``, ``entropy`` when logits are given, and with truncated IS those of
        :func:`~nemo_tau2.algorithms.importance_sampling.truncation_metrics`) over this batch's valid tokens.
    """
    named = {
        "curr_logprobs": curr_logprobs,
        "prev_logprobs": prev_logprobs,
        "generation_logprobs": generation_logprobs,
        "token_mask": token_mask,
        "reference_logprobs": reference_logprobs,
    }
    _check_shapes(named, advantages, sample_mask)
    beta = cfg.reference_policy_kl_penalty
    if beta > 0 and reference_logprobs is None:
        raise ValueError("reference_logprobs are required when reference_policy_kl_penalty > 0")

    mask = token_mask.float() * sample_mask.float().unsqueeze(-1)
    tokens_per_seq = mask.sum(dim=-1)
    valid_seqs = (tokens_per_seq > 0).float()

    def on_valid(tensor: torch.Tensor) -> torch.Tensor:
        # Padding and prompt positions may hold -inf or floor values; zero them so that neither the loss nor
        # its gradient can pick up inf * 0 = nan there.
        return torch.where(mask > 0, tensor.float(), 0.0)

    curr = on_valid(curr_logprobs)
    prev, gen = on_valid(prev_logprobs).detach(), on_valid(generation_logprobs).detach()
    adv = on_valid((advantages if advantages.ndim == 2 else advantages.unsqueeze(-1)).expand_as(curr_logprobs))

    ratio = torch.exp(curr - prev)
    clipped_ratio = ratio.clamp(1 - cfg.ratio_clip_min, 1 + cfg.ratio_clip_max)
    pg = torch.maximum(-adv * ratio, -adv * clipped_ratio)
    dual_clipped = torch.zeros_like(mask, dtype=torch.bool)
    if cfg.ratio_clip_c is not None:
        dual_bound = -adv * cfg.ratio_clip_c
        dual_clipped = (adv < 0) & (pg > dual_bound)
        pg = torch.where(dual_clipped, dual_bound, pg)

    is_weight = torch.nan_to_num(torch.exp(prev - gen), nan=0.0, posinf=0.0, neginf=0.0)
    weight = is_weight if cfg.use_importance_sampling_correction else torch.ones_like(is_weight)
    truncated = None
    if cfg.truncation_type is not None:
        truncated = truncate_importance_weights(
            is_weight, prev - gen, mask, cfg.truncation_type,
            cfg.truncated_importance_sampling_ratio_min, cfg.truncated_importance_sampling_ratio,
        )  # fmt: skip
        weight = truncated.weight
    kl = torch.zeros_like(curr)
    if beta > 0:
        kl = calculate_kl(
            curr, on_valid(reference_logprobs).detach(), cfg.reference_policy_kl_type,
            cfg.kl_input_clamp_value, cfg.kl_output_clamp_value,
        )  # fmt: skip

    def reduce(per_token: torch.Tensor) -> torch.Tensor:
        if cfg.token_level_loss:
            total = global_valid_tokens if global_valid_tokens is not None else mask.sum().clamp(min=1)
            return (per_token * mask).sum() / total
        per_seq = (per_token * mask).sum(dim=-1) / tokens_per_seq.clamp(min=1)
        total = global_valid_seqs if global_valid_seqs is not None else valid_seqs.sum().clamp(min=1)
        return (per_seq * valid_seqs).sum() / total

    pg_loss = reduce(weight * pg)
    kl_loss = reduce(weight * kl)
    loss = pg_loss + beta * kl_loss

    with torch.no_grad():
        num_tokens = mask.sum().clamp(min=1)
        outside = (ratio < 1 - cfg.ratio_clip_min) | (ratio > 1 + cfg.ratio_clip_max)
        ratio_stats = _masked_stats(ratio, mask)
        weight_stats = _masked_stats(is_weight, mask)
        metrics = {
            "loss": loss.item(),
            "pg_loss": pg_loss.item(),
            "kl_penalty": ((kl * mask).sum() / num_tokens).item(),
            "clip_fraction": ((outside.float() * mask).sum() / num_tokens).item(),
            "dual_clip_fraction": ((dual_clipped.float() * mask).sum() / num_tokens).item(),
            "approx_kl": ((((ratio - 1) - (curr - prev)) * mask).sum() / num_tokens).item(),
            "probs_ratio_mean": ratio_stats[0],
            "probs_ratio_min": ratio_stats[1],
            "probs_ratio_max": ratio_stats[2],
            "importance_weight_mean": weight_stats[0],
            "importance_weight_min": weight_stats[1],
            "importance_weight_max": weight_stats[2],
            "token_mult_prob_error": ((torch.exp((gen - prev).abs()) * mask).sum() / num_tokens).item(),
            "num_valid_tokens": mask.sum().item(),
            "num_valid_samples": valid_seqs.sum().item(),
        }
        if logits is not None:
            if logits.shape[:2] != curr.shape:
                raise ValueError(f"logits must have shape [B, T, V] with [B, T] = {tuple(curr.shape)}")
            metrics["entropy"] = ((entropy_from_logits(logits) * mask).sum() / num_tokens).item()
        if truncated is not None:
            metrics.update(truncation_metrics(truncated, mask, cfg.truncation_type))
    return loss, metrics


class ClippedPGLossFn:
    """:func:`clipped_pg_loss` with its config bound, as the trainer calls it (NeMo-RL's ``ClippedPGLossFn``).

    >>> policy.train(sequences, ClippedPGLossFn(cfg.loss_fn))
    """

    def __init__(self, cfg: ClippedPGLossConfig) -> None:
        self.cfg = cfg

    needs_prev_logprobs = True

    @property
    def needs_reference_logprobs(self) -> bool:
        return self.cfg.reference_policy_kl_penalty > 0

    def __call__(self, **tensors: torch.Tensor | float | None) -> tuple[torch.Tensor, dict[str, float]]:
        return clipped_pg_loss(self.cfg, **tensors)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"ClippedPGLossFn({self.cfg!r})"


def nll_loss(
    *,
    curr_logprobs: torch.Tensor,
    token_mask: torch.Tensor,
    sample_mask: torch.Tensor,
    global_valid_tokens: float | None = None,
    **_unused: torch.Tensor | float | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Supervised fine-tuning's loss: the mean negative log-likelihood of the masked-in tokens (assistant turns).

    ``mean_t -log pi_theta(x_t)`` over tokens with ``token_mask * sample_mask == 1``, divided by the valid tokens of
    the whole global batch (``global_valid_tokens``) so micro-batch losses add up. Masked positions are selected
    away with ``torch.where`` before anything touches them, so whatever they hold (NaN, -inf) changes neither the
    loss nor its gradient; the other tensors the trainer passes (advantages, generation logprobs) are not read.
    """
    mask = (token_mask.float() * sample_mask.float().unsqueeze(-1)) > 0
    nll = torch.where(mask, -curr_logprobs, torch.zeros((), dtype=curr_logprobs.dtype, device=curr_logprobs.device))
    num_tokens = mask.sum()
    total = global_valid_tokens if global_valid_tokens is not None else num_tokens.clamp(min=1)
    loss = nll.sum() / total
    with torch.no_grad():
        metrics = {
            "loss": loss.item(),
            "nll_per_token": (nll.sum() / num_tokens.clamp(min=1)).item(),
            "num_valid_tokens": num_tokens.item(),
            "num_valid_samples": (mask.sum(-1) > 0).sum().item(),
        }
    return loss, metrics


class NLLLossFn:
    """:func:`nll_loss` as the trainer calls it (NeMo-RL's ``NLLLoss``): ``policy.train(sequences, NLLLossFn())``."""

    needs_prev_logprobs = False
    needs_reference_logprobs = False

    def __call__(self, **tensors: torch.Tensor | float | None) -> tuple[torch.Tensor, dict[str, float]]:
        return nll_loss(**tensors)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return "NLLLossFn()"
