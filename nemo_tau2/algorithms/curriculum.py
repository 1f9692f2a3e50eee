"""Task curriculum after the slime tau2 pipeline: sample less often the tasks nearly always or never solved.

Once a task has ``min_attempts`` recorded episodes, its sampling weight is

    high_weight   if its success rate > high_success_rate   (solved: little left to learn)
    low_weight    if its success rate < low_success_rate    (unsolved: its groups rarely carry a signal)
    1.0           otherwise, and before min_attempts

Slime's defaults: 5 attempts, rates 0.75 / 0.25, weights 0.1 / 0.5. Success counts are cumulative. The tracker
and the seeded sampling RNG serialise to JSON, so a resumed run samples exactly as the original would have.
"""

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_tau2.experience.row_keys import episode_task

if TYPE_CHECKING:  # the rollouts module is not needed to read a config
    from nemo_tau2.experience.rollouts import RolloutResult


class CurriculumConfig(BaseModel):
    """Per-task sampling weights from observed success rates; ``enabled: false`` samples tasks uniformly."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    min_attempts: int = Field(default=5, ge=1, description="Episodes of a task before its weight changes.")
    high_success_rate: float = Field(default=0.75, ge=0.0, le=1.0, description="Above this rate: high_weight.")
    low_success_rate: float = Field(default=0.25, ge=0.0, le=1.0, description="Below this rate: low_weight.")
    high_weight: float = Field(default=0.1, gt=0.0, description="Weight of nearly always solved tasks.")
    low_weight: float = Field(default=0.5, gt=0.0, description="Weight of nearly never solved tasks.")

    @model_validator(mode="after")
    def _rates_ordered(self) -> "CurriculumConfig":
        if self.low_success_rate > self.high_success_rate:
            raise ValueError(
                f"low_success_rate ({self.low_success_rate}) must not exceed high_success_rate "
                f"({self.high_success_rate})"
            )
        return self


class TaskCurriculum:
    """Success tracker over a fixed list of task keys, with seeded weighted sampling of their indices."""

    def __init__(self, task_keys: Sequence[str], cfg: CurriculumConfig, seed: int) -> None:
        if len(set(task_keys)) != len(task_keys):
            raise ValueError("task_keys must be unique")
        if not task_keys:
            raise ValueError("task_keys must not be empty")
        self.task_keys = list(task_keys)
        self.cfg = cfg
        self._index = {key: i for i, key in enumerate(self.task_keys)}
        self._attempts = np.zeros(len(task_keys), dtype=np.int64)
        self._successes = np.zeros(len(task_keys), dtype=np.int64)
        self._rng = np.random.default_rng(seed)

    def _task_index(self, task_key: str) -> int:
        if task_key not in self._index:
            raise KeyError(f"unknown task {task_key!r} (the curriculum tracks {len(self.task_keys)} tasks)")
        return self._index[task_key]

    def record(self, task_key: str, successes: Iterable[bool]) -> None:
        """Add a task's finished episodes (tau2 success verdicts; leave infrastructure errors out)."""
        successes = list(successes)
        if not all(isinstance(s, bool) for s in successes):
            raise TypeError(f"successes of {task_key!r} must be bools, got {successes!r}")
        i = self._task_index(task_key)
        self._attempts[i] += len(successes)
        self._successes[i] += sum(successes)

    def success_rate(self, task_key: str) -> float | None:
        """Observed success rate of a task, or None before its first recorded episode."""
        i = self._task_index(task_key)
        return self._successes[i] / self._attempts[i] if self._attempts[i] else None

    def _solved_and_unsolved(self) -> tuple[np.ndarray, np.ndarray]:
        """Masks of tasks past ``min_attempts`` with a success rate above high / below low."""
        seen = self._attempts >= self.cfg.min_attempts
        rate = np.divide(self._successes, self._attempts, out=np.zeros(len(seen)), where=self._attempts > 0)
        return seen & (rate > self.cfg.high_success_rate), seen & (rate < self.cfg.low_success_rate)

    def weights(self) -> np.ndarray:
        """Sampling weight of every task, in ``task_keys`` order."""
        weights = np.ones(len(self.task_keys))
        if self.cfg.enabled:
            solved, unsolved = self._solved_and_unsolved()
            weights[solved] = self.cfg.high_weight
            weights[unsolved] = self.cfg.low_weight
        return weights

    def sample(self, num_tasks: int, *, replace: bool = False) -> list[int]:
        """Draw ``num_tasks`` task indices with probability proportional to their weights (seeded)."""
        if not replace and num_tasks > len(self.task_keys):
            raise ValueError(f"cannot draw {num_tasks} distinct tasks from {len(self.task_keys)}")
        weights = self.weights()
        indices = self._rng.choice(len(weights), size=num_tasks, replace=replace, p=weights / weights.sum())
        return [int(i) for i in indices]

    def metrics(self) -> dict[str, int]:
        """How many tasks the curriculum classes as solved / unsolved (``train/curriculum/...``)."""
        solved, unsolved = self._solved_and_unsolved()
        return {
            "train/curriculum/num_tasks_seen": int((self._attempts >= self.cfg.min_attempts).sum()),
            "train/curriculum/num_tasks_solved": int(solved.sum()),
            "train/curriculum/num_tasks_unsolved": int(unsolved.sum()),
        }

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: per-task counts and the RNG state."""
        return {
            "attempts": dict(zip(self.task_keys, self._attempts.tolist(), strict=True)),
            "successes": dict(zip(self.task_keys, self._successes.tolist(), strict=True)),
            "rng": self._rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()`` output; the task keys must be the same set as this curriculum's."""
        if set(state["attempts"]) != set(self.task_keys):
            unknown = sorted(set(state["attempts"]) ^ set(self.task_keys))[:5]
            raise ValueError(f"curriculum state is for a different task set (differences include {unknown})")
        self._attempts = np.array([state["attempts"][k] for k in self.task_keys], dtype=np.int64)
        self._successes = np.array([state["successes"][k] for k in self.task_keys], dtype=np.int64)
        self._rng.bit_generator.state = state["rng"]


def task_key(domain: str, task_id: str, pivot_id: str | None = None) -> str:
    """A training row's key: its domain and what it plays (a pivot row: the task and the pivot)."""
    return f"{domain}/{episode_task(task_id, pivot_id)}"


def record_successes(curriculum: TaskCurriculum, results: list["RolloutResult"]) -> None:
    """Feed the finished episodes' successes to the curriculum, per task (per pivot for pivot rows)."""
    successes_by_task: dict[str, list[bool]] = {}
    for result in results:
        if result.ok:
            key = task_key(result.domain, result.task_id, result.pivot_id)
            successes_by_task.setdefault(key, []).append(result.success)
    for key, successes in successes_by_task.items():
        curriculum.record(key, successes)
