"""Whole episodes through Tau2Env / AsyncTau2Env: tau2's reward on every base task, the agent server's scores task
for task, respond_user mode, and hundreds of concurrent episodes without cross-talk."""

import json

import aiohttp
import pytest

from nemo_tau2.env_api import RESPOND_USER, GymServerUrls, Tau2Env
from nemo_tau2.gym.stack import AGENT, RESOURCES_SERVER, USER_MODEL
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.gym_rows import task_row
from nemo_tau2.testing import PolicyScriptConfig, ScriptError
from nemo_tau2.testing.tau2_scripts import STOP, opening_text, policy_turns
from tests.unit.env_api.conftest import gather_limited, play, play_sync

DOMAINS = ["airline", "retail", "telecom"]
COMPARED = (
    "reward",
    "success",
    "termination_reason",
    "db_match",
    "action_match_fraction",
    "write_action_match_fraction",
    "env_assertion_fraction",
    "communicate_fraction",
    "num_steps",
    "num_tool_errors",
    "num_turns",
    "num_user_turns",
    "num_tool_calls",
    "num_tool_errors",
)


@pytest.mark.parametrize("domain", DOMAINS)
def test_sync_env_oracle_scores_one_on_every_base_task(fake, domain):
    env = fake.env(domain, cls=Tau2Env)
    try:
        results = [play_sync(env, index) for index in range(len(env.task_ids))]
    finally:
        env.close()
    assert len(results) == len(domains.get_tasks(domain, "base"))
    failures = [(r["task_id"], r["reward"], r["termination_reason"]) for r in results if r["reward"] != 1.0]
    assert failures == []
    assert all(r["termination_reason"] == "user_stop" and r["success"] for r in results)


def _wrong_argument_tasks(domain: str) -> list[str]:
    ids = []
    for task in domains.get_tasks(domain, "base"):
        try:
            policy_turns(domain, task.id, "wrong_argument")
        except ScriptError:
            continue  # no write action with an argument to get wrong
        ids.append(task.id)
    return ids


async def _agent_runs(url: str, domain: str, task_ids: list[str]) -> dict[str, dict]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:

        async def one(task_id):
            async with http.post(f"{url}/run", json=task_row(domain, task_id) | {"sample_index": 0}) as response:
                assert response.status == 200, await response.text()
                return task_id, await response.json()

        return dict(await gather_limited([one(task_id) for task_id in task_ids], limit=16))


@pytest.mark.parametrize("domain", DOMAINS)
@pytest.mark.parametrize("variant", ["oracle", "wrong_argument"])
async def test_async_env_scores_as_the_agent_server_task_for_task(fake, agent_stack, domain, variant):
    every = [task.id for task in domains.get_tasks(domain, "base")]
    task_ids = every if variant == "oracle" else _wrong_argument_tasks(domain)
    fake.server.set_tau2_scripts(policy=PolicyScriptConfig(variant=variant))
    reference = await _agent_runs(agent_stack.url(AGENT), domain, task_ids)
    env_results = {}
    async with fake.env(domain, task_ids=task_ids) as env:
        for index, task_id in enumerate(env.task_ids):
            info, _, _ = await play(env, index, variant)
            env_results[task_id] = info
    differences = [
        (task_id, key, env_results[task_id][key], reference[task_id][key])
        for task_id in task_ids
        for key in COMPARED
        if env_results[task_id][key] != reference[task_id][key]
    ]
    assert differences == []
    rewards = [reference[task_id]["reward"] for task_id in task_ids]
    assert set(rewards) == {1.0} if variant == "oracle" else 0.0 in rewards


async def test_env_against_running_gym_servers_scores_as_in_process(fake, agent_stack):
    servers = GymServerUrls(agent_stack.url(RESOURCES_SERVER), agent_stack.url(USER_MODEL))
    task_ids = [task.id for task in domains.get_tasks("telecom", "test")[:3]]
    async with (
        fake.env("telecom", task_ids=task_ids, gym_servers=servers) as remote,
        fake.env("telecom", task_ids=task_ids) as local,
    ):
        for index in range(len(task_ids)):
            remote_info, remote_observations, _ = await play(remote, index)
            local_info, local_observations, _ = await play(local, index)
            assert [remote_info[key] for key in COMPARED] == [local_info[key] for key in COMPARED]
            assert remote_info["reward"] == 1.0
            assert _texts(remote_observations) == _texts(local_observations)


def _texts(observations: list[dict]) -> list[tuple]:
    return [(m["role"], m["content"]) for o in observations for m in o["messages"]]


async def test_respond_user_mode_scores_one_with_every_turn_a_tool_call(fake):
    task_ids = [task.id for task in domains.get_tasks("airline", "test")[:4]]
    async with fake.env("airline", task_ids=task_ids, respond_user=True) as env:
        for index in range(len(task_ids)):
            observation, info = await env.reset(index)
            assert any(tool["function"]["name"] == RESPOND_USER for tool in observation["tools"])
            for turn in policy_turns("airline", info["task_id"], "oracle"):
                message = turn.chat_message()
                if not message["tool_calls"]:  # say it through respond_user
                    call = {"id": "r1", "type": "function", "function": {"name": RESPOND_USER}}
                    call["function"]["arguments"] = json.dumps({"text": message["content"]})
                    message = {"role": "assistant", "content": None, "tool_calls": [call]}
                observation, reward, terminated, truncated, info = await env.step(message)
                replies = observation["messages"]
                if message["tool_calls"][0]["function"]["name"] == RESPOND_USER:
                    # the user's reply comes back as the respond_user call's result, not as a user message
                    assert replies[0] == {"role": "tool", "tool_call_id": "r1", "content": replies[0]["content"]}
                    assert all(m["role"] != "user" for m in replies)
            assert (reward, terminated, info["termination_reason"]) == (1.0, True, "user_stop")
            assert replies[-1]["content"] == STOP
            # tau2's transcript holds the respond_user texts as the agent's messages (what COMMUNICATE reads)
            assert env.messages[-2]["role"] == "assistant" and "anything else" in env.messages[-2]["content"]


async def test_respond_user_beside_other_calls_or_without_text_is_a_malformed_call(fake):
    async with fake.env("airline", task_ids=["11"], respond_user=True) as env:
        await env.reset(0)
        lookup = {"id": "a", "type": "function", "function": {"name": "get_user_details", "arguments": "{}"}}
        respond = {"id": "b", "type": "function", "function": {"name": RESPOND_USER, "arguments": '{"text": "hi"}'}}
        observation, *_, info = await env.step({"role": "assistant", "tool_calls": [lookup, respond]})
        results = {m["tool_call_id"]: m["content"] for m in observation["messages"]}
        assert results["b"].startswith("Error: malformed tool call: respond_user must be the only call")
        assert results["a"].startswith("Error:")  # tau2's own error for the missing user_id
        empty = {"id": "c", "type": "function", "function": {"name": RESPOND_USER, "arguments": '{"text": " "}'}}
        observation, *_, info = await env.step({"role": "assistant", "tool_calls": [empty]})
        assert observation["messages"][0]["content"].startswith("Error: malformed tool call: respond_user")
        assert info["num_tool_errors"] == 3


async def test_256_concurrent_episodes_in_one_loop_keep_to_their_own_task_and_database(fake):
    """Half the episodes corrupt a write argument of the same tasks the other half solve: each DB stays its own."""
    task_ids = _wrong_argument_tasks("retail")[:16]
    reference = {}
    async with fake.env("retail", task_ids=task_ids) as env:
        for index, task_id in enumerate(task_ids):
            info, _, _ = await play(env, index, "wrong_argument")
            reference[task_id] = info["reward"]
    assert 0.0 in reference.values()
    fake.server.set_tau2_scripts(policy=PolicyScriptConfig(variant="wrong_argument", variant_every=2))
    envs = [fake.env("retail", task_ids=task_ids) for _ in range(256)]
    try:
        jobs = [play(env, i % len(task_ids), "wrong_argument" if i % 2 else "oracle", i) for i, env in enumerate(envs)]
        results = await gather_limited(jobs, limit=256)
    finally:
        await gather_limited([env.close() for env in envs], limit=256)
    for i, (info, observations, _) in enumerate(results):
        task_id = task_ids[i % len(task_ids)]
        assert (info["task_id"], info["sample_index"]) == (task_id, i)
        assert info["reward"] == (reference[task_id] if i % 2 else 1.0), (i, task_id)
        opening = opening_text(domains.get_task("retail", task_id))
        assert observations[0]["messages"][2]["content"] == opening  # its own user, not a neighbour's
    assert len({info["conversation_id"] for info, _, _ in results}) == 256
