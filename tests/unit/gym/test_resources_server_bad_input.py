"""Bad input gets a clear error: tool mistakes as tau2 phrases them (the episode goes on), protocol misuse as a 4xx."""

import time

import pytest
import requests
from tau2.data_model.message import ToolCall

from nemo_tau2.gym.launch import GymServers
from nemo_tau2.gym.resources_server.bodies import verify_body
from nemo_tau2.tau2_env import domains
from tests.unit.gym.conftest import RESOURCES_SERVER, resources_server_spec

# Long enough for the bound test's 16 seeds in a row to stay live on a loaded box (at 1.5 s, three times slower
# seeds than on a quiet one would let the first expire and the 17th seed pass the bound)
IDLE_TIMEOUT_S = 5.0
MAX_SESSIONS = 16
MAX_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def server_url():
    spec = resources_server_spec(
        domains=["airline", "telecom"],
        session_idle_timeout_s=IDLE_TIMEOUT_S,
        max_live_sessions=MAX_SESSIONS,
        max_request_bytes=MAX_BYTES,
    )
    with GymServers([spec]) as servers:
        yield servers.url(RESOURCES_SERVER)


def _seeded(url: str, domain: str = "airline", task_id: str = "1") -> requests.Session:
    session = requests.Session()
    response = session.post(f"{url}/seed_session", json={"domain": domain, "task_id": task_id})
    assert response.status_code == 200, response.text
    return session


def _tau2_says(domain: str, name: str, arguments: dict, requestor: str = "assistant") -> str:
    """The tool message tau2's own environment gives for the same call."""
    env = domains.environment_constructor(domain)()
    return env.get_response(ToolCall(id="", name=name, arguments=arguments, requestor=requestor)).content


def test_tool_call_without_a_session_is_a_404_that_says_to_seed(server_url):
    response = requests.post(f"{server_url}/get_user_details", json={"user_id": "x"})
    assert response.status_code == 404
    assert "call /seed_session first" in response.json()["detail"]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"domain": "banking", "task_id": "1"}, "unknown domain 'banking'"),
        ({"domain": "airline", "task_id": "no-such-task"}, "has no task 'no-such-task'"),
    ],
)
def test_seed_with_unknown_domain_or_task_is_a_404_naming_it(server_url, body, expected):
    response = requests.post(f"{server_url}/seed_session", json=body)
    assert response.status_code == 404
    assert expected in response.json()["detail"]


def test_seed_without_task_id_is_a_422_naming_the_field(server_url):
    response = requests.post(f"{server_url}/seed_session", json={"domain": "airline"})
    assert response.status_code == 422
    assert "task_id" in response.text


def test_unknown_tool_is_a_tool_error_phrased_like_tau2(server_url):
    response = _seeded(server_url).post(f"{server_url}/fly_me_to_the_moon", json={})
    assert response.status_code == 200
    assert response.headers["X-Tau2-Tool-Error"] == "1"
    assert (
        response.text
        == _tau2_says("airline", "fly_me_to_the_moon", {})
        == "Error: Tool 'fly_me_to_the_moon' not found."
    )


@pytest.mark.parametrize(
    "arguments",
    [{"user_id": "mia_li_3668", "shoe_size": 42}, {}, {"user_id": 12345}],
    ids=["unexpected-argument", "missing-argument", "wrong-type"],
)
def test_arguments_that_do_not_fit_the_schema_get_tau2s_answer(server_url, arguments):
    response = _seeded(server_url).post(f"{server_url}/get_user_details", json=arguments)
    assert response.status_code == 200
    assert response.headers["X-Tau2-Tool-Error"] == "1"
    assert response.text == _tau2_says("airline", "get_user_details", arguments)
    assert response.text.startswith("Error: ")


def test_arguments_that_are_not_an_object_are_a_tool_error(server_url):
    response = _seeded(server_url).post(f"{server_url}/get_user_details", json=["mia_li_3668"])
    assert response.status_code == 200
    assert response.headers["X-Tau2-Tool-Error"] == "1"
    assert response.text == "Error: Tool arguments must be a JSON object, got list."


def test_malformed_json_is_a_400(server_url):
    response = _seeded(server_url).post(
        f"{server_url}/get_user_details", data=b'{"user_id": ', headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["detail"]


def test_huge_payload_is_a_413_naming_the_limit(server_url):
    session = _seeded(server_url)
    response = session.post(f"{server_url}/get_user_details", json={"user_id": "x" * (MAX_BYTES + 1)})
    assert response.status_code == 413
    assert f"limit of {MAX_BYTES} bytes" in response.json()["detail"]
    # Chunked (no Content-Length) uploads are stopped too.
    chunks = (b"x" * 8192 for _ in range(MAX_BYTES // 8192 + 2))
    response = session.post(f"{server_url}/seed_session", data=chunks, headers={"Content-Type": "application/json"})
    assert response.status_code == 413


def test_user_device_tools_have_their_own_routes_and_are_not_agent_tools(server_url):
    task_id = domains.get_tasks("telecom", "base")[0].id
    session = _seeded(server_url, "telecom", task_id)
    as_agent = session.post(f"{server_url}/toggle_airplane_mode", json={})
    assert as_agent.headers["X-Tau2-Tool-Error"] == "1"
    assert as_agent.text == "Error: Tool 'toggle_airplane_mode' not found."
    as_user = session.post(f"{server_url}/user_tools/toggle_airplane_mode", json={})
    assert as_user.headers["X-Tau2-Tool-Error"] == "0"
    seed = session.post(f"{server_url}/seed_session", json={"domain": "telecom", "task_id": task_id}).json()
    assert "toggle_airplane_mode" in {tool["name"] for tool in seed["user_tools"]}
    airline_user = _seeded(server_url).post(f"{server_url}/user_tools/toggle_airplane_mode", json={})
    assert airline_user.text == _tau2_says("airline", "toggle_airplane_mode", {}, requestor="user")


def test_verify_rejects_an_unknown_termination_reason_and_keeps_the_session_for_a_corrected_verify(server_url):
    session = _seeded(server_url)
    body = verify_body([], termination_reason="got_bored")
    response = session.post(f"{server_url}/verify", json=body)
    assert response.status_code == 400
    assert "unknown termination_reason 'got_bored'" in response.json()["detail"]
    again = session.post(f"{server_url}/verify", json=body | {"termination_reason": "user_stop"})
    assert again.status_code == 200  # the session ends only once an answer is built
    after = session.post(f"{server_url}/get_user_details", json={"user_id": "x"})
    assert after.status_code == 404 and "already verified" in after.json()["detail"]


def test_idle_sessions_expire_and_the_live_count_is_bounded(server_url):
    session = _seeded(server_url)
    time.sleep(IDLE_TIMEOUT_S + 0.3)
    assert session.post(f"{server_url}/get_user_details", json={"user_id": "x"}).status_code == 404
    assert requests.get(f"{server_url}/session_stats").json()["live_sessions"] == 0
    sessions = [_seeded(server_url) for _ in range(MAX_SESSIONS)]
    response = requests.post(f"{server_url}/seed_session", json={"domain": "airline", "task_id": "1"})
    assert response.status_code == 503
    assert "max_live_sessions" in response.json()["detail"]
    assert len(sessions) == MAX_SESSIONS


def test_server_survives_all_of_it(server_url):
    assert requests.get(f"{server_url}/").json() == {"status": "ok"}
