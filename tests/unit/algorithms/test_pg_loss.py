"""Clipped policy-gradient loss, KL and importance correction against hand-computed values on 2x3 tensors.

The fixture batch (prev = log 0.5 everywhere, curr = prev + log r):

    ratios r   row 0 (A = +1): 1.0   1.5   0.5        row 1 (A = -2): 1.1   0.7   [1.0 masked]
    L^PG       max(-A r, -A clip(r, .8, 1.2)):
               row 0: -1.0  -1.2 (clipped)  -0.5     row 1: 2.2   1.6 (clipped)
    token-level loss    = (-1 - 1.2 - 0.5 + 2.2 + 1.6) / 5 = 1.1 / 5 = 0.22
    sequence-level loss = (-2.7 / 3 + 3.8 / 2) / 2 = (-0.9 + 1.9) / 2 = 0.5
"""

import math

import pytest
import torch
from pydantic import ValidationError

from nemo_tau2.algorithms.loss import ClippedPGLossConfig, calculate_kl, clipped_pg_loss, entropy_from_logits

LN2 = math.log(2.0)
RATIOS = [[1.0, 1.5, 0.5], [1.1, 0.7, 1.0]]


def batch(**overrides):
    prev = torch.full((2, 3), math.log(0.5))
    tensors = {
        "curr_logprobs": (prev + torch.tensor(RATIOS).log()).requires_grad_(),
        "prev_logprobs": prev,
        "generation_logprobs": prev.clone(),
        "advantages": torch.tensor([1.0, -2.0]),
        "token_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
        "sample_mask": torch.tensor([1, 1]),
    }
    tensors.update(overrides)
    return tensors


NO_KL = ClippedPGLossConfig(reference_policy_kl_penalty=0.0)


def test_token_level_clipped_loss_and_gradient():
    inputs = batch()
    loss, metrics = clipped_pg_loss(NO_KL, **inputs)
    assert loss.item() == pytest.approx(0.22)
    loss.backward()
    # d/dcurr of -A r is -A r where unclipped, 0 where the clipped branch is taken; / 5 tokens
    expected_grad = [[-1.0 / 5, 0.0, -0.5 / 5], [2 * 1.1 / 5, 0.0, 0.0]]
    torch.testing.assert_close(inputs["curr_logprobs"].grad, torch.tensor(expected_grad), atol=1e-6, rtol=0)
    assert metrics["pg_loss"] == pytest.approx(0.22)
    assert metrics["clip_fraction"] == pytest.approx(3 / 5)  # 1.5, 0.5 and 0.7 lie outside [0.8, 1.2]
    assert metrics["probs_ratio_mean"] == pytest.approx(4.8 / 5)
    assert (metrics["probs_ratio_min"], metrics["probs_ratio_max"]) == pytest.approx((0.5, 1.5))
    # approx_kl = mean((r - 1) - log r) = (0 + .0945349 + .1931472 + .0046898 + .0566749) / 5
    assert metrics["approx_kl"] == pytest.approx(0.3490468 / 5, abs=1e-6)
    assert metrics["num_valid_tokens"] == 5 and metrics["num_valid_samples"] == 2
    assert metrics["kl_penalty"] == 0.0 and metrics["dual_clip_fraction"] == 0.0


def test_sequence_level_loss_is_mean_of_sequence_means():
    cfg = ClippedPGLossConfig(reference_policy_kl_penalty=0.0, token_level_loss=False)
    loss, _ = clipped_pg_loss(cfg, **batch())
    assert loss.item() == pytest.approx(0.5)


def test_per_token_advantages_match_broadcast_per_episode_advantages():
    loss, _ = clipped_pg_loss(NO_KL, **batch(advantages=torch.tensor([[1.0] * 3, [-2.0] * 3])))
    assert loss.item() == pytest.approx(0.22)


def test_masked_tokens_and_samples_carry_no_loss():
    # A huge ratio on the masked token changes nothing; dropping row 1 leaves row 0's mean: -2.7 / 3.
    curr = torch.full((2, 3), math.log(0.5)) + torch.tensor([[1.0, 1.5, 0.5], [1.1, 0.7, 50.0]]).log()
    loss, _ = clipped_pg_loss(NO_KL, **batch(curr_logprobs=curr))
    assert loss.item() == pytest.approx(0.22)
    loss, metrics = clipped_pg_loss(NO_KL, **batch(sample_mask=torch.tensor([1, 0])))
    assert loss.item() == pytest.approx(-0.9)
    assert metrics["num_valid_samples"] == 1 and metrics["num_valid_tokens"] == 3


def test_infinite_logprobs_at_masked_positions_leave_loss_and_gradient_finite():
    inputs = batch()
    curr = inputs["curr_logprobs"].detach().clone()
    curr[1, 2] = float("-inf")
    inputs["curr_logprobs"] = curr.requires_grad_()
    inputs["prev_logprobs"] = inputs["prev_logprobs"].clone()
    inputs["prev_logprobs"][1, 2] = -9999.0  # vLLM's logprob floor
    inputs["generation_logprobs"][1, 2] = float("nan")
    inputs["reference_logprobs"] = torch.full((2, 3), math.log(0.5))
    inputs["reference_logprobs"][1, 2] = float("-inf")
    loss, metrics = clipped_pg_loss(ClippedPGLossConfig(use_importance_sampling_correction=True), **inputs)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(inputs["curr_logprobs"].grad).all()
    assert inputs["curr_logprobs"].grad[1, 2] == 0.0
    assert all(math.isfinite(value) for value in metrics.values())


def test_asymmetric_clip_bounds():
    cfg = ClippedPGLossConfig(reference_policy_kl_penalty=0.0, ratio_clip_min=0.2, ratio_clip_max=0.6)
    loss, metrics = clipped_pg_loss(cfg, **batch())
    assert loss.item() == pytest.approx((-1 - 1.5 - 0.5 + 2.2 + 1.6) / 5)  # 1.5 is inside [0.8, 1.6] now
    assert metrics["clip_fraction"] == pytest.approx(2 / 5)


def test_dual_clip_bounds_loss_of_negative_advantage_tokens():
    # row 0: A = -1, r = 4, 2 -> L^PG = max(4, 1.2) = 4 and 2; dual clip c = 3 caps the first at 3.
    # row 1: A = +1, r = 4, 1 -> L^PG = -1.2, -1 (dual clip only applies to A < 0).
    prev = torch.zeros(2, 2)
    inputs = {
        "curr_logprobs": torch.tensor([[4.0, 2.0], [4.0, 1.0]]).log().requires_grad_(),
        "prev_logprobs": prev,
        "generation_logprobs": prev,
        "advantages": torch.tensor([-1.0, 1.0]),
        "token_mask": torch.ones(2, 2),
        "sample_mask": torch.ones(2),
    }
    loss, _ = clipped_pg_loss(NO_KL, **inputs)
    assert loss.item() == pytest.approx((4 + 2 - 1.2 - 1) / 4)
    cfg = ClippedPGLossConfig(reference_policy_kl_penalty=0.0, ratio_clip_c=3.0)
    loss, metrics = clipped_pg_loss(cfg, **inputs)
    assert loss.item() == pytest.approx((3 + 2 - 1.2 - 1) / 4)
    assert metrics["dual_clip_fraction"] == pytest.approx(1 / 4)
    loss.backward()
    assert inputs["curr_logprobs"].grad[0].tolist() == pytest.approx([0.0, 2.0 / 4])  # capped token: no gradient


def test_importance_sampling_correction_weights_tokens_by_trainer_over_generator_probability():
    # generator probs: 0.25 at (0, 0) -> w = 0.5 / 0.25 = 2; 1.0 at (1, 0) -> w = 0.5; elsewhere equal -> w = 1
    gen = torch.full((2, 3), math.log(0.5))
    gen[0, 0], gen[1, 0] = math.log(0.25), 0.0
    cfg = ClippedPGLossConfig(reference_policy_kl_penalty=0.0, use_importance_sampling_correction=True)
    loss, metrics = clipped_pg_loss(cfg, **batch(generation_logprobs=gen))
    assert loss.item() == pytest.approx((2 * -1 - 1.2 - 0.5 + 0.5 * 2.2 + 1.6) / 5)  # = -1.0 / 5
    assert metrics["importance_weight_mean"] == pytest.approx((2 + 1 + 1 + 0.5 + 1) / 5)
    assert (metrics["importance_weight_min"], metrics["importance_weight_max"]) == pytest.approx((0.5, 2.0))
    assert metrics["token_mult_prob_error"] == pytest.approx((2 + 1 + 1 + 2 + 1) / 5)  # mean exp|gen - prev|
    # off: the same diagnostics, no reweighting
    loss, metrics = clipped_pg_loss(NO_KL, **batch(generation_logprobs=gen))
    assert loss.item() == pytest.approx(0.22)
    assert metrics["importance_weight_max"] == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("kl_type", "expected"),
    [("k1", [0.0, -LN2, LN2]), ("k2", [0.0, LN2**2 / 2, LN2**2 / 2]), ("k3", [0.0, 2 - 1 - LN2, 0.5 - 1 + LN2])],
)
def test_kl_estimators(kl_type, expected):
    logprobs = torch.tensor([-1.0, -1.0, -1.0])
    reference = logprobs + torch.tensor([0.0, LN2, -LN2])  # x = log pi_ref - log pi
    kl = calculate_kl(logprobs, reference, kl_type, input_clamp_value=None, output_clamp_value=None)
    assert kl.tolist() == pytest.approx(expected)


def test_kl_input_and_output_clamps():
    logprobs = torch.zeros(3)
    reference = torch.tensor([0.0, LN2, -LN2])
    kl = calculate_kl(logprobs, reference, "k3", input_clamp_value=0.5, output_clamp_value=None)
    assert kl.tolist() == pytest.approx([0.0, math.exp(0.5) - 1.5, math.exp(-0.5) - 0.5])  # .148721, .106531
    kl = calculate_kl(logprobs, reference, "k3", input_clamp_value=0.5, output_clamp_value=0.12)
    assert kl.tolist() == pytest.approx([0.0, 0.12, math.exp(-0.5) - 0.5])
    kl = calculate_kl(logprobs, reference, "k1", input_clamp_value=None, output_clamp_value=0.5)
    assert kl.tolist() == pytest.approx([0.0, -0.5, 0.5])


def test_reference_kl_penalty_in_loss_and_gradient():
    # x = ref - curr: row 0 [0, ln2, -ln2], row 1 [ln2, 0, 5 (masked)]; k3 = [0, .306853, .193147], [.306853, 0]
    inputs = batch()
    offsets = torch.tensor([[0.0, LN2, -LN2], [LN2, 0.0, 5.0]])
    inputs["reference_logprobs"] = inputs["curr_logprobs"].detach() + offsets
    cfg = ClippedPGLossConfig(reference_policy_kl_penalty=0.1, reference_policy_kl_type="k3")
    loss, metrics = clipped_pg_loss(cfg, **inputs)
    mean_kl = (2 * (1 - LN2) + (LN2 - 0.5)) / 5  # 0.1613706
    assert metrics["kl_penalty"] == pytest.approx(mean_kl)
    assert loss.item() == pytest.approx(0.22 + 0.1 * mean_kl)
    loss.backward()
    # d k3 / d curr = 1 - exp(x): -1 at x = ln2, 0.5 at x = -ln2; times beta / 5 tokens, added to the PG gradient
    expected_grad = [[-0.2, 0.1 / 5 * -1, -0.1 + 0.1 / 5 * 0.5], [0.44 + 0.1 / 5 * -1, 0.0, 0.0]]
    torch.testing.assert_close(inputs["curr_logprobs"].grad, torch.tensor(expected_grad), atol=1e-6, rtol=0)


def test_kl_penalty_requires_reference_logprobs():
    with pytest.raises(ValueError, match="reference_logprobs are required"):
        clipped_pg_loss(ClippedPGLossConfig(), **batch())


def test_entropy_from_logits():
    logits = torch.zeros(2, 3, 2)
    logits[0, 0] = torch.tensor([0.0, math.log(3.0)])  # p = [.25, .75]
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))  # 0.562335
    assert entropy_from_logits(logits)[0].tolist() == pytest.approx([h, LN2, LN2])
    _, metrics = clipped_pg_loss(NO_KL, **batch(), logits=logits)
    assert metrics["entropy"] == pytest.approx((h + 4 * LN2) / 5)  # over the 5 valid tokens


def test_microbatches_with_global_normalisers_sum_to_the_full_batch_loss():
    full = batch()
    for cfg, key, total, expected in [(NO_KL, "global_valid_tokens", 5, 0.22),
                                      (NO_KL.model_copy(update={"token_level_loss": False}), "global_valid_seqs", 2,
                                       0.5)]:  # fmt: skip
        parts = []
        for row in (0, 1):
            micro = {name: tensor[row : row + 1] for name, tensor in full.items()}
            micro["curr_logprobs"] = micro["curr_logprobs"].detach()
            parts.append(clipped_pg_loss(cfg, **micro, **{key: total})[0].item())
        assert sum(parts) == pytest.approx(expected)


def test_shape_errors_name_the_tensor():
    with pytest.raises(ValueError, match=r"prev_logprobs must have shape \(2, 3\)"):
        clipped_pg_loss(NO_KL, **batch(prev_logprobs=torch.zeros(2, 4)))
    with pytest.raises(ValueError, match="advantages must have shape"):
        clipped_pg_loss(NO_KL, **batch(advantages=torch.zeros(3)))
    with pytest.raises(ValueError, match="sample_mask must have shape"):
        clipped_pg_loss(NO_KL, **batch(sample_mask=torch.ones(2, 3)))
    with pytest.raises(ValueError, match="logits must have shape"):
        clipped_pg_loss(NO_KL, **batch(), logits=torch.zeros(2, 4, 5))


def test_config_mirrors_nemo_rl_defaults_and_rejects_bad_values():
    cfg = ClippedPGLossConfig()
    assert (cfg.ratio_clip_min, cfg.ratio_clip_max, cfg.ratio_clip_c) == (0.2, 0.2, None)
    assert (cfg.reference_policy_kl_penalty, cfg.reference_policy_kl_type) == (0.01, "k3")
    assert (cfg.kl_input_clamp_value, cfg.kl_output_clamp_value) == (20.0, 10.0)
    assert cfg.token_level_loss and not cfg.use_importance_sampling_correction
    with pytest.raises(ValidationError, match="ratio_clip_c"):
        ClippedPGLossConfig(ratio_clip_c=0.5)
    with pytest.raises(ValidationError, match="reference_policy_kl_type"):
        ClippedPGLossConfig(reference_policy_kl_type="k4")
    with pytest.raises(ValidationError, match="ratio_clip_mn"):
        ClippedPGLossConfig(ratio_clip_mn=0.1)
