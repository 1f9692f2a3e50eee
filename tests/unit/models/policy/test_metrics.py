"""Micro-batch and step metrics combine into whole-batch metrics (hand-computed)."""

import math

import pytest

from nemo_tau2.models.policy.metrics import combine_microbatch_metrics, combine_step_metrics


def test_microbatch_metrics_add_losses_and_counts_and_token_weight_the_means():
    parts = [
        {
            "loss": 0.25,
            "num_valid_tokens": 3.0,
            "clip_fraction": 1 / 3,
            "probs_ratio_min": 0.9,
            "probs_ratio_max": 1.1,
        },
        {"loss": -0.5, "num_valid_tokens": 1.0, "clip_fraction": 1.0, "probs_ratio_min": 0.7, "probs_ratio_max": 1.0},
        {
            "loss": 0.0,
            "num_valid_tokens": 0.0,
            "clip_fraction": 0.0,
            "probs_ratio_min": math.nan,
            "probs_ratio_max": math.nan,
        },
    ]
    combined = combine_microbatch_metrics(parts)
    assert combined["loss"] == -0.25 and combined["num_valid_tokens"] == 4.0
    assert combined["clip_fraction"] == pytest.approx(0.5)  # (1 + 1) clipped tokens of 4; the empty part weighs 0
    assert combined["probs_ratio_min"] == 0.7 and combined["probs_ratio_max"] == 1.1


def test_a_metric_no_microbatch_could_measure_is_nan():
    combined = combine_microbatch_metrics(
        [{"num_valid_tokens": 0.0, "entropy": math.nan, "probs_ratio_min": math.nan}]
    )
    assert math.isnan(combined["entropy"]) and math.isnan(combined["probs_ratio_min"])


def test_step_metrics_add_counts_keep_the_last_lr_and_average_the_rest():
    steps = [
        {"loss": 1.0, "grad_norm": 2.0, "lr": 1e-3, "global_valid_toks": 10.0, "num_optimizer_steps": 1.0},
        {"loss": 3.0, "grad_norm": 4.0, "lr": 2e-3, "global_valid_toks": 5.0, "num_optimizer_steps": 1.0},
    ]
    assert combine_step_metrics(steps) == {
        "loss": 2.0, "grad_norm": 3.0, "lr": 2e-3, "global_valid_toks": 15.0, "num_optimizer_steps": 2.0
    }  # fmt: skip
