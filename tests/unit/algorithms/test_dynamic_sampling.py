"""Infrastructure-error dropping, overlong handling and dynamic sampling on crafted groups."""

import pytest
import torch
from pydantic import ValidationError

from nemo_tau2.algorithms.advantages import AdvantageConfig, compute_advantages
from nemo_tau2.algorithms.sampling import (
    DynamicSampler,
    DynamicSamplingExhaustedError,
    SamplingConfig,
    ScoredEpisode,
    apply_overlong_policy,
    drop_infrastructure_errors,
    flatten_groups,
    group_episodes,
)

DYNAMIC = SamplingConfig(use_dynamic_sampling=True, dynamic_sampling_max_gen_batches=3)


def group(group_id, *rewards, infra_errors=0, truncated=()):
    episodes = [ScoredEpisode(group_id, r, truncated=i in truncated) for i, r in enumerate(rewards)]
    return episodes + [ScoredEpisode(group_id, 0.0, status="infrastructure_error")] * infra_errors


def test_infrastructure_errors_are_dropped_and_counted():
    kept, dropped = drop_infrastructure_errors(group("a", 1.0, 0.0, infra_errors=2))
    assert [e.reward for e in kept] == [1.0, 0.0] and dropped == 2


def test_overlong_filtering_masks_the_loss_but_keeps_the_reward():
    episodes = group("a", 1.0, 0.0, truncated=(1,))
    out = apply_overlong_policy(episodes, SamplingConfig(overlong_filtering=True))
    assert [(e.reward, e.loss_multiplier) for e in out] == [(1.0, 1.0), (0.0, 0.0)]
    assert episodes[1].loss_multiplier == 1.0  # inputs untouched


def test_overlong_penalty_lowers_the_reward():
    out = apply_overlong_policy(group("a", 1.0, 0.3, truncated=(1,)), SamplingConfig(overlong_penalty=0.5))
    assert [e.reward for e in out] == pytest.approx([1.0, -0.2])
    assert [e.loss_multiplier for e in out] == [1.0, 1.0]


def test_overlong_policies_are_exclusive():
    with pytest.raises(ValidationError, match="choose one of overlong_filtering and overlong_penalty"):
        SamplingConfig(overlong_filtering=True, overlong_penalty=0.1)


def test_dynamic_sampling_keeps_varied_groups_across_generation_batches():
    sampler = DynamicSampler(DYNAMIC, target_num_groups=3)
    sampler.add_generation_batch(
        group("A", 1, 0, 1, 0)  # kept
        + group("B", 0, 0, 0, 0)  # all fail: dropped
        + group("C", 1, 1)  # all succeed: dropped
        + group("D", 1, 0, infra_errors=1)  # infra error dropped, [1, 0] kept
        + group("G", 1, infra_errors=1)  # one valid episode left: no variance, dropped
    )
    assert not sampler.is_full
    sampler.add_generation_batch(group("E", 0.5, 1.0) + group("F", 0, 1))
    assert sampler.is_full
    groups, metrics = sampler.take()
    assert [g.group_id for g in groups] == ["A", "D", "E"]
    assert groups[1].rewards == [1, 0]
    assert metrics == {
        "train/num_infra_errors": 2,
        "train/num_truncated": 0,
        "train/num_groups": 3,
        "train/num_episodes": 8,
        "train/dynamic_sampling/num_gen_batches": 2,
        "train/dynamic_sampling/num_zero_variance_groups": 3,
        "train/dynamic_sampling/num_discarded_groups": 1,
    }


def test_dynamic_sampling_raises_after_max_gen_batches():
    sampler = DynamicSampler(DYNAMIC, target_num_groups=2)
    sampler.add_generation_batch(group("A", 0, 0) + group("B", 1, 0))
    sampler.add_generation_batch(group("C", 0, 0))
    with pytest.raises(DynamicSamplingExhaustedError, match=r"found 1 of 2 groups .* in 3 generation batches"):
        sampler.add_generation_batch(group("D", 1, 1))


def test_overlong_penalty_runs_before_the_variance_filter():
    cfg = SamplingConfig(use_dynamic_sampling=True, overlong_penalty=0.5)
    sampler = DynamicSampler(cfg, target_num_groups=1)
    sampler.add_generation_batch(group("A", 0, 0, truncated=(1,)))  # rewards become [0, -0.5]
    groups, metrics = sampler.take()
    assert groups[0].rewards == [0, -0.5] and metrics["train/num_truncated"] == 1


def test_without_dynamic_sampling_one_batch_is_the_training_batch():
    sampler = DynamicSampler(SamplingConfig(), target_num_groups=8)
    sampler.add_generation_batch(group("A", 0, 0) + group("B", 1, 0) + group("C", 1, infra_errors=3))
    assert sampler.is_full
    groups, metrics = sampler.take()
    assert [g.group_id for g in groups] == ["A", "B", "C"]
    assert metrics["train/num_infra_errors"] == 3
    assert metrics["train/dynamic_sampling/num_zero_variance_groups"] == 0


def test_sampler_misuse_is_an_error():
    sampler = DynamicSampler(SamplingConfig(), target_num_groups=1)
    with pytest.raises(RuntimeError, match="not full yet"):
        sampler.take()
    sampler.add_generation_batch(group("A", 1, 0))
    with pytest.raises(RuntimeError, match="already full"):
        sampler.add_generation_batch(group("B", 1, 0))
    with pytest.raises(ValueError, match="target_num_groups"):
        DynamicSampler(SamplingConfig(), target_num_groups=0)


def test_flattened_groups_feed_advantages_with_distinct_group_indices():
    # The same task sampled in two generation batches forms two groups, not one.
    groups = group_episodes(group("task-1", 1, 0)) + group_episodes(group("task-1", 1, 1))
    episodes, indices = flatten_groups(groups)
    assert indices == [0, 0, 1, 1]
    rewards = torch.tensor([e.reward for e in episodes], dtype=torch.float)
    advantages = compute_advantages(rewards, torch.tensor(indices), AdvantageConfig(normalize_rewards=False))
    assert advantages.tolist() == [1.0, -1.0, 0.0, 0.0]
