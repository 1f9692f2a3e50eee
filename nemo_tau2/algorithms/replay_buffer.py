"""Async GRPO's replay buffer: finished prompt groups tagged with the weights that generated them.

A group generated with the weights of trainer step ``s`` (``weight_version == s``: the weights after ``s``
updates, which the synchronous loop would use to generate step ``s``'s batch) may train at a step
``t <= s + max_trajectory_age_steps`` (NeMo-RL's ``grpo.async_grpo.max_trajectory_age_steps``). The trainer takes
groups oldest first; a group past the bound is dropped and counted, never trained. The collector
(:mod:`nemo_tau2.algorithms.async_collector`) admits only as many groups as the steps within the bound can take,
so with ``in_flight_weight_updates: false`` nothing reaches the drop; with in-flight updates a group that runs
on through updates can finish too old; the drop is the rule that holds whatever the producer does.
"""

from dataclasses import dataclass, field

from nemo_tau2.algorithms.sampling import EpisodeGroup
from nemo_tau2.experience.rollouts import RolloutResult


@dataclass(frozen=True)
class PromptDraw:
    """One training prompt drawn from the curriculum: ``draw_id`` counts draws from step 0 on (it is the group id
    of the episodes generated for it, saved with checkpoints), ``row_index`` is its row in the training rows."""

    draw_id: int
    row_index: int


@dataclass
class VersionedGroup:
    """A finished, scored and filtered prompt group: ``weight_version`` is the oldest weights any of its turns was
    sampled with (its age counts from there), ``turn_weight_versions`` every version its turns report (several when
    in-flight updates reached its episodes)."""

    draw: PromptDraw
    weight_version: int
    group: EpisodeGroup
    results: list[RolloutResult] = field(default_factory=list)
    started_s: float = 0.0  # time.monotonic() when its first episode started
    finished_s: float = 0.0  # ... and when its last episode finished
    turn_weight_versions: list[int] = field(default_factory=list)

    def age_at(self, step: int) -> int:
        return step - self.weight_version


class ReplayBuffer:
    """Finished groups waiting for the trainer; not thread-safe (the collector guards it with its lock)."""

    def __init__(self) -> None:
        self._groups: list[VersionedGroup] = []

    def __len__(self) -> int:
        return len(self._groups)

    def push(self, group: VersionedGroup) -> None:
        self._groups.append(group)

    def drop_stale(self, step: int, max_age: int) -> list[VersionedGroup]:
        """Remove and return the groups too old to train at ``step``."""
        stale = [group for group in self._groups if group.age_at(step) > max_age]
        self._groups = [group for group in self._groups if group.age_at(step) <= max_age]
        return stale

    def take(self, num_groups: int, step: int, max_age: int) -> tuple[list[VersionedGroup], list[VersionedGroup]]:
        """``num_groups`` groups for ``step``, oldest weights first (then in draw order), and the stale ones dropped
        on the way; fewer than ``num_groups`` available: nothing is taken (the caller waits)."""
        if step < max((group.weight_version for group in self._groups), default=step):
            raise ValueError(f"step {step} is before the weights of a buffered group: versions come from steps")
        stale = self.drop_stale(step, max_age)
        if len(self._groups) < num_groups:
            return [], stale
        self._groups.sort(key=lambda group: (group.weight_version, group.draw.draw_id))
        taken, self._groups = self._groups[:num_groups], self._groups[num_groups:]
        return taken, stale

    def draws(self) -> list[PromptDraw]:
        return [group.draw for group in self._groups]
