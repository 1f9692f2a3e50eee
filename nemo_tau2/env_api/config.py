"""What a ``Tau2Env`` plays: a domain's tasks, the simulated user, and the agent server's episode settings.

The episode limits (``max_steps``, ``max_errors``, ``max_turns``, retries) are the one schema the agent server's
config also is (:class:`~nemo_tau2.gym.episode_config.EpisodeLimits`), defaults and bounds included, so an
environment episode and a ``/run`` episode stop at the same places. ``user`` is the eval/GRPO configs' ``user`` block
(:class:`~nemo_tau2.evals.config.UserSimulatorConfig`: ``generation``, ``seed``, ``strategy``, ``max_checks``), or
just its ``generation`` block.
"""

from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from nemo_tau2.generation.config import GenerationConfig
from nemo_tau2.gym.episode_config import EpisodeLimits, EpisodeSettings, UserSimulatorConfig
from nemo_tau2.tau2_env import domain_problem, domains
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig


class Tau2EnvConfig(EpisodeLimits):
    model_config = ConfigDict(extra="forbid")

    domain: str
    split: str | None = Field(default=None, description="A tau2 split of the domain (train, test, base, ...).")
    task_ids: list[str] | None = Field(default=None, description="These tasks instead of a split.")
    user: UserSimulatorConfig
    seed: int | None = Field(default=None, description="Seeds the choice of task when reset() is given none.")
    respond_user: bool = Field(
        default=False, description="The policy speaks to the user through a respond_user(text) tool call."
    )
    tau2: Tau2ReleaseConfig = Field(default_factory=Tau2ReleaseConfig, description="Which tau2 release plays.")

    @field_validator("user", mode="before")
    @classmethod
    def _generation_alone(cls, value: Any) -> Any:
        if isinstance(value, GenerationConfig):
            return {"generation": value}
        if isinstance(value, dict) and "generation" not in value and "backend" in value:
            return {"generation": value}
        return value

    @field_validator("task_ids", mode="before")
    @classmethod
    def _ids_as_text(cls, value: Any) -> Any:
        return [str(task_id) for task_id in value] if isinstance(value, list | tuple) else value

    @model_validator(mode="after")
    def _tasks_exist(self) -> "Tau2EnvConfig":
        if "policy_retry" in self.model_fields_set:
            raise ValueError("policy_retry does not apply to Tau2Env: the caller plays the policy")
        if "pivot_text_reward" in self.model_fields_set:
            raise ValueError("pivot_text_reward does not apply to Tau2Env: it plays tasks, not pivot rows")
        if (problem := domain_problem(self.domain, self.tau2.version)) is not None:
            raise ValueError(problem)  # v1.0.1's own domains (banking_knowledge) are its worker's to serve
        if (self.split is None) == (self.task_ids is None):
            raise ValueError("give exactly one of split (e.g. split='test') or task_ids")
        if self.task_ids is not None and not self.task_ids:
            raise ValueError("task_ids is empty")
        if self.tau2.version != "v0.2.1":
            return self  # its tasks are its worker's to check (ReleaseTasks)
        if self.task_ids is not None:
            with_history = [task.id for task in self._all_tasks() if _has_history(task)]
            if with_history:
                raise ValueError(
                    f"{self.domain} task(s) {with_history[:5]} start from a pre-written message history, which "
                    "Tau2Env does not support (only tau2's mock domain has such tasks)"
                )
        elif not self.tasks():
            raise ValueError(f"{self.domain} split {self.split!r} has no task Tau2Env can play")
        return self

    def tasks(self) -> list:
        """tau2 v0.2.1's tasks to play (a split's tasks that start from a message history are left out, as in rows)."""
        return [task for task in self._all_tasks() if not _has_history(task)]

    def _all_tasks(self) -> list:
        if self.split is not None:
            return domains.get_tasks(self.domain, self.split)
        return [domains.get_task(self.domain, task_id) for task_id in self.task_ids]

    def episode_settings(self) -> EpisodeSettings:
        return self.user.episode_settings(self)


def _has_history(task) -> bool:
    return bool(task.initial_state and task.initial_state.message_history)
