"""Whole episodes through the real agent and resources servers: oracle policy + scripted user, every termination."""

import asyncio

import pytest
import requests

from nemo_tau2.gym.nemo_gym_compat import NEMO_GYM_VERSION
from nemo_tau2.json_arguments import loads_standard
from nemo_tau2.tau2_env import domains
from nemo_tau2.testing import PolicyScriptConfig, UserScriptConfig
from nemo_tau2.testing.scripts import Turn, TurnListScript
from tests.unit.gym.agent.conftest import say
from tests.unit.gym.nemo_rl_client import METRIC_KEYS


@pytest.mark.parametrize("domain", ["airline", "retail", "telecom"])
def test_oracle_policy_and_scripted_user_score_one_on_every_base_task(fresh_stack, domain):
    tasks = domains.get_tasks(domain, "base")
    results = asyncio.run(fresh_stack.run_many([(domain, task.id, {}) for task in tasks]))
    failures = [
        (task.id, status, body.get("reward"), body.get("termination_reason"), body.get("error"))
        for task, (status, body) in zip(tasks, results, strict=True)
        if status != 200 or body["reward"] != 1.0 or body["termination_reason"] != "user_stop"
    ]
    assert failures == []
    for task, (_, body) in zip(tasks, results, strict=True):
        assert body["status"] == "ok" and body["success"] is True
        assert (
            body["token_contiguity"]["breaks"] == [] and body["token_contiguity"]["checked_turns"] == body["num_turns"]
        )
        assert body["num_tool_errors"] < 10  # a few gold actions fail in tau2 too (its evaluator ignores them)
        # a transfer is how an episode ends, right or wrong: some tasks' gold is to transfer
        gold = [action.name for action in (task.evaluation_criteria.actions or [])]
        assert body["tau2_failure_kind"] == ("transfer" if "transfer_to_human_agents" in gold else "ended_normally")
        assert body["agent_tool_calls"]["malformed"] == body["agent_tool_calls"]["hallucinated"] == 0


def test_transcript_carries_token_ids_per_policy_turn_and_the_user_inline(fresh_stack):
    status, body = fresh_stack.run("airline", "11")
    assert status == 200 and body["reward"] == 1.0
    output = body["response"]["output"]
    with_tokens = [item for item in output if item.get("generation_token_ids")]
    assert len(with_tokens) == body["num_turns"]
    for item in with_tokens:
        assert len(item["generation_token_ids"]) == len(item["generation_log_probs"]) > 0
        assert all(isinstance(token, int) for token in item["prompt_token_ids"])
    assert [item["role"] for item in output if item.get("role") == "user"]  # simulated user messages inline
    calls = [item for item in output if item.get("type") == "function_call"]
    results = [item for item in output if item.get("type") == "function_call_output"]
    assert [c["call_id"] for c in calls] == [r["call_id"] for r in results]


@pytest.mark.parametrize(
    ("ending", "expected_text"), [("###TRANSFER###", "###TRANSFER###"), ("###OUT-OF-SCOPE###", "###OUT-OF-SCOPE###")]
)
def test_transfer_and_out_of_scope_endings_are_user_stops(fresh_stack, ending, expected_text):
    fresh_stack.fake.set_tau2_scripts(user=UserScriptConfig(ending=ending))
    status, body = fresh_stack.run("retail", domains.get_tasks("retail", "test")[0].id)
    assert status == 200 and body["termination_reason"] == "user_stop"
    last_user = [item for item in body["response"]["output"] if item.get("role") == "user"][-1]
    assert expected_text in last_user["content"]


def test_transfer_to_a_human_is_a_user_stop(fresh_stack):
    fresh_stack.fake.set_tau2_scripts(policy=PolicyScriptConfig(variant="transfer"))
    status, body = fresh_stack.run("airline", "11")
    assert status == 200 and body["termination_reason"] == "user_stop"
    assert any(item.get("name") == "transfer_to_human_agents" for item in body["response"]["output"])
    assert body["tau2_failure_kind"] == "transfer" and body["agent_tool_calls"]["transfer_to_human_agents"] is True


def test_a_conversation_that_never_ends_stops_at_max_steps(fresh_stack):
    fresh_stack.provider.policy = say()  # keeps repeating its closing question
    fresh_stack.provider.user = TurnListScript([], closing_text="Hmm, let me think.")
    status, body = fresh_stack.run("airline", "11")
    assert status == 200
    assert (body["termination_reason"], body["truncated_by"], body["num_steps"]) == ("max_steps", "max_steps", 200)
    assert body["reward"] == 0.0 and body["tau2_failure_kind"] == "max_steps"
    assert body["agent_tool_calls"]["total"] == 0  # NeMo-Gym's "missing tool call"


def test_ten_tool_errors_end_the_episode(fresh_stack):
    fresh_stack.provider.policy = TurnListScript([Turn.call("launch_rocket", {"target": "moon"})] * 20)
    status, body = fresh_stack.run("airline", "11")
    assert status == 200
    assert body["termination_reason"] == "too_many_errors" and body["num_tool_errors"] == 10 and body["reward"] == 0.0
    outputs = [item["output"] for item in body["response"]["output"] if item.get("type") == "function_call_output"]
    assert outputs[0] == "Error: Tool 'launch_rocket' not found."
    assert body["tau2_failure_kind"] == "tool_error_cap"  # the cap outranks what the calls were
    assert body["agent_tool_calls"] == {
        "total": 10,
        "malformed": 0,
        "hallucinated": 10,
        "transfer_to_human_agents": False,
    }


def test_malformed_text_tool_calls_are_tool_errors(fresh_stack):
    fresh_stack.provider.policy = TurnListScript([Turn.say('<tool_call>{"name": "get_user_details", "argu')] * 20)
    status, body = fresh_stack.run("airline", "11")
    assert status == 200 and body["termination_reason"] == "too_many_errors"
    outputs = [item["output"] for item in body["response"]["output"] if item.get("type") == "function_call_output"]
    assert outputs[0].startswith("Error: malformed tool call")
    assert body["tau2_failure_kind"] == "tool_error_cap" and body["agent_tool_calls"]["malformed"] == 10
    # the history goes back to the model server every turn, and llama.cpp and vLLM parse each call's arguments again
    calls = [item for item in body["response"]["output"] if item.get("type") == "function_call"]
    assert calls and all(loads_standard(call["arguments"]) == '{"name": "get_user_details", "argu' for call in calls)


def test_tool_calls_written_as_text_are_executed(fresh_stack):
    task = domains.get_task("airline", "11")
    action = task.evaluation_criteria.actions[0]
    fresh_stack.provider.policy = TurnListScript(
        [
            Turn.say(
                f'<tool_call>{{"name": "{action.name}", "arguments": {__import__("json").dumps(action.arguments)}}}'
                "</tool_call>"
            ),
            Turn.say("The refund is 5244. Is there anything else I can help you with?"),
        ]
    )
    status, body = fresh_stack.run("airline", "11")
    assert status == 200 and body["reward"] == 1.0 and body["num_tool_errors"] == 0
    assert body["token_contiguity"]["breaks"] == []


@pytest.mark.parametrize(
    ("first_turn", "kind"),
    [
        (Turn.call("launch_rocket", {"target": "moon"}), "hallucinated_tool"),
        (Turn.say('<tool_call>{"name": "get_user_details", "argu'), "malformed_tool_call"),
    ],
)
def test_one_bad_call_in_an_episode_that_ends_normally_is_its_failure_kind(fresh_stack, first_turn, kind):
    fresh_stack.provider.policy = TurnListScript([first_turn, Turn.say("Is there anything else I can help with?")])
    status, body = fresh_stack.run("airline", "11")
    assert status == 200 and body["termination_reason"] == "user_stop" and body["num_tool_errors"] == 1
    assert body["tau2_failure_kind"] == kind and body["agent_tool_calls"]["total"] == 1


def test_an_empty_agent_message_is_an_agent_error(fresh_stack):
    fresh_stack.provider.policy = say("   ")
    status, body = fresh_stack.run("airline", "11")
    assert status == 200 and body["termination_reason"] == "agent_error" and body["reward"] == 0.0
    assert body["tau2_failure_kind"] == "empty_message"


def test_an_empty_user_message_is_retried_then_a_user_error(fresh_stack):
    fresh_stack.provider.user = TurnListScript([], closing_text="  ")
    status, body = fresh_stack.run("airline", "11")
    assert status == 200 and body["termination_reason"] == "user_error"
    user_calls = fresh_stack.fake.stats().requests_by_key
    assert sum(count for key, count in user_calls.items() if key.endswith("|user")) == 3  # 1 + 2 retries


def test_agent_rejects_an_unserved_domain_and_single_responses_calls(fresh_stack):
    status, body = fresh_stack.run("mock", domains.get_tasks("mock", "base")[0].id)
    assert status == 400 and "not served by this agent" in body["detail"]
    response = requests.post(f"{fresh_stack.agent_url}/v1/responses", json={"input": "hi"})
    assert response.status_code == 400 and "/run" in response.json()["detail"]
    # NeMo-Gym 0.7.0's harness-driven agent sessions (the route exists only there): refused, naming /run
    for route in ("/v1/agent_sessions", "/v1/agent_sessions/close"):
        response = requests.post(f"{fresh_stack.agent_url}{route}", json={"agent_session_id": "s1"})
        assert response.status_code in (400, 404), (route, response.status_code, response.text)
        if NEMO_GYM_VERSION != "0.4.0":
            assert response.status_code == 400 and "/run" in response.json()["detail"], response.text


def test_a_rambling_user_model_is_cut_at_the_default_output_cap(fresh_stack):
    """The agent's default config (as tau2.yaml and the launcher give it) caps each simulated-user message: a user
    model that would write 6,000 tokens is cut at 1,024 (the fake's tokens are bytes) and the episode goes on."""
    fresh_stack.provider.user = say("I need help with my reservation please. " * 150, "###STOP###")
    status, body = fresh_stack.run("airline", "11")
    assert status == 200 and body["status"] == "ok", body
    user_messages = [item["content"] for item in body["response"]["output"] if item.get("role") == "user"]
    assert len(user_messages[0].encode()) == 1024
    assert user_messages[-1] == "###STOP###"


def test_every_number_in_an_answer_is_a_documented_metric_and_the_collectors_keys_stay_out(fresh_stack):
    """NeMo-RL logs every numeric top-level key of a Gym result as a metric (docs/nemo-rl.md lists ours): the row's
    private bookkeeping (NeMo-RL's _rowidx, NeMo-Gym's _ng_*) is not echoed back, and the ending is a flag."""
    status, body = fresh_stack.run("airline", "11", _rowidx=7, _ng_task_index=3, _ng_rollout_index=1, split="test")
    assert status == 200 and body["reward"] == 1.0
    numbers = {key for key, value in body.items() if isinstance(value, (bool, int, float))}
    assert numbers <= METRIC_KEYS, sorted(numbers - METRIC_KEYS)
    assert not {"_rowidx", "_ng_task_index", "_ng_rollout_index", "sample_index"} & set(body)
    assert body["split"] == "test"  # the row's own fields still come back (NeMo-Gym's convention)
    flags = {key: value for key, value in body.items() if key.startswith("termination_") and isinstance(value, bool)}
    assert flags == {key: key == "termination_user_stop" for key in flags} and len(flags) == 6
    assert body["infrastructure_error"] is False
