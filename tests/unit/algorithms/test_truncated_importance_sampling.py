"""Truncated importance sampling (tis, icepop, seq-mask-tis) on a 4x4 batch whose weights are known by hand.

prev = 0 and gen = -log w, so the raw weight exp(prev - gen) is exactly w. Bounds [0.5, 2.0]; x = masked token:

    row 0: 0.25  0.8  1.0  4.0      geometric mean 0.8^(1/4)  = 0.946  kept
    row 1: 1.5   0.6  1.8  x(100)   geometric mean 1.62^(1/3) = 1.174  kept
    row 2: 3.0   4.0  0.9  2.5      geometric mean 27^(1/4)   = 2.280  masked (above 2.0)
    row 3: 0.2   0.3  x(10) x(10)   geometric mean 0.06^(1/2) = 0.245  masked (below 0.5); counting the masked
                                    tokens it would be 6^(1/4) = 1.565 and kept

13 valid tokens; 7 have a weight outside the bounds (3 below 0.5, 4 above 2.0).
"""

import math

import pytest
import torch

from nemo_tau2.algorithms.importance_sampling import truncate_importance_weights
from nemo_tau2.algorithms.loss import ClippedPGLossConfig, clipped_pg_loss

X = float("nan")  # a masked position in the expected weights
WEIGHTS = [[0.25, 0.8, 1.0, 4.0], [1.5, 0.6, 1.8, 100.0], [3.0, 4.0, 0.9, 2.5], [0.2, 0.3, 10.0, 10.0]]
TOKEN_MASK = [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]]
EXPECTED = {
    "tis": [[0.5, 0.8, 1.0, 2.0], [1.5, 0.6, 1.8, X], [2.0, 2.0, 0.9, 2.0], [0.5, 0.5, X, X]],
    "icepop": [[0.0, 0.8, 1.0, 0.0], [1.5, 0.6, 1.8, X], [0.0, 0.0, 0.9, 0.0], [0.0, 0.0, X, X]],
    "seq-mask-tis": [[0.25, 0.8, 1.0, 4.0], [1.5, 0.6, 1.8, X], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, X, X]],
}
CHANGED = {
    "tis": [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 0, 1], [1, 1, 0, 0]],
    "icepop": [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 0, 1], [1, 1, 0, 0]],
    "seq-mask-tis": [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]],
}
# (changed-fraction key, its value, is_oob_ratio): tokens out of 13, or sequences out of 4 for seq-mask-tis
FRACTIONS = {
    "tis": ("importance_weight_clipped_fraction", 7 / 13, 7 / 13),
    "icepop": ("importance_weight_masked_fraction", 7 / 13, 7 / 13),
    "seq-mask-tis": ("importance_weight_masked_fraction", 6 / 13, 2 / 4),
}


def batch(advantages=(1.0, 1.0, 1.0, 1.0)) -> dict:
    prev = torch.zeros(4, 4)
    return {
        "curr_logprobs": prev.clone().requires_grad_(),  # ratio 1: no PPO clipping, L^PG = -A
        "prev_logprobs": prev,
        "generation_logprobs": -torch.tensor(WEIGHTS).log(),
        "advantages": torch.tensor(advantages),
        "token_mask": torch.tensor(TOKEN_MASK),
        "sample_mask": torch.ones(4),
    }


def tis_config(kind: str | None, lower: float | None = 0.5, upper: float | None = 2.0) -> ClippedPGLossConfig:
    return ClippedPGLossConfig(
        reference_policy_kl_penalty=0.0,
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type=kind,
        truncated_importance_sampling_ratio=upper,
        truncated_importance_sampling_ratio_min=lower,
    )


def valid(values) -> list[float]:
    return [v for row, mask in zip(values, TOKEN_MASK, strict=True) for v, m in zip(row, mask, strict=True) if m]


@pytest.mark.parametrize("kind", ["tis", "icepop", "seq-mask-tis"])
def test_each_type_changes_exactly_the_tokens_it_should(kind):
    w = torch.tensor(WEIGHTS)
    truncated = truncate_importance_weights(w, w.log(), torch.tensor(TOKEN_MASK).float(), kind, 0.5, 2.0)
    assert valid(truncated.weight.tolist()) == pytest.approx(valid(EXPECTED[kind]))
    assert truncated.changed.int().tolist() == CHANGED[kind]
    if kind == "seq-mask-tis":  # the masked tokens of row 3 do not count in its geometric mean
        assert truncated.sequence_out_of_bounds.tolist() == [False, False, True, True]


@pytest.mark.parametrize("kind", ["tis", "icepop", "seq-mask-tis"])
def test_the_loss_and_its_gradient_use_the_truncated_weights(kind):
    inputs = batch()
    loss, metrics = clipped_pg_loss(tis_config(kind), **inputs)
    weights = valid(EXPECTED[kind])
    assert loss.item() == pytest.approx(-sum(weights) / 13)  # A = 1, r = 1: L_t = -w'_t, mean over 13 tokens
    loss.backward()
    assert valid(inputs["curr_logprobs"].grad.tolist()) == pytest.approx([-w / 13 for w in weights])
    key, changed, oob = FRACTIONS[kind]
    assert metrics[key] == pytest.approx(changed)
    assert metrics["is_oob_ratio"] == pytest.approx(oob)
    assert metrics["truncated_importance_weight_mean"] == pytest.approx(sum(weights) / 13)
    assert metrics["truncated_importance_weight_min"] == pytest.approx(min(weights))
    assert metrics["truncated_importance_weight_max"] == pytest.approx(max(weights))
    assert metrics["importance_weight_max"] == pytest.approx(4.0)  # the raw weights' stats are unchanged


def test_tis_without_a_lower_bound_clips_above_only():
    loss, metrics = clipped_pg_loss(tis_config(None, lower=None), **batch())  # type null + ratio = tis
    clipped_above = [min(w, 2.0) for w in valid(WEIGHTS)]
    assert loss.item() == pytest.approx(-sum(clipped_above) / 13)
    assert metrics["importance_weight_clipped_fraction"] == pytest.approx(4 / 13)


def test_with_truncation_off_the_loss_is_todays_bit_for_bit():
    torch.manual_seed(0)
    prev = torch.randn(3, 5)
    inputs = {
        "prev_logprobs": prev,
        "generation_logprobs": prev + 0.3 * torch.randn(3, 5),
        "advantages": torch.randn(3),
        "token_mask": (torch.rand(3, 5) > 0.3).int(),
        "sample_mask": torch.tensor([1, 0, 1]),
    }
    curr = prev + 0.2 * torch.randn(3, 5)
    results = []
    for cfg in (
        ClippedPGLossConfig(reference_policy_kl_penalty=0.0, use_importance_sampling_correction=True),
        tis_config("tis", lower=0.0, upper=1e6),  # bounds no weight reaches: the same numbers
    ):
        leaf = curr.clone().requires_grad_()
        loss, metrics = clipped_pg_loss(cfg, curr_logprobs=leaf, **inputs)
        loss.backward()
        results.append((loss.detach(), leaf.grad, metrics))
    (off_loss, off_grad, off_metrics), (on_loss, on_grad, _) = results
    assert torch.equal(off_loss, on_loss) and torch.equal(off_grad, on_grad)
    assert "is_oob_ratio" not in off_metrics
    # today's formula, written out: sum_t w_t max(-A r_t, -A clip(r_t)) m_t / sum m
    mask = inputs["token_mask"].float() * inputs["sample_mask"].float().unsqueeze(-1)
    ratio = torch.exp(torch.where(mask > 0, curr - prev, 0.0))
    adv = inputs["advantages"].unsqueeze(-1).expand_as(curr) * mask
    weight = torch.exp(torch.where(mask > 0, prev - inputs["generation_logprobs"], 0.0))
    expected = (weight * torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)) * mask).sum() / mask.sum()
    assert off_loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert math.isfinite(off_loss.item())
