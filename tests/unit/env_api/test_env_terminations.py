"""How Tau2Env episodes end (each of tau2's termination reasons), what bad actions get, and failures."""

import pytest
from tau2.data_model.message import ToolCall

from nemo_tau2.env_api import Tau2Env
from nemo_tau2.env_api.config import Tau2EnvConfig
from nemo_tau2.gym.http_client import InfrastructureError
from nemo_tau2.tau2_env import domains
from nemo_tau2.testing import OUT_OF_SCOPE, TRANSFER, PolicyScriptConfig, UserScriptConfig
from nemo_tau2.testing.scripts import Turn, TurnListScript
from tests.unit.env_api.conftest import USER, play

ASK = {"role": "assistant", "content": "Could you tell me more?"}


def _call(name: str, arguments: str = "{}", call_id: str = "c1") -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "function": {"name": name, "arguments": arguments}}],
    }


def _tau2_answer(domain: str, name: str, arguments: dict) -> str:
    """What tau2's own environment answers the call (the reference for tool errors)."""
    return domains.new_environment(domain).get_response(ToolCall(id="x", name=name, arguments=arguments)).content


async def test_user_stop_ends_the_episode_with_tau2s_reward_and_components(fake):
    async with fake.env("airline", task_ids=["11"]) as env:
        info, observations, (terminated, truncated) = await play(env, 0)
    assert (terminated, truncated, info["termination_reason"], info["truncated_by"]) == (
        True,
        False,
        "user_stop",
        None,
    )
    assert info["reward"] == 1.0 and info["success"] and info["db_match"] is True
    assert info["tau2_failure_kind"] == "ended_normally" and info["agent_tool_calls"]["malformed"] == 0
    assert info["communicate_fraction"] == 1.0 and info["reward_info"]["reward"] == 1.0
    assert observations[0]["tools"] == domains.chat_tool_schemas("airline")  # the tools at reset only
    assert all(o["tools"] == [] for o in observations[1:])
    assert [m["role"] for m in observations[0]["messages"]] == ["system", "assistant", "user"]


@pytest.mark.parametrize("ending", [TRANSFER, OUT_OF_SCOPE])
async def test_transfer_and_out_of_scope_endings_are_user_stops(fake, ending):
    fake.server.set_tau2_scripts(user=UserScriptConfig(ending=ending))
    async with fake.env("retail", split="test") as env:
        info, observations, (terminated, _) = await play(env, 0)
    assert terminated and info["termination_reason"] == "user_stop"
    assert ending in observations[-1]["messages"][-1]["content"]


async def test_a_transfer_to_a_human_agent_is_a_user_stop(fake):
    fake.server.set_tau2_scripts(policy=PolicyScriptConfig(variant="transfer"))
    async with fake.env("airline", task_ids=["11"]) as env:
        info, observations, (terminated, _) = await play(env, 0, variant="transfer")
    assert terminated and info["termination_reason"] == "user_stop" and info["reward"] == 0.0
    assert info["tau2_failure_kind"] == "transfer" and info["agent_tool_calls"]["transfer_to_human_agents"]
    assert observations[-1]["messages"][-1]["content"] == TRANSFER


async def test_max_steps_truncates_the_episode_with_reward_zero(fake):
    fake.provider.user = TurnListScript([], closing_text="Hmm, let me think.")
    async with fake.env("airline", task_ids=["11"], max_steps=10) as env:
        await env.reset(0)
        steps, terminated, truncated = 0, False, False
        while not (terminated or truncated):
            _, reward, terminated, truncated, info = await env.step(ASK)
            steps += 1
    assert (terminated, truncated, reward) == (False, True, 0.0)
    assert (info["termination_reason"], info["truncated_by"], info["num_steps"], steps) == (
        "max_steps",
        "max_steps",
        10,
        5,  # user, then agent + user per step: tau2 counts every message
    )
    assert info["tau2_failure_kind"] == "max_steps"


async def test_max_turns_truncates_after_that_many_policy_turns(fake):
    fake.provider.user = TurnListScript([], closing_text="Hmm, let me think.")
    async with fake.env("airline", task_ids=["11"], max_turns=2) as env:
        await env.reset(0)
        assert (await env.step(ASK))[2:4] == (False, False)
        _, reward, terminated, truncated, info = await env.step(ASK)
    assert (terminated, truncated, info["truncated_by"], info["termination_reason"]) == (
        False,
        True,
        "max_turns",
        "max_steps",
    )
    assert info["tau2_failure_kind"] == "max_steps"


async def test_too_many_tool_errors_terminate_the_episode(fake):
    async with fake.env("airline", task_ids=["11"], max_errors=3) as env:
        await env.reset(0)
        for _ in range(3):
            observation, reward, terminated, truncated, info = await env.step(_call("launch_rocket", '{"to": 1}'))
    assert (terminated, truncated, reward, info["termination_reason"], info["num_tool_errors"]) == (
        True,
        False,
        0.0,
        "too_many_errors",
        3,
    )
    assert (info["tau2_failure_kind"], info["agent_tool_calls"]["hallucinated"]) == ("tool_error_cap", 3)
    assert observation["messages"] == [
        {"role": "tool", "tool_call_id": "c1", "content": _tau2_answer("airline", "launch_rocket", {"to": 1})}
    ]


async def test_an_empty_action_is_an_agent_error(fake):
    async with fake.env("airline", task_ids=["11"]) as env:
        await env.reset(0)
        _, reward, terminated, _, info = await env.step({"role": "assistant", "content": "  "})
    assert terminated and info["termination_reason"] == "agent_error" and reward == 0.0
    assert info["tau2_failure_kind"] == "empty_message"


async def test_a_user_that_stays_silent_ends_the_episode_at_reset_as_a_user_error(fake):
    fake.provider.user = TurnListScript([], closing_text=" ")
    async with fake.env("airline", task_ids=["11"]) as env:
        observation, info = await env.reset(0)
        assert info["termination_reason"] == "user_error" and info["reward"] == 0.0
        assert info["tau2_failure_kind"] == "empty_message"
        assert info["user_simulator"]["model_calls"] == 3  # 1 + user_empty_retries
        with pytest.raises(RuntimeError, match="has ended"):
            await env.step(ASK)


async def test_bad_tool_calls_get_tau2s_tool_errors_and_count(fake):
    async with fake.env("airline", task_ids=["11"]) as env:
        await env.reset(0)
        cases = [
            (_call("launch_rocket"), _tau2_answer("airline", "launch_rocket", {})),
            (
                _call("get_user_details", '{"user_id": "nobody"}'),
                _tau2_answer("airline", "get_user_details", {"user_id": "nobody"}),
            ),
            (_call("get_user_details", "{}"), _tau2_answer("airline", "get_user_details", {})),
        ]
        for action, expected in cases:
            observation, *_, info = await env.step(action)
            assert observation["messages"] == [{"role": "tool", "tool_call_id": "c1", "content": expected}]
            assert expected.startswith("Error: ")
        observation, *_, info = await env.step(_call("get_user_details", '{"user_id": "mia_'))
        assert observation["messages"][0]["content"].startswith(
            "Error: malformed tool call: arguments are not valid JSON"
        )
        observation, *_, info = await env.step(_call("get_user_details", "[1, 2]"))
        assert observation["messages"][0]["content"].startswith(
            "Error: malformed tool call: arguments must be a JSON object"
        )
        observation, *_, info = await env.step(_call("get_user_details", '{"user_id": "\\ud800"}'))
        assert observation["messages"][0]["content"].startswith("Error: ")
        assert info["num_tool_errors"] == 6 and info["termination_reason"] is None


async def test_actions_that_are_not_assistant_turns_are_refused_and_change_nothing(fake):
    async with fake.env("airline", task_ids=["11"]) as env:
        await env.reset(0)
        for action in (42, {"role": "user", "content": "hi"}, {"tool_calls": [{"function": {}}]}, {"content": 3}):
            with pytest.raises(ValueError):
                await env.step(action)
        for action in ({"content": "hi \ud800"}, _call("get_user\udc00_details", "{}")):
            with pytest.raises(ValueError, match="lone UTF-16 surrogate"):
                await env.step(action)
        _, _, terminated, _, info = await env.step(
            Turn.call("get_user_details", {"user_id": "mia_li_3668"}).chat_message()
        )
        assert not terminated and info["num_turns"] == 1 and info["num_tool_errors"] == 0


async def test_reset_ends_a_live_episode_and_starts_the_task_chosen_by_the_seed(fake):
    async with fake.env("retail", split="test", seed=7) as first, fake.env("retail", split="test", seed=7) as second:
        _, info_a = await first.reset()
        _, info_b = await second.reset()
        assert info_a["task_id"] == info_b["task_id"]
        await first.step(ASK)
        _, again = await first.reset(seed=7)
        assert again["task_id"] == info_a["task_id"] and again["num_turns"] == 0
        with pytest.raises(ValueError, match="task_index"):
            await first.reset(task_index=10_000)


async def test_a_user_model_that_keeps_failing_raises_an_infrastructure_error_never_a_score(fake):
    async with fake.env("airline", task_ids=["11"], user_retry={"max_attempts": 2, "backoff_s": 0.01}) as env:
        await env.reset(0)
        fake.server.inject_fault("http_500", count=None, key_pattern=r"\|user$")
        with pytest.raises(InfrastructureError, match="HTTP 500"):
            await env.step(ASK)
        with pytest.raises(RuntimeError, match="episode failed"):
            await env.step(ASK)
        fake.server.clear_faults()
        await env.reset(0)  # a new episode plays normally
        assert (await env.step(ASK))[4]["num_user_turns"] == 2


def test_bad_settings_name_the_problem(fake):
    with pytest.raises(ValueError, match="exactly one of split"):
        fake.env("airline", split="test", task_ids=["1"])
    with pytest.raises(ValueError, match="no split 'dev'"):
        fake.env("airline", split="dev")
    with pytest.raises(ValueError, match="no task '999'"):
        fake.env("airline", task_ids=["999"])
    with pytest.raises(ValueError, match="max_steps"):
        fake.env("airline", max_steps=0)
    with pytest.raises(ValueError, match="pivot_text_reward does not apply to Tau2Env"):  # a setting it would ignore
        Tau2EnvConfig(domain="airline", split="test", user={"generation": USER}, pivot_text_reward="continue")
    with pytest.raises(ValueError, match="pre-written message history"):
        fake.env("mock", task_ids=[t.id for t in domains.get_tasks("mock", "base")])
    with pytest.raises(ValueError, match="max_checks applies only"):
        fake.env("airline", user={"generation": USER, "max_checks": 2})
    with pytest.raises(ValueError, match="top_p: must be given explicitly"):  # the gym rules hold for the user
        fake.env("airline", user={"generation": {"backend": "fake", "temperature": 0.0}})


def test_sync_env_is_a_gymnasium_env(fake):
    import gymnasium

    env = fake.env("airline", cls=Tau2Env, task_ids=["11"])
    try:
        assert isinstance(env, gymnasium.Env)
        assert env.action_space.contains(ASK) and not env.action_space.contains({"role": "user"})
        assert env.action_space.contains(env.action_space.sample())
        observation, _ = env.reset(options={"task_index": 0})
        assert env.observation_space.contains(observation)
    finally:
        env.close()
