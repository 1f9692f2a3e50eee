"""Forks on tau2 v0.2.1 (in process), over HTTP to the session's resources server: a live session and a stored
episode's prefix forked in each of airline, retail and telecom, each fork isolated from its siblings and its parent
(``forks_http.check_forks``), a prefix that does not replay refused, and bad input a one-line 4xx."""

import pytest
import requests

from nemo_tau2.tau2_env import domains
from tests.unit.gym.forks_http import check_forks, fork, seeded

TELECOM_TASK = (
    "[mms_issue]airplane_mode_on|bad_network_preference|bad_wifi_calling|break_apn_mms_setting|"
    "break_app_both_permissions|data_mode_off|data_usage_exceeded|unseat_sim_card|user_abroad_roaming_disabled_off"
    "[PERSONA:Hard]"
)  # its last gold action is the user's toggle_roaming (a device write)
TASKS = {"airline": "7", "retail": "0", "telecom": TELECOM_TASK}  # the last gold action writes


def gold_actions(domain: str, task_id: str) -> list[dict]:
    actions = domains.get_task(domain, task_id).evaluation_criteria.actions
    return [action.model_dump(include={"requestor", "name", "arguments"}) for action in actions]


@pytest.mark.parametrize("domain", list(TASKS))
def test_forks_of_a_live_session_and_of_a_stored_prefix_are_isolated(resources_server_url, domain):
    measured = check_forks(resources_server_url, domain, TASKS[domain], gold_actions(domain, TASKS[domain]))
    assert measured["live_fork_s"] < 30 and measured["stored_fork_s"] < 30, measured


def test_bad_fork_requests_get_a_one_line_4xx(resources_server_url):
    url = resources_server_url
    live = seeded(url, "airline", "7")
    stored = {"domain": "airline", "task_id": "7", "tau2_messages": [{"role": "assistant", "content": "Hi"}]}
    cases = [
        (live, {"n": 0}, 400, "n"),
        (live, {"n": 65}, 400, "n"),
        (live, {"n": "two"}, 400, "n"),
        (live, {"n": 1, "tau2_messages": []}, 400, "no tau2_messages"),
        (requests.Session(), {"n": 1}, 404, "no live tau2 session"),
        (requests.Session(), stored | {"n": 1, "turn": 1}, 400, "has 1 assistant turns"),
        (requests.Session(), stored | {"n": 1, "task_id": "no-such-task"}, 404, "no-such-task"),
        (requests.Session(), {"n": 1, "tau2_messages": []}, 400, "domain"),
        (requests.Session(), stored | {"n": 1, "tau2_messages": [{"role": "system"}]}, 400, "not a tau2 message"),
    ]
    for client, body, status, says in cases:
        answer = fork(client, url, body)
        detail = answer.json()["detail"]
        assert (answer.status_code, isinstance(detail, str)) == (status, True), (body, answer.text)
        assert says in detail and "\n" not in detail, (body, detail)
    not_json = live.post(f"{url}/fork", data=b"{", headers={"Content-Type": "application/json"})
    assert not_json.status_code == 400 and "\n" not in not_json.json()["detail"]

    fork_id = fork(live, url, {"n": 1}).json()["fork_ids"][0]
    adopter, key = requests.Session(), {"Idempotency-Key": "adopt-1"}
    assert adopter.post(f"{url}/adopt_fork", json={"fork_id": fork_id}, headers=key).status_code == 200
    again = requests.Session().post(f"{url}/adopt_fork", json={"fork_id": fork_id})  # a fork is adopted once
    assert again.status_code == 404 and "no unadopted live fork" in again.json()["detail"]
    other = requests.Session().post(f"{url}/adopt_fork", json={"fork_id": fork_id}, headers={"Idempotency-Key": "2"})
    assert other.status_code == 404, other.text
    retried = requests.Session()  # its first answer (and cookie) lost: the retry with its key gets both
    assert retried.post(f"{url}/adopt_fork", json={"fork_id": fork_id}, headers=key).json() == {"fork_id": fork_id}
    assert retried.post(f"{url}/get_user_details", json={"user_id": "mia_li_3668"}).status_code == 200
    unknown = requests.Session().post(f"{url}/adopt_fork", json={"fork": fork_id})
    assert unknown.status_code == 400 and "fork_id" in unknown.json()["detail"]


def test_a_retried_fork_gets_the_same_forks_and_a_reused_key_is_a_409(resources_server_url):
    """``/fork`` with an ``Idempotency-Key`` runs once: the retry's answer is the first one (the same fork ids, marked
    as a replay), so a client retrying after a lost answer never leaves a second set of episodes behind."""
    url, live = resources_server_url, seeded(resources_server_url, "airline", "7")
    headers = {"Idempotency-Key": "fork-retry-1"}
    first = live.post(f"{url}/fork", json={"n": 2}, headers=headers, timeout=60)
    again = live.post(f"{url}/fork", json={"n": 2}, headers=headers, timeout=60)
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert again.json()["fork_ids"] == first.json()["fork_ids"] and again.headers.get("X-Idempotent-Replay") == "1"
    other = live.post(f"{url}/fork", json={"n": 3}, headers=headers, timeout=60)
    assert other.status_code == 409 and "fork-retry-1" in other.json()["detail"], other.text
    fresh = live.post(f"{url}/fork", json={"n": 2}, headers={"Idempotency-Key": "fork-retry-2"}, timeout=60)
    assert set(fresh.json()["fork_ids"]).isdisjoint(first.json()["fork_ids"])
