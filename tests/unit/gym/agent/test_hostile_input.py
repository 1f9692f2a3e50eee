"""Every malformed input is a 4xx or a tool error, never a 500: lone surrogates, non-standard literals and huge
integers in tool arguments (a model mistake: a tau2-style tool error, the episode goes on, its session ends),
JSON nested past the documented depth limit (400 naming ``max_json_depth``) at the resources server, the agent and
the model server, and ``/verify`` that keeps the session until its answer is built."""

import json

import pytest
import requests

from nemo_tau2.gym.launch import GymServers
from nemo_tau2.gym.resources_server.bodies import verify_body
from nemo_tau2.gym.stack import POLICY_MODEL, RESOURCES_SERVER, ModelEndpoint, model_server_spec
from nemo_tau2.request_guard import MAX_JSON_DEPTH
from nemo_tau2.tau2_env.gym_rows import task_row
from nemo_tau2.testing import Turn, TurnListScript
from tests.unit.gym.agent.conftest import say

JSON = {"Content-Type": "application/json"}
TELECOM_TASK = "[mobile_data_issue]airplane_mode_on|data_mode_off[PERSONA:None]"


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _nested(depth: int) -> list:
    value: list = ["x"]
    for _ in range(depth - 1):
        value = [value]
    return value


def _resources(stack) -> str:
    return stack.servers.url(RESOURCES_SERVER)


def _seeded(url: str, domain: str = "airline", task_id: str = "0") -> requests.Session:
    session = requests.Session()
    session.post(f"{url}/seed_session", json={"domain": domain, "task_id": task_id}).raise_for_status()
    return session


def _live_sessions(stack) -> int:
    return requests.get(_resources(stack) + "/session_stats").json()["live_sessions"]


# ---------------------------------------------------------------- the resources server, directly


@pytest.mark.parametrize(
    ("route", "body", "where"),
    [
        ("/get_user_details", rb'{"user_id": "mia\ud800"}', "arguments.user_id"),
        ("/get_user_details", rb'{"user\udc00": "x"}', "arguments (a key)"),
        ("/book_reservation", rb'{"passengers": [{"first_name": "\udfff"}]}', "arguments.passengers[0].first_name"),
        ("/no_such_%ED%A0%80_tool", rb"{}", None),
    ],
    ids=["value", "key", "nested", "in-the-url"],
)
def test_a_lone_surrogate_in_a_tool_call_is_a_tool_error_and_the_episode_goes_on(fresh_stack, route, body, where):
    url = _resources(fresh_stack)
    session = _seeded(url)
    response = session.post(url + route, data=body, headers=JSON)
    assert response.status_code == 200, response.text
    assert response.headers["X-Tau2-Tool-Error"] == "1" and response.text.startswith("Error: ")
    if where is not None:
        assert f"Tool call {where} holds a lone UTF-16 surrogate" in response.text
    after = session.post(f"{url}/get_user_details", json={"user_id": "mia_li_3668"})
    assert after.status_code == 200 and after.headers["X-Tau2-Tool-Error"] == "0"
    verdict = session.post(f"{url}/verify", json=verify_body(["Done."]))
    assert verdict.status_code == 200 and verdict.json()["num_tool_errors"] == 1


def test_a_lone_surrogate_in_a_user_device_tool_call_is_a_tool_error(fresh_stack):
    url = _resources(fresh_stack)
    session = _seeded(url, "telecom", TELECOM_TASK)
    response = session.post(
        f"{url}/user_tools/set_network_mode_preference", data=rb'{"mode": "4g\ud800"}', headers=JSON
    )
    assert response.status_code == 200 and response.headers["X-Tau2-Tool-Error"] == "1"
    assert "Tool call arguments.mode holds a lone UTF-16 surrogate" in response.text
    session.post(f"{url}/end_session", json={})


@pytest.mark.parametrize("route", ["/get_user_details", "/user_tools/toggle_airplane_mode", "/seed_session"])
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1000, 100_000])
def test_json_deeper_than_the_limit_is_a_400_naming_it_on_a_tool_route(fresh_stack, route, depth):
    url = _resources(fresh_stack)
    session = _seeded(url)
    response = session.post(url + route, data=b'{"user_id": ' + _deep(depth) + b"}", headers=JSON)
    assert response.status_code == 400
    assert f"deeper than {MAX_JSON_DEPTH}" in response.json()["detail"] and "max_json_depth" in response.text
    assert session.post(f"{url}/get_user_details", json={"user_id": "x"}).status_code == 200  # session lives on
    session.post(f"{url}/end_session", json={})


def test_nesting_up_to_the_limit_is_accepted(fresh_stack):
    url = _resources(fresh_stack)
    session = _seeded(url)
    response = session.post(f"{url}/get_user_details", data=b'{"user_id": ' + _deep(MAX_JSON_DEPTH - 1) + b"}")
    assert response.status_code == 200 and response.headers["X-Tau2-Tool-Error"] == "1"  # tau2: wrong type
    session.post(f"{url}/end_session", json={})


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda body: body.replace(b'"Done."', b'"Done.\\ud800"'), "lone UTF-16 surrogate escape"),
        (lambda body: body.replace(b'"Done."', b'"' + b"[" * 1000 + b"]" * 1000 + b'"'), None),  # in a string: fine
        (lambda body: body.replace(b'"Done."', _deep(1000)), f"deeper than {MAX_JSON_DEPTH}"),
        (lambda body: body.replace(b'"user_stop"', b"NaN"), "non-standard literal NaN"),
        (lambda body: body.replace(b'"Done."', b'"\xff"'), "not UTF-8"),
    ],
    ids=["lone-surrogate", "brackets-in-a-string", "deep", "nan", "bad-utf8"],
)
def test_a_malformed_verify_is_a_400_and_the_session_waits_for_a_good_one(fresh_stack, damage, problem):
    url = _resources(fresh_stack)
    session = _seeded(url)
    good = json.dumps(verify_body(["Done."])).encode()
    response = session.post(f"{url}/verify", data=damage(good), headers=JSON)
    if problem is None:
        assert response.status_code == 200
        return
    assert response.status_code == 400 and problem in response.json()["detail"]
    assert session.post(f"{url}/verify", data=good, headers=JSON).status_code == 200  # not a 404: still there


def test_verify_keeps_the_session_when_building_its_answer_fails(fresh_stack):
    url = _resources(fresh_stack)
    session = _seeded(url)
    failed = session.post(f"{url}/verify", json=verify_body(["Done."], termination_reason="bored"))
    assert failed.status_code == 400
    retried = session.post(f"{url}/verify", json=verify_body(["Done."]))
    assert retried.status_code == 200 and "reward" in retried.json()


# ---------------------------------------------------------------- the agent and the model server


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"user_id": "mia\ud800"}, "cannot be sent as JSON"),
        ({"user_id": 2**70}, "cannot be sent as JSON"),
        ({"user_id": _nested(MAX_JSON_DEPTH + 5)}, "max_json_depth"),
    ],
    ids=["lone-surrogate", "huge-integer", "too-deep"],
)
def test_a_policy_call_the_servers_cannot_take_is_a_tool_error_and_the_episode_is_scored(
    fresh_stack, arguments, error
):
    fresh_stack.provider.policy = TurnListScript(
        [Turn.call("get_user_details", arguments), Turn.say("Is there anything else?")]
    )
    fresh_stack.provider.user = say("Hi, I need help.", "###STOP###")
    status, body = fresh_stack.run("airline", "0")
    assert status == 200 and body["status"] == "ok", body
    (output,) = [item["output"] for item in body["response"]["output"] if item["type"] == "function_call_output"]
    assert output.startswith("Error: ") and error in output
    assert body["num_tool_errors"] == 1 and "reward" in body
    assert _live_sessions(fresh_stack) == 0


def test_a_policy_writing_a_deeply_nested_text_gets_it_sent_to_the_user(fresh_stack):
    fresh_stack.provider.policy = TurnListScript([Turn.say("[" * 20_000), Turn.say("Anything else?")])
    fresh_stack.provider.user = say("Hi.", "No.", "###STOP###")
    status, body = fresh_stack.run("airline", "0")
    assert status == 200 and body["status"] == "ok"
    assert _live_sessions(fresh_stack) == 0


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda row: row | {"task_id": "0\ud800"}, "lone UTF-16 surrogate"),
        (lambda row: row | {"extra": _nested(MAX_JSON_DEPTH + 5)}, "max_json_depth"),
        (lambda row: row | {"extra": 2**70}, "cannot be passed on as JSON"),
        (lambda row: row | {"task_id": "no-such-task"}, "has no task 'no-such-task'"),
        (lambda row: row | {"sample_index": "first"}, "sample_index"),
        (lambda row: row | {"_ng_rollout_index": 10**12}, "_ng_rollout_index"),
    ],
    ids=["lone-surrogate", "deep", "huge-integer", "unknown-task", "bad-sample-index", "huge-rollout-index"],
)
def test_a_bad_row_is_a_4xx_from_the_agent_and_leaves_no_session(fresh_stack, damage, problem):
    row = damage(task_row("airline", "0"))
    response = requests.post(fresh_stack.agent_url + "/run", data=json.dumps(row).encode(), headers=JSON, timeout=120)
    assert 400 <= response.status_code < 500, response.text
    assert problem in response.text
    assert _live_sessions(fresh_stack) == 0


def test_fast_vllm_model_refuses_json_deeper_than_the_limit_naming_it(fresh_stack):
    endpoint = ModelEndpoint([fresh_stack.fake.base_url], "fake-policy", server="fast_vllm_model")
    with GymServers([model_server_spec(POLICY_MODEL, endpoint)]) as servers:
        url = servers.url(POLICY_MODEL)
        for route in ("/v1/responses", "/v1/chat/completions", "/v1/messages"):
            response = requests.post(url + route, data=b'{"input": ' + _deep(5000) + b"}", headers=JSON)
            assert response.status_code == 400 and "max_json_depth" in response.text, route
            response = requests.post(url + route, data=b'{"input": "\\ud800"}', headers=JSON)
            assert response.status_code == 400 and "lone UTF-16 surrogate" in response.text, route
