"""GRPO advantages: each episode's reward against a baseline from the other episodes of its prompt group.

For the valid episodes ``i`` of a group ``g`` with ``n_g`` valid episodes:

    baseline_i = mean_{j in g, j != i} r_j      (leave-one-out, RLOO: https://arxiv.org/abs/2402.14740)
               = mean_{j in g} r_j              (plain GRPO group mean: https://arxiv.org/abs/2402.03300)
    A_i        = r_i - baseline_i
    A_i       /= std_g + 1e-6   if normalize_rewards and std_g > 0,   std_g = unbiased std of the group's rewards

then optionally ``A_i = clamp(A_i, advantage_clip_low, advantage_clip_high)``. A group with at most one valid
episode carries no comparison, so its advantages are 0; invalid episodes get 0 too.

std_g is the spread of the whole group (NeMo-RL's ``calculate_baseline_and_std_per_prompt`` uses the std of the
*other* episodes under leave-one-out, which is undefined for groups of two); the baseline is the same.
"""

import torch

from nemo_tau2.algorithms.loss_config import AdvantageConfig

STD_EPSILON = 1e-6


def _check_shapes(rewards: torch.Tensor, group_ids: torch.Tensor, valid_mask: torch.Tensor | None) -> None:
    if rewards.ndim != 1:
        raise ValueError(f"rewards must have shape [B], got {tuple(rewards.shape)}")
    for name, tensor in (("group_ids", group_ids), ("valid_mask", valid_mask)):
        if tensor is not None and tensor.shape != rewards.shape:
            raise ValueError(
                f"{name} must have the shape of rewards {tuple(rewards.shape)}, got {tuple(tensor.shape)}"
            )


def calculate_baseline_and_std_per_prompt(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    valid_mask: torch.Tensor | None = None,
    *,
    leave_one_out_baseline: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Baseline and group std for every episode (see the module docstring for the formulas).

    Args:
        rewards: ``[B]`` training rewards.
        group_ids: ``[B]`` integer prompt-group id of each episode (episodes of one task row share an id).
        valid_mask: ``[B]`` 1 for episodes that take part, 0 to ignore (None = all valid).
        leave_one_out_baseline: Leave the episode itself out of its baseline.

    Returns:
        ``(baseline [B], std [B])``. For invalid episodes and groups with at most one valid episode,
        ``baseline = reward`` and ``std = 0``, so their advantage is 0.
    """
    _check_shapes(rewards, group_ids, valid_mask)
    rewards = rewards.float()
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid_mask is None else valid_mask.bool()
    baseline = rewards.clone()
    std = torch.zeros_like(rewards)
    for group in torch.unique(group_ids):
        members = (group_ids == group) & valid
        group_rewards = rewards[members]
        n = group_rewards.numel()
        if n <= 1:
            continue
        if leave_one_out_baseline:
            baseline[members] = (group_rewards.sum() - group_rewards) / (n - 1)
        else:
            baseline[members] = group_rewards.mean()
        std[members] = group_rewards.std(correction=1)
    return baseline, std


def compute_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    cfg: AdvantageConfig,
    valid_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-episode advantages ``[B]``: reward minus group baseline, optionally std-normalised and clipped.

    The same scalar applies to every policy-generated token of the episode (the loss broadcasts it).
    """
    baseline, std = calculate_baseline_and_std_per_prompt(
        rewards, group_ids, valid_mask, leave_one_out_baseline=cfg.use_leave_one_out_baseline
    )
    advantages = rewards.float() - baseline
    if cfg.normalize_rewards:
        advantages = torch.where(std > 0, advantages / (std + STD_EPSILON), advantages)
    if cfg.advantage_clip_low is not None or cfg.advantage_clip_high is not None:
        advantages = advantages.clamp(min=cfg.advantage_clip_low, max=cfg.advantage_clip_high)
    return advantages
