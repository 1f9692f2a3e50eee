"""Reward parity with tau2 on every base task: gold, do-nothing and corrupted trajectories, replayed over HTTP.

Each trajectory is played against the real resources server; the test rebuilds the same trajectory as tau2
messages from the HTTP exchanges and asks tau2's own ``evaluate_simulation`` for the reference reward (tau2 also
replays every call and raises if a tool output differs from what the server returned). tau2's evaluation is what
these tests spend their time on, so it runs in a pool of processes, one per core, while the next episode plays.
"""

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import pytest
from tau2.environment.toolkit import ToolType

from nemo_tau2.tau2_env import domains
from tests.unit.gym.tau2_http import HttpEpisode, play_gold, tau2_reward

BASE_TASK_COUNTS = {"airline": 50, "retail": 114, "telecom": 114}
DO_NOTHING_MEANS = {"airline": 0.38, "retail": 0.06, "telecom": 0.0}  # tau2's own figures (reference/tau2.md §6)


@pytest.fixture(scope="module")
def tau2_pool():
    """Processes that run tau2's ``evaluate_simulation`` (forkserver: this process has server threads)."""
    context = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(max_workers=min(4, max(2, os.cpu_count() or 1)), mp_context=context) as pool:
        yield pool


def _reference(pool: ProcessPoolExecutor, episode: HttpEpisode, task):
    return pool.submit(tau2_reward, episode.domain, task, list(episode.messages))


def _tool_type(domain: str, name: str, requestor: str):
    env = domains.new_environment(domain)
    toolkit = env.tools if requestor == "assistant" else env.user_tools
    return toolkit.tool_type(name) if toolkit is not None and toolkit.has_tool(name) else None


def _corruption(domain: str, task):
    """One wrong argument in the first write action that has a scalar argument, or None if there is none."""
    for index, action in enumerate(task.evaluation_criteria.actions or []):
        if _tool_type(domain, action.name, action.requestor) != ToolType.WRITE:
            continue
        for key, value in action.arguments.items():
            if isinstance(value, bool):
                wrong = not value
            elif isinstance(value, int | float):
                wrong = value + 1
            elif isinstance(value, str):
                wrong = value + "_corrupted"
            else:
                continue
            return lambda i, a, args, index=index, key=key, wrong=wrong: args | {key: wrong} if i == index else args
    return None


@pytest.mark.slow  # every base task, tau2 scoring each (the fast loop keeps the single-episode checks below)
@pytest.mark.parametrize("domain", list(BASE_TASK_COUNTS))
def test_gold_actions_score_one_and_match_tau2_on_every_base_task(resources_server_url, tau2_pool, domain):
    tasks = domains.get_tasks(domain, "base")
    assert len(tasks) == BASE_TASK_COUNTS[domain]
    played = []
    for task in tasks:
        episode = HttpEpisode(resources_server_url, domain, task.id)
        episode.seed()
        play_gold(episode, task)
        played.append((task.id, episode.verify(), _reference(tau2_pool, episode, task)))
    mismatches = []
    for task_id, ours, reference in played:
        if not (ours["reward"] == reference.result() == 1.0 and ours["success"]):
            mismatches.append((task_id, ours["reward"], reference.result()))
    assert mismatches == []


@pytest.mark.slow  # every base task, tau2 scoring each (the fast loop keeps the single-episode checks below)
@pytest.mark.parametrize("domain", list(BASE_TASK_COUNTS))
def test_do_nothing_scores_what_tau2_scores(resources_server_url, tau2_pool, domain):
    played = []
    for task in domains.get_tasks(domain, "base"):
        episode = HttpEpisode(resources_server_url, domain, task.id)
        episode.seed()
        played.append((task.id, episode.verify(), _reference(tau2_pool, episode, task)))
    rewards = []
    for task_id, ours, reference in played:
        assert ours["reward"] == reference.result(), task_id
        rewards.append(ours["reward"])
    assert round(sum(rewards) / len(rewards), 2) == DO_NOTHING_MEANS[domain]


@pytest.mark.slow  # every base task, tau2 scoring each (the fast loop keeps the single-episode checks below)
@pytest.mark.parametrize("domain", list(BASE_TASK_COUNTS))
def test_one_wrong_write_argument_scores_what_tau2_scores(resources_server_url, tau2_pool, domain):
    played = []
    for task in domains.get_tasks(domain, "base"):
        corrupt = _corruption(domain, task)
        if corrupt is None:
            continue
        episode = HttpEpisode(resources_server_url, domain, task.id)
        episode.seed()
        play_gold(episode, task, corrupt=corrupt)
        played.append((task.id, episode.verify(), _reference(tau2_pool, episode, task)))
    corrupted = zeros = 0
    for task_id, ours, reference in played:
        assert ours["reward"] == reference.result(), task_id
        corrupted += 1
        zeros += ours["reward"] == 0.0
        if ours["db_match"] is False:
            assert ours["reward"] == 0.0 or "DB" not in ours["reward_info"]["reward_basis"]
    assert corrupted >= BASE_TASK_COUNTS[domain] // 3
    assert zeros >= corrupted // 2  # a wrong write argument must usually cost the reward


def test_premature_termination_scores_zero_like_tau2(resources_server_url):
    task = domains.get_tasks("airline", "base")[0]
    for reason in ("max_steps", "too_many_errors", "agent_error", "user_error"):
        episode = HttpEpisode(resources_server_url, "airline", task.id)
        episode.seed()
        play_gold(episode, task)
        ours = episode.verify(termination_reason=reason)
        assert ours["reward"] == episode.tau2_reward(task, termination_reason=reason) == 0.0
        assert ours["termination_reason"] == reason and ours["success"] is False


def test_an_env_assertion_that_raises_scores_zero_like_tau2_skip_failed_samples(resources_server_url):
    # mock's create_task_1_with_env_assertions asserts on task_2, which only the agent's create_task call makes:
    # without it the assertion's function raises "Task task_2 not found" (tau2 ends the run, or with
    # --skip-failed-samples scores the episode 0)
    task = domains.get_task("mock", "create_task_1_with_env_assertions")
    episode = HttpEpisode(resources_server_url, "mock", task.id)
    episode.seed()
    ours = episode.verify()
    assert ours["reward"] == 0.0 and ours["success"] is False
    assert ours["env_assertion_fraction"] == 0.0

    solved = HttpEpisode(resources_server_url, "mock", task.id)
    solved.seed()
    play_gold(solved, task)
    assert solved.verify()["reward"] == solved.tau2_reward(task) == 1.0
