"""GRPO advantages against hand-computed values on tiny reward vectors."""

import math

import pytest
import torch
from pydantic import ValidationError

from nemo_tau2.algorithms.advantages import AdvantageConfig, calculate_baseline_and_std_per_prompt, compute_advantages

# group 0: 1, 0, 1, 0   group 1: .5, .5   group 2: a single episode   group 3: 1, 0, and an invalid episode
REWARDS = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 1.0, 1.0, 0.0, 1.0])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 2, 3, 3, 3])
VALID = torch.tensor([1, 1, 1, 1, 1, 1, 1, 1, 1, 0])
STD_0 = math.sqrt(1 / 3)  # unbiased std of [1, 0, 1, 0]: deviations .5, sum of squares 1, / (4 - 1)
STD_3 = math.sqrt(1 / 2)  # unbiased std of [1, 0]


def test_leave_one_out_baseline_is_mean_of_the_other_episodes():
    baseline, std = calculate_baseline_and_std_per_prompt(REWARDS, GROUPS, VALID, leave_one_out_baseline=True)
    expected_baseline = [1 / 3, 2 / 3, 1 / 3, 2 / 3, 0.5, 0.5, 1.0, 0.0, 1.0, 1.0]
    expected_std = [STD_0] * 4 + [0.0, 0.0, 0.0, STD_3, STD_3, 0.0]
    assert baseline.tolist() == pytest.approx(expected_baseline)
    assert std.tolist() == pytest.approx(expected_std)


def test_group_mean_baseline():
    baseline, _ = calculate_baseline_and_std_per_prompt(REWARDS, GROUPS, VALID, leave_one_out_baseline=False)
    assert baseline.tolist() == pytest.approx([0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 1.0, 0.5, 0.5, 1.0])


def test_normalised_leave_one_out_advantages():
    advantages = compute_advantages(REWARDS, GROUPS, AdvantageConfig(), VALID)
    a0 = (2 / 3) / (STD_0 + 1e-6)  # 1.1547
    a3 = 1.0 / (STD_3 + 1e-6)  # 1.4142
    assert advantages.tolist() == pytest.approx([a0, -a0, a0, -a0, 0.0, 0.0, 0.0, a3, -a3, 0.0], abs=1e-6)


def test_unnormalised_group_mean_advantages():
    cfg = AdvantageConfig(use_leave_one_out_baseline=False, normalize_rewards=False)
    advantages = compute_advantages(REWARDS, GROUPS, cfg, VALID)
    assert advantages.tolist() == pytest.approx([0.5, -0.5, 0.5, -0.5, 0.0, 0.0, 0.0, 0.5, -0.5, 0.0])


def test_single_episode_groups_and_invalid_episodes_get_zero_advantage():
    advantages = compute_advantages(torch.tensor([3.0, 1.0, 0.0]), torch.tensor([7, 8, 8]), AdvantageConfig(),
                                    torch.tensor([1, 1, 0]))  # fmt: skip
    assert advantages.tolist() == [0.0, 0.0, 0.0]


def test_advantage_clipping():
    cfg = AdvantageConfig(advantage_clip_low=-1.0, advantage_clip_high=0.5)
    advantages = compute_advantages(REWARDS, GROUPS, cfg, VALID)
    assert advantages.tolist() == pytest.approx([0.5, -1.0, 0.5, -1.0, 0.0, 0.0, 0.0, 0.5, -1.0, 0.0])


def test_interleaved_group_ids_and_all_valid_default():
    # groups need not be contiguous: [1, 0] in group 5 and [0, 0] in group 2
    advantages = compute_advantages(
        torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([5, 2, 5, 2]), AdvantageConfig(normalize_rewards=False)
    )
    assert advantages.tolist() == pytest.approx([1.0, 0.0, -1.0, 0.0])


def test_shape_and_config_errors():
    with pytest.raises(ValueError, match="group_ids must have the shape of rewards"):
        compute_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.long), AdvantageConfig())
    with pytest.raises(ValueError, match=r"rewards must have shape \[B\]"):
        compute_advantages(torch.zeros(3, 1), torch.zeros(3, 1, dtype=torch.long), AdvantageConfig())
    with pytest.raises(ValidationError, match="advantage_clip_low"):
        AdvantageConfig(advantage_clip_low=1.0, advantage_clip_high=-1.0)
    with pytest.raises(ValidationError, match="extra"):
        AdvantageConfig(leave_one_out=True)
