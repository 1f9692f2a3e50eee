"""tau2 keys, the oracle's turns and the scripted user's reactions, without HTTP."""

import pytest

from nemo_tau2.tau2_env import domains
from nemo_tau2.testing import (
    STOP,
    TRANSFER,
    ScriptedUser,
    ScriptError,
    ScriptRequest,
    Tau2Key,
    Tau2ScriptProvider,
    Turn,
    UserScriptConfig,
    device_action_request,
    parse_device_action,
    tau2_key,
)
from nemo_tau2.testing.tau2_scripts import OUT_OF_SCOPE, closing_text, oracle_turns, wrong_argument_turns

TELECOM_TASK = domains.get_tasks("telecom", "base")[0]


def test_stop_tokens_match_tau2():
    from tau2.user import base

    assert (STOP, TRANSFER, OUT_OF_SCOPE) == (base.STOP, base.TRANSFER, base.OUT_OF_SCOPE)


def test_key_round_trips_with_pipes_in_the_task_id():
    assert "|" in TELECOM_TASK.id
    key = tau2_key("telecom", TELECOM_TASK.id, 7, "user")
    parsed = Tau2Key.parse(key)
    assert parsed == Tau2Key("telecom", TELECOM_TASK.id, "7", "user") and str(parsed) == key
    assert parsed.sample_index == 7
    assert Tau2Key.parse("other|x") is None


@pytest.mark.parametrize(
    "key, problem",
    [("tau2|airline|0|ep", "malformed tau2 key"), ("tau2|airline|0|ep|judge", "has role 'judge'")],
)
def test_malformed_tau2_keys_are_named(key, problem):
    with pytest.raises(ScriptError, match=problem):
        Tau2Key.parse(key)


def test_tau2_key_rejects_pipes_where_they_cannot_be_parsed():
    with pytest.raises(ValueError, match="episode_id 'a|b' must be non-empty and must not contain"):
        tau2_key("airline", "0", "a|b", "policy")


@pytest.mark.parametrize("episode_id, index", [("12", 12), ("ep-3", 3), ("rollout_0", 0), ("abc", None)])
def test_sample_index_is_the_trailing_integer(episode_id, index):
    assert Tau2Key("airline", "0", episode_id, "policy").sample_index == index


def test_unknown_task_is_a_script_error():
    with pytest.raises(ScriptError, match="has no task 'nope'"):
        Tau2ScriptProvider().script_for(tau2_key("airline", "nope", 0, "policy"))


def test_oracle_turns_follow_gold_actions_and_close_with_communicate_info():
    task = domains.get_task("airline", "14")
    turns = oracle_turns(task)
    actions = task.evaluation_criteria.actions
    assert [turn.tool_calls[0].name for turn in turns[:-1]] == [action.name for action in actions]
    closing = turns[-1].text
    assert closing == closing_text(task) and "anything else" in closing
    assert all(info in closing for info in task.evaluation_criteria.communicate_info)


def test_oracle_asks_the_user_for_device_actions():
    turns = oracle_turns(TELECOM_TASK)
    first = TELECOM_TASK.evaluation_criteria.actions[0]
    assert first.requestor == "user" and turns[0].tool_calls == ()
    assert parse_device_action(turns[0].text) == (first.name, first.arguments)


def test_wrong_argument_changes_exactly_one_write_call():
    task = domains.get_task("retail", "2")
    good, bad = oracle_turns(task), wrong_argument_turns("retail", task)
    changed = [index for index, (a, b) in enumerate(zip(good, bad, strict=True)) if a != b]
    assert len(changed) == 1
    assert good[changed[0]].tool_calls[0].name == bad[changed[0]].tool_calls[0].name


def _user(config: UserScriptConfig | None = None) -> ScriptedUser:
    return ScriptedUser("telecom", TELECOM_TASK, config or UserScriptConfig())


def _respond(user: ScriptedUser, messages: list[dict], turn_index: int = 1, tools: list[dict] | None = None) -> Turn:
    """As the agent asks the user's model: the episode's user tools offered (telecom's device tools by default)."""
    offered = TELECOM_USER_TOOLS if tools is None else tools
    return user.respond(ScriptRequest("k", [{"role": "system", "content": "s"}, *messages], offered, turn_index))


TELECOM_USER_TOOLS = [{"type": "function", "function": {"name": name}} for name in domains.user_tool_names("telecom")]


def test_scripted_user_calls_only_a_tool_its_request_offers():
    ask = [{"role": "user", "content": device_action_request("toggle_wifi", {})}]
    assert _respond(_user(), ask) == Turn.call("toggle_wifi", {})
    assert _respond(_user(), ask, tools=[]).text == "I can't do 'toggle_wifi' on my phone. ###STOP###"


def test_scripted_user_opens_with_the_reason_for_calling():
    turn = _respond(_user(), [{"role": "user", "content": "Hi! How can I help you today?"}], turn_index=0)
    assert turn.text.startswith("Hi! You are unable to send MMS messages")


def test_scripted_user_performs_marked_device_actions_and_reports():
    user = _user()
    ask = {"role": "user", "content": device_action_request("toggle_airplane_mode", {})}
    assert _respond(user, [ask]) == Turn.call("toggle_airplane_mode", {})
    done = [ask, {"role": "assistant", "content": None}, {"role": "tool", "content": "Airplane mode is off."}]
    assert _respond(user, done).text == "Done."
    failed = [ask, {"role": "assistant", "content": None}, {"role": "tool", "content": "Error: no such thing"}]
    assert _respond(user, failed).text == "I tried, but my device says: Error: no such thing"


@pytest.mark.parametrize(
    "agent_text, expected",
    [
        (device_action_request("launch_rocket", {}), "I can't do 'launch_rocket' on my phone. ###STOP###"),
        ("Please do <action>{not json</action>", "the action marker is not JSON"),
        ("Is there anything else I can help you with?", STOP),
        ("I am transferring you to a human agent.", TRANSFER),
    ],
)
def test_scripted_user_reacts_to_agent_messages(agent_text, expected):
    assert expected in _respond(_user(), [{"role": "user", "content": agent_text}]).text


def test_scripted_user_reads_content_parts():
    ask = {"role": "user", "content": [{"type": "text", "text": device_action_request("toggle_wifi", {})}]}
    assert _respond(_user(), [ask]) == Turn.call("toggle_wifi", {})


def test_scripted_user_gives_up_after_unrecognised_requests():
    user = _user(UserScriptConfig(max_unrecognised=1, ending=OUT_OF_SCOPE))
    first = _respond(user, [{"role": "user", "content": "What is your favourite colour?"}])
    assert first.text.startswith("Sorry, I don't understand") and "John Smith" in first.text
    again = [
        {"role": "user", "content": "What is your favourite colour?"},
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "Tell me your favourite colour."},
    ]
    assert _respond(user, again).text == OUT_OF_SCOPE
