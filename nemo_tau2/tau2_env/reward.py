"""tau2's reward for a finished episode, computed from the live episode instead of a replay.

The rule is tau2's ``evaluate_simulation(..., EvaluationType.ALL)`` (``tau2/evaluator/evaluator.py``):

- a termination other than ``user_stop`` / ``agent_stop`` scores 0;
- a task without evaluation criteria scores 1;
- otherwise the reward is the product, over the task's ``reward_basis``, of DB (agent and user DB equal to the
  gold DB), ENV_ASSERTION (every assertion holds), ACTION (every gold action matched by some call) and
  COMMUNICATE (every ``communicate_info`` string said by the agent). NL_ASSERTION needs an LLM judge: tau2
  raises when it is in the basis without one, and so do we (no shipped task has it).

Where tau2 replays the trajectory in a fresh environment and hashes two multi-megabyte DBs, we compare the live
episode DB with a cached gold DB entry by entry (:mod:`session_db`); ACTION and COMMUNICATE use tau2's own
evaluator classes. Beside the reward we report partial-credit components (computed for every termination, for
reward shaping) and a binary ``success`` (tau2's ``|reward - 1| <= 1e-6``).
"""

import contextlib
import functools
import logging
from dataclasses import dataclass
from typing import Any

from tau2.data_model.message import AssistantMessage, Message
from tau2.data_model.simulation import DBCheck, EnvAssertionCheck, RewardInfo, TerminationReason
from tau2.data_model.tasks import RewardType, Task
from tau2.environment.environment import Environment
from tau2.environment.toolkit import ToolType
from tau2.evaluator.evaluator_action import ActionEvaluator
from tau2.evaluator.evaluator_communicate import CommunicateEvaluator

from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.episode import Episode, history_messages
from nemo_tau2.tau2_env.session_db import SnapshotJsonCache, databases_equal

logger = logging.getLogger(__name__)

NORMAL_TERMINATIONS = frozenset({TerminationReason.USER_STOP.value, TerminationReason.AGENT_STOP.value})
TERMINATION_REASONS = tuple(reason.value for reason in TerminationReason)
SUCCESS_TOLERANCE = 1e-6  # tau2.metrics.agent_metrics.is_successful

_snapshot_json = SnapshotJsonCache()


class NLAssertionsNotEvaluatedError(ValueError):
    """The task's reward basis includes NL assertions, which need an LLM judge (off in nemo-tau2)."""


@dataclass
class EpisodeReward:
    """tau2's reward for an episode plus what partial credit and diagnostics need."""

    reward: float
    success: bool
    reward_info: RewardInfo
    db_match: bool | None
    action_match_fraction: float | None
    write_action_match_fraction: float | None
    env_assertion_fraction: float | None
    communicate_fraction: float | None

    def components(self) -> dict[str, Any]:
        return {
            "db_match": self.db_match,
            "action_match_fraction": self.action_match_fraction,
            "write_action_match_fraction": self.write_action_match_fraction,
            "env_assertion_fraction": self.env_assertion_fraction,
            "communicate_fraction": self.communicate_fraction,
        }


@functools.lru_cache(maxsize=4096)
def gold_environment(domain: str, task_id: str) -> Environment:
    """tau2's gold environment for a task: initial state, then the gold actions (errors ignored, no sync)."""
    task = domains.get_task(domain, task_id)
    env = domains.new_environment(domain)
    state = task.initial_state
    env.set_state(
        initialization_data=state.initialization_data if state else None,
        initialization_actions=state.initialization_actions if state else None,
        message_history=history_messages(task),
    )
    for action in (task.evaluation_criteria.actions or []) if task.evaluation_criteria else []:
        # tau2's evaluator ignores gold actions that fail, and so must we.
        with contextlib.suppress(Exception):
            env.make_tool_call(tool_name=action.name, requestor=action.requestor, **action.arguments)
    return env


def _fraction(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def _is_write_tool(env: Environment, name: str, requestor: str) -> bool:
    toolkit = env.user_tools if requestor == "user" else env.tools
    return toolkit is not None and toolkit.has_tool(name) and toolkit.tool_type(name) == ToolType.WRITE


def _db_check(episode: Episode) -> DBCheck:
    gold = gold_environment(episode.domain, episode.task.id)
    match = databases_equal(episode.env.tools.db, gold.tools.db, _snapshot_json) and databases_equal(
        episode.env.user_tools.db if episode.env.user_tools else None,
        gold.user_tools.db if gold.user_tools else None,
        _snapshot_json,
    )
    return DBCheck(db_match=match, db_reward=1.0 if match else 0.0)


def _env_assertion_checks(episode: Episode, task: Task) -> list[EnvAssertionCheck]:
    """Each assertion run on the episode's environment; one whose check raises is not met.

    An assertion raises when the agent never created what it inspects (mock's ``assert_task_status`` on a task that
    does not exist raises "Task task_2 not found"). tau2's ``run_task`` lets that exception end the whole run, or
    with ``--skip-failed-samples`` scores the episode 0; we score the assertion unmet, so the episode gets the same
    0 and the run goes on.
    """
    checks = []
    for assertion in task.evaluation_criteria.env_assertions or []:
        try:
            met = episode.env.run_env_assertion(assertion, raise_assertion_error=False)
        except Exception as e:  # noqa: BLE001  (domain code raises plain exceptions on missing objects)
            logger.info("env assertion %s raised %s: %s; scored as not met", assertion.func_name, type(e).__name__, e)
            met = False
        checks.append(EnvAssertionCheck(env_assertion=assertion, met=met, reward=1.0 if met else 0.0))
    return checks


def episode_trajectory(episode: Episode, assistant_texts: list[str]) -> list[Message]:
    """A tau2 trajectory with what the evaluators read: history, agent texts, then every executed call."""
    texts = [AssistantMessage(role="assistant", content=text) for text in assistant_texts]
    return history_messages(episode.task) + texts + episode.tool_call_messages()


def evaluate_episode(episode: Episode, assistant_texts: list[str], termination_reason: str) -> EpisodeReward:
    """Score a finished episode exactly as tau2 scores the same trajectory (see the module docstring).

    Runs the task's env assertions on the live environment, so call it once, at the end of the episode.
    """
    if termination_reason not in TERMINATION_REASONS:
        raise ValueError(f"unknown termination_reason {termination_reason!r}; tau2's are: {TERMINATION_REASONS}")
    task = episode.task
    criteria = task.evaluation_criteria
    if criteria is None:
        info = RewardInfo(reward=1.0, info={"note": "No evaluation criteria"})
        reward = 1.0 if termination_reason in NORMAL_TERMINATIONS else 0.0
        return EpisodeReward(reward, reward == 1.0, info, None, None, None, None, None)
    basis = set(criteria.reward_basis)
    if RewardType.NL_ASSERTION in basis:
        raise NLAssertionsNotEvaluatedError(
            f"task {task.id!r} has NL_ASSERTION in its reward basis, which needs an LLM judge (not enabled)"
        )
    trajectory = episode_trajectory(episode, assistant_texts)

    if criteria.actions is None and criteria.env_assertions is None:
        db_check, assertion_checks = DBCheck(db_match=True, db_reward=1.0), []
    else:
        db_check = _db_check(episode)  # before the assertions, which may sync (mutate) the environment
        assertion_checks = _env_assertion_checks(episode, task)
    action_info = ActionEvaluator.calculate_reward(task=task, full_trajectory=trajectory)
    communicate_info = CommunicateEvaluator.calculate_reward(task=task, full_trajectory=trajectory)

    breakdown: dict[RewardType, float] = {}
    if RewardType.DB in basis:
        breakdown[RewardType.DB] = db_check.db_reward
    if RewardType.ENV_ASSERTION in basis:
        breakdown[RewardType.ENV_ASSERTION] = float(all(check.met for check in assertion_checks))
    if RewardType.ACTION in basis:
        breakdown[RewardType.ACTION] = action_info.reward
    if RewardType.COMMUNICATE in basis:
        breakdown[RewardType.COMMUNICATE] = communicate_info.reward
    reward = 1.0
    for value in breakdown.values():
        reward *= value

    notes: dict[str, Any] = {}
    if termination_reason not in NORMAL_TERMINATIONS:
        notes["note"] = f"Simulation terminated prematurely. Termination reason: {termination_reason}"
        reward = 0.0
    action_checks = action_info.action_checks or []
    write_checks = [
        check.action_match
        for check in action_checks
        if _is_write_tool(episode.env, check.action.name, check.action.requestor)
    ]
    communicate_checks = communicate_info.communicate_checks or []
    info = RewardInfo(
        reward=reward,
        db_check=db_check,
        env_assertions=assertion_checks,
        action_checks=action_checks,
        communicate_checks=communicate_checks,
        reward_basis=criteria.reward_basis,
        reward_breakdown=breakdown,
        info=notes or None,
    )
    return EpisodeReward(
        reward=reward,
        success=abs(reward - 1.0) <= SUCCESS_TOLERANCE,
        reward_info=info,
        db_match=db_check.db_match,
        action_match_fraction=_fraction([check.action_match for check in action_checks]),
        write_action_match_fraction=_fraction(write_checks),
        env_assertion_fraction=_fraction([check.met for check in assertion_checks]),
        communicate_fraction=_fraction([check.met for check in communicate_checks]),
    )
