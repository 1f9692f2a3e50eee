"""tau2 v1.0.1's NL-assertion judge on its own endpoint: a judge fault is an infrastructure error with its cause,
retried safely (the episode stays scoreable, the retry gives the clean score), never a 0 and never a silent 1."""

import socket

import pytest

from nemo_tau2.tau2_release.client import Tau2JudgeError, Tau2RequestError
from nemo_tau2.tau2_release.trajectory import Trajectory
from tests.unit.tau2_release.episode_scripts import episode_scripts
from tests.unit.tau2_release.worker_episodes import JUDGE_ATTEMPTS


@pytest.fixture(scope="module")
def nl_task(worker):
    """A retail task whose reward basis includes NL assertions, with its oracle script."""
    for task in worker.request("tasks", domain="retail", split="base"):
        criteria = task["evaluation_criteria"]
        if "NL_ASSERTION" in criteria["reward_basis"] and criteria["nl_assertions"]:
            return task, episode_scripts(task, worker.request("greeting"))["oracle"]
    raise AssertionError("tau2 v1.0.1 retail has no NL-assertion task")


def seeded_episode(worker, task, script) -> tuple[str, list[dict]]:
    episode_id = worker.request("seed", domain="retail", task_id=task["id"])["episode_id"]
    trajectory = Trajectory()
    for index, step in enumerate(script["steps"]):
        if step[0] == "text":
            trajectory.text(step[1], step[2])
        else:
            answer = worker.request(
                "call_tool", episode_id=episode_id, name=step[2], arguments=step[3], requestor=step[1],
                call_id=f"c{index}",
            )  # fmt: skip
            trajectory.tool_call(step[1], f"c{index}", step[2], step[3], answer)
    return episode_id, trajectory.messages


@pytest.mark.parametrize(
    ("fault", "cause"),
    [("http_500", "InternalServerError"), ("invalid_json", "JSONDecodeError"), ("empty_results", "no results")],
)
def test_a_judge_fault_on_every_attempt_is_an_infra_error_naming_its_cause(worker, judge, nl_task, fault, cause):
    episode_id, messages = seeded_episode(worker, *nl_task)
    judge.inject(fault, count=JUDGE_ATTEMPTS)
    with pytest.raises(Tau2JudgeError, match=cause):
        worker.verify(episode_id, messages, "user_stop")
    # Nothing was scored and the episode is still there: grading it again, with the judge back, gives the score.
    assert worker.verify(episode_id, messages, "user_stop")["reward"] == 1.0


def test_a_fault_then_a_good_answer_scores_as_a_clean_run(worker, judge, nl_task):
    episode_id, messages = seeded_episode(worker, *nl_task)
    clean = worker.verify(episode_id, messages, "user_stop")
    episode_id, messages = seeded_episode(worker, *nl_task)
    judge.inject("http_500", count=1)
    before = judge.requests
    retried = worker.verify(episode_id, messages, "user_stop")
    assert judge.requests - before == 2
    assert retried["reward"] == clean["reward"] == 1.0
    assert retried["reward_info"]["nl_assertions"] == clean["reward_info"]["nl_assertions"]


def test_a_judge_that_is_down_is_an_infrastructure_error(worker, judge, nl_task):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        dead_url = f"http://127.0.0.1:{unused.getsockname()[1]}/v1"
    worker.request("configure_judge", model="scripted-judge", base_url=dead_url, num_retries=0, timeout=5)
    try:
        episode_id, messages = seeded_episode(worker, *nl_task)
        with pytest.raises(Tau2JudgeError, match="Connection"):
            worker.verify(episode_id, messages, "user_stop")
    finally:
        worker.request("configure_judge", model="scripted-judge", base_url=judge.base_url, num_retries=0, timeout=10)
    assert worker.verify(episode_id, messages, "user_stop")["reward"] == 1.0


def test_an_unknown_task_or_termination_is_a_bad_request(worker):
    with pytest.raises(Tau2RequestError, match="no task 'nope'"):
        worker.request("seed", domain="retail", task_id="nope")
    episode_id = worker.request("seed", domain="retail", task_id="0")["episode_id"]
    with pytest.raises(Tau2RequestError, match="unknown termination_reason 'finished'"):
        worker.verify(episode_id, [], "finished")
