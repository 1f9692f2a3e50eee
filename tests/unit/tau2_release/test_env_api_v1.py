"""``Tau2Env`` on tau2 v1.0.1: the release's tasks, tools, prompts and reward basis through its workers, episodes
played step by step through the resources server's own release code and scored by the release's
``evaluate_simulation``."""

import contextlib
import json
from pathlib import Path

import psutil
import pytest

from nemo_tau2.env_api import GymServerUrls, Tau2Env
from nemo_tau2.env_api.config import Tau2EnvConfig
from nemo_tau2.env_api.release_tasks import ReleaseTasks
from nemo_tau2.generation.launch import GenerationHandle
from nemo_tau2.gym.launch import GymServers, ServerSpec
from nemo_tau2.gym.stack import RESOURCES_SERVER, RESOURCES_SERVER_CLASS, USER_MODEL, ModelEndpoint, model_server_spec
from nemo_tau2.tau2_release.client import WORKER_FILE
from nemo_tau2.tau2_release.config import NLJudgeConfig, Tau2ReleaseConfig
from nemo_tau2.testing import start_fake_server
from nemo_tau2.testing.release_tasks import load_release_tasks
from nemo_tau2.testing.tau2_scripts import Tau2ScriptsConfig
from tests.tau2_v1_env import tau2_v1_python
from tests.unit.env_api.conftest import USER, chat_turns, play_forked

# Airline tasks whose gold actions v1.0.1 left as v0.2.1 had them (the scripted oracle plays v0.2.1's gold).
UNCHANGED_AIRLINE = ["0", "11"]  # 11 writes (update_reservation_flights)


@pytest.fixture(scope="module")
def user_endpoint():
    with start_fake_server() as server:
        yield GenerationHandle(backend="fake", base_urls=[server.base_url], model_name="fake-user")


def _release(judge) -> dict:
    judge_config = NLJudgeConfig(model="scripted-judge", base_url=judge.base_url)
    return Tau2ReleaseConfig(version="v1.0.1", python=tau2_v1_python(), judge=judge_config).model_dump()


def _play(env: Tau2Env, task_index: int, variant: str) -> dict:
    observation, info = env.reset(task_index)
    for action in chat_turns("airline", info["task_id"], variant):
        observation, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return info | {"reward": reward}
    raise AssertionError(f"the scripted episode of task {info['task_id']} did not end")


def test_tau2env_plays_v101_through_its_workers_and_scores_as_the_release(user_endpoint, judge):
    env = Tau2Env("airline", task_ids=UNCHANGED_AIRLINE, user=USER, user_endpoint=user_endpoint, tau2=_release(judge))
    try:
        assert env.env.task_ids == UNCHANGED_AIRLINE
        oracle = [_play(env, index, "oracle") for index in range(2)]
        assert [(r["reward"], r["tau2_version"], r["termination_reason"]) for r in oracle] == [
            (1.0, "v1.0.1", "user_stop")
        ] * 2
        assert all("reward_info" in r for r in oracle)  # the release's own RewardInfo
        wrong = _play(env, 1, "wrong_argument")  # the write with a wrong argument: the release's DB check fails it
        assert wrong["reward"] == 0.0 and wrong["db_match"] is False and wrong["tau2_version"] == "v1.0.1"
        # forked at the policy's first turn (Tau2Env.fork: new episodes in the worker), each fork plays on its own
        (parent, first, second), (parent_saw, first_saw, _) = play_forked(env, 1, at=0)
        assert (parent["reward"], first["reward"], second["reward"]) == (1.0, 1.0, 0.0)
        assert first_saw == parent_saw and parent_saw and first["tau2_version"] == "v1.0.1"
    finally:
        env.close()


def test_tau2env_against_running_gym_servers_of_v101_scores_as_in_process(user_endpoint, judge):
    """The same episodes against a running resources server of v1.0.1 (and a user model server): the session and
    the verdict are that server's, the tasks and tools the release's; the scores are the in-process ones."""
    release = _release(judge)
    resources = ServerSpec(
        RESOURCES_SERVER, "resources_servers", "tau2", RESOURCES_SERVER_CLASS,
        {"domain": "agent", "domains": ["airline"], "tau2": release},
    )  # fmt: skip
    user_model = model_server_spec(USER_MODEL, ModelEndpoint(user_endpoint.base_urls, user_endpoint.model_name))
    with GymServers([resources, user_model]) as servers:
        urls = GymServerUrls(servers.url(RESOURCES_SERVER), servers.url(USER_MODEL))
        env = Tau2Env("airline", task_ids=UNCHANGED_AIRLINE, user=USER, gym_servers=urls, tau2=release)
        try:
            oracle, wrong = _play(env, 0, "oracle"), _play(env, 1, "wrong_argument")
        finally:
            env.close()
    assert (oracle["reward"], oracle["tau2_version"], oracle["termination_reason"]) == (1.0, "v1.0.1", "user_stop")
    assert (wrong["reward"], wrong["db_match"], wrong["tau2_version"]) == (0.0, False, "v1.0.1")


def test_tau2env_on_v101_takes_the_releases_tools_reward_basis_and_task_ids(worker):
    """What a retail env of v1.0.1 is built from (read through the package's worker: no second start)."""
    config = Tau2EnvConfig(domain="retail", split="test", user={"generation": USER}, tau2=worker.config)
    tasks = ReleaseTasks.load(config, worker)
    names = {tool["function"]["name"] for tool in tasks.tools}
    assert "get_item_details" in names  # a READ tool new in v1.0.1
    bases = {tuple(tasks.reward_basis[task_id]) for task_id in tasks.task_ids}
    assert ("DB", "NL_ASSERTION") in bases  # retail's v1.0.1 scoring
    assert all(row["tau2_version"] == "v1.0.1" for row in tasks.rows.values())
    wrong = config.model_copy(update={"split": None, "task_ids": ["nope"]})
    with pytest.raises(ValueError, match=r"Tau2Env.task_ids: not in tau2 v1.0.1's tasks: \['nope'\]"):
        ReleaseTasks.load(wrong, worker)


def test_a_refused_task_id_leaves_no_worker_of_the_release_running(user_endpoint, judge):
    def workers() -> set[int]:
        found = set()
        for child in psutil.Process().children(recursive=True):  # the fork template's ended forks among them
            with contextlib.suppress(psutil.NoSuchProcess):  # ended (or a zombie) between the listing and the look
                if any(str(WORKER_FILE) in part for part in child.cmdline()):
                    found.add(child.pid)
        return found

    before = workers()
    with pytest.raises(ValueError, match=r"Tau2Env.task_ids: not in tau2 v1.0.1's tasks: \['nope'\]"):
        Tau2Env("airline", task_ids=["nope"], user=USER, user_endpoint=user_endpoint, tau2=_release(judge))
    assert workers() == before


def test_tau2env_plays_banking_knowledge_with_its_discoverable_tools(judge, release_tasks):
    """banking_knowledge (v1.0.1's own domain) through Tau2Env: the oracle of a plain task and of one whose agent
    gives the user a discoverable tool (the user's tools grow mid-episode) score 1.0, as the release scores them."""
    load_release_tasks(release_tasks)  # the scripted policy's gold actions: the release's own tasks
    tasks = json.loads(Path(release_tasks).read_text())["banking_knowledge"]
    gives = next(task["id"] for task in tasks if any(
        action["name"] == "give_discoverable_user_tool" for action in task["evaluation_criteria"]["actions"] or []
    ))  # fmt: skip
    task_ids = ["task_001", gives]
    scripts = Tau2ScriptsConfig(release_tasks=str(release_tasks))
    with start_fake_server(tau2=scripts) as server:
        endpoint = GenerationHandle(backend="fake", base_urls=[server.base_url], model_name="fake-user")
        env = Tau2Env("banking_knowledge", task_ids=task_ids, user=USER, user_endpoint=endpoint, tau2=_release(judge))
        try:
            played = []
            for index in range(2):
                observation, info = env.reset(index)
                for action in chat_turns("banking_knowledge", info["task_id"], "oracle"):
                    observation, reward, terminated, truncated, info = env.step(action)
                    if terminated or truncated:
                        break
                played.append((info["task_id"], reward, info["retrieval_variant"], info["termination_reason"]))
        finally:
            env.close()
    assert played == [(task_id, 1.0, "bm25_grep", "user_stop") for task_id in task_ids]
