"""Which generated episodes reach the loss.

Per generation batch, in order:

1. Episodes with ``status == "infrastructure_error"`` are dropped and counted: a dead server is not a 0 reward.
2. Truncated (over-long) episodes are either kept in their group's baseline but removed from the loss
   (``overlong_filtering``: ``loss_multiplier = 0``, NeMo-RL semantics) or have ``overlong_penalty`` subtracted
   from their reward.
3. Episodes are grouped by prompt; with ``use_dynamic_sampling`` (DAPO, https://arxiv.org/abs/2503.14476) only
   groups whose rewards differ are kept, since a group of equal rewards has zero advantage everywhere. Kept
   groups accumulate over generation batches until ``target_num_groups`` is reached; if
   ``dynamic_sampling_max_gen_batches`` batches do not get there, that is an error (as in NeMo-RL) rather than a
   silently smaller batch.
"""

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_tau2.algorithms.reward_shaping import RewardShapingConfig, shape_reward
from nemo_tau2.evals.metrics import INFRASTRUCTURE_ERROR, EpisodeStatus

if TYPE_CHECKING:  # the rollouts module is not needed to read a config
    from nemo_tau2.experience.rollouts import RolloutResult

logger = logging.getLogger(__name__)


@dataclass
class ScoredEpisode:
    """One generated episode with its training reward; ``data`` (message log, token ids...) rides along."""

    group_id: int | str
    reward: float
    status: EpisodeStatus = EpisodeStatus.OK
    truncated: bool = False
    loss_multiplier: float = 1.0
    data: Any = None


@dataclass
class EpisodeGroup:
    """The episodes of one prompt (task row) from one generation batch."""

    group_id: int | str
    episodes: list[ScoredEpisode] = field(default_factory=list)

    @property
    def rewards(self) -> list[float]:
        return [episode.reward for episode in self.episodes]

    def has_reward_variance(self) -> bool:
        """Whether the rewards differ (a group of one episode has none)."""
        return len(self.episodes) > 1 and max(self.rewards) != min(self.rewards)


class SamplingConfig(BaseModel):
    """Episode filtering before the loss (NeMo-RL ``grpo.*`` keys, plus ``overlong_penalty``)."""

    model_config = ConfigDict(extra="forbid")

    use_dynamic_sampling: bool = Field(default=False, description="Keep only groups with differing rewards.")
    dynamic_sampling_max_gen_batches: int = Field(
        default=10, ge=1, description="Generation batches allowed to fill one training batch."
    )
    overlong_filtering: bool = Field(default=False, description="Truncated episodes get loss_multiplier 0.")
    overlong_penalty: float | None = Field(
        default=None, ge=0.0, description="Subtracted from the reward of truncated episodes; None = off."
    )

    @model_validator(mode="after")
    def _one_overlong_policy(self) -> "SamplingConfig":
        if self.overlong_filtering and self.overlong_penalty is not None:
            raise ValueError("choose one of overlong_filtering and overlong_penalty, not both")
        return self


class DynamicSamplingExhaustedError(RuntimeError):
    """Dynamic sampling ran out of generation batches before it found enough groups with reward variance."""


def drop_infrastructure_errors(episodes: Iterable[ScoredEpisode]) -> tuple[list[ScoredEpisode], int]:
    """The episodes that did not die of an infrastructure error, and how many did."""
    episodes = list(episodes)
    kept = [episode for episode in episodes if episode.status != INFRASTRUCTURE_ERROR]
    return kept, len(episodes) - len(kept)


def apply_overlong_policy(episodes: Iterable[ScoredEpisode], cfg: SamplingConfig) -> list[ScoredEpisode]:
    """Copies of the episodes with the configured treatment of truncated ones (the inputs are not changed)."""
    out = []
    for episode in episodes:
        if episode.truncated and cfg.overlong_filtering:
            episode = dataclasses.replace(episode, loss_multiplier=0.0)
        elif episode.truncated and cfg.overlong_penalty is not None:
            episode = dataclasses.replace(episode, reward=episode.reward - cfg.overlong_penalty)
        out.append(episode)
    return out


def group_episodes(episodes: Iterable[ScoredEpisode]) -> list[EpisodeGroup]:
    """Episodes grouped by ``group_id``, groups in order of first appearance."""
    groups: dict[int | str, EpisodeGroup] = {}
    for episode in episodes:
        groups.setdefault(episode.group_id, EpisodeGroup(episode.group_id)).episodes.append(episode)
    return list(groups.values())


def flatten_groups(groups: Sequence[EpisodeGroup]) -> tuple[list[ScoredEpisode], list[int]]:
    """All episodes and, for each, the position of its group: distinct per group even if ``group_id``s repeat
    across generation batches (the ``group_ids`` that ``compute_advantages`` expects)."""
    episodes = [episode for group in groups for episode in group.episodes]
    indices = [i for i, group in enumerate(groups) for _ in group.episodes]
    return episodes, indices


@dataclass
class FilterCounts:
    """What :func:`filter_generation_batch` removed or changed."""

    infra_errors: int = 0
    truncated: int = 0
    zero_variance_groups: int = 0


def filter_generation_batch(
    episodes: Iterable[ScoredEpisode], cfg: SamplingConfig
) -> tuple[list[EpisodeGroup], FilterCounts]:
    """Steps 1-3 of the module docstring on one generation batch (the sync loop's, or one async group)."""
    kept, num_infra_errors = drop_infrastructure_errors(episodes)  # the step's log line names their causes
    counts = FilterCounts(num_infra_errors, sum(episode.truncated for episode in kept))
    groups = group_episodes(apply_overlong_policy(kept, cfg))
    if cfg.use_dynamic_sampling:
        varied = [group for group in groups if group.has_reward_variance()]
        counts.zero_variance_groups = len(groups) - len(varied)
        groups = varied
    return groups, counts


def score_rollouts(
    results: list["RolloutResult"], group_ids: list[int | str], shaping: RewardShapingConfig
) -> list[ScoredEpisode]:
    """Each episode's training reward (tau2 success plus optional shaping); infrastructure errors score nothing."""
    scored = []
    for result, group_id in zip(results, group_ids, strict=True):
        # an infrastructure error's reward is never used: filtering drops it before anything reads it
        reward = shape_reward(result.success, result.reward_components, result.domain, shaping) if result.ok else 0.0
        truncated = result.truncated_by is not None
        scored.append(ScoredEpisode(group_id, reward, status=result.status, truncated=truncated, data=result))
    return scored


class DynamicSampler:
    """Collects groups over generation batches until a training batch is ready.

    Usage::

        sampler = DynamicSampler(cfg, target_num_groups=num_prompts_per_step)
        while not sampler.is_full:
            sampler.add_generation_batch(generate_and_score(...))
        groups, metrics = sampler.take()
    """

    def __init__(self, cfg: SamplingConfig, target_num_groups: int) -> None:
        if target_num_groups < 1:
            raise ValueError(f"target_num_groups must be >= 1, got {target_num_groups}")
        self.cfg = cfg
        self.target_num_groups = target_num_groups
        self._groups: list[EpisodeGroup] = []
        self._num_gen_batches = 0
        self._num_infra_errors = 0
        self._num_truncated = 0
        self._num_zero_variance_groups = 0

    @property
    def is_full(self) -> bool:
        """Whether ``take()`` may be called: one batch without dynamic sampling, else enough groups."""
        if not self.cfg.use_dynamic_sampling:
            return self._num_gen_batches >= 1
        return len(self._groups) >= self.target_num_groups

    def add_generation_batch(self, episodes: Iterable[ScoredEpisode]) -> None:
        """Filter one generation batch and keep its usable groups.

        Raises:
            DynamicSamplingExhaustedError: This was batch ``dynamic_sampling_max_gen_batches`` and the
                training batch is still short of groups with reward variance.
        """
        if self.is_full:
            raise RuntimeError("the training batch is already full; call take() first")
        self._num_gen_batches += 1
        groups, counts = filter_generation_batch(episodes, self.cfg)
        self._num_infra_errors += counts.infra_errors
        self._num_truncated += counts.truncated
        self._num_zero_variance_groups += counts.zero_variance_groups
        self._groups.extend(groups)
        if not self.is_full and self._num_gen_batches >= self.cfg.dynamic_sampling_max_gen_batches:
            raise DynamicSamplingExhaustedError(
                f"dynamic sampling found {len(self._groups)} of {self.target_num_groups} groups with reward "
                f"variance in {self._num_gen_batches} generation batches (dynamic_sampling_max_gen_batches="
                f"{self.cfg.dynamic_sampling_max_gen_batches}; {self._num_zero_variance_groups} groups had equal "
                "rewards). Raise num_generations_per_prompt or dynamic_sampling_max_gen_batches, enable reward "
                "shaping or the curriculum, or start from a stronger (SFT) policy."
            )

    def take(self) -> tuple[list[EpisodeGroup], dict[str, float]]:
        """The training batch's groups (extras beyond the target are discarded) and sampling metrics."""
        if not self.is_full:
            raise RuntimeError("the training batch is not full yet; add generation batches first")
        groups = self._groups[: self.target_num_groups] if self.cfg.use_dynamic_sampling else self._groups
        metrics = {
            "train/num_infra_errors": self._num_infra_errors,
            "train/num_truncated": self._num_truncated,
            "train/num_groups": len(groups),
            "train/num_episodes": sum(len(group.episodes) for group in groups),
            "train/dynamic_sampling/num_gen_batches": self._num_gen_batches,
            "train/dynamic_sampling/num_zero_variance_groups": self._num_zero_variance_groups,
            "train/dynamic_sampling/num_discarded_groups": len(self._groups) - len(groups),
        }
        return groups, metrics
