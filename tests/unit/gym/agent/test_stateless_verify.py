"""A stored episode re-scored without its session (tau2 v0.2.1): the agent's answer, posted back to the resources
server's ``/verify`` as NeMo-Gym's reverify posts a stored rollout, gets the live verdict again; a stored episode
that cannot be re-scored is refused with its reason."""

import asyncio
import copy

import pytest
import requests

from nemo_tau2.gym.stack import RESOURCES_SERVER
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.gym_rows import task_row
from nemo_tau2.testing import PolicyScriptConfig
from nemo_tau2.testing.scripts import Turn, TurnListScript

VERDICT = (
    "reward",
    "success",
    "termination_reason",
    "db_match",
    "action_match_fraction",
    "write_action_match_fraction",
    "env_assertion_fraction",
    "communicate_fraction",
    "reward_info",
)


@pytest.fixture(scope="module")
def stored(stack):
    """Stored episodes of every kind: oracle (airline, retail, telecom with the user's device calls), a wrong write
    argument (reward 0), a hallucinated tool and a malformed call (each ending normally)."""
    stack.fake.reset()
    stack.fake.set_tau2_scripts()
    episodes = asyncio.run(stack.run_many([("airline", "11", {}), ("retail", "5", {}), ("telecom", _telecom(), {})]))
    stack.fake.set_tau2_scripts(policy=PolicyScriptConfig(variant="wrong_argument"))
    episodes += asyncio.run(stack.run_many([("airline", "2", {})]))
    stack.fake.set_tau2_scripts()
    for first in (Turn.call("launch_rocket", {}), Turn.say('<tool_call>{"name": "get_user_details", "argu')):
        stack.provider.policy = TurnListScript([first, Turn.say("Is there anything else I can help with?")])
        episodes.append(stack.run("airline", "11"))
    stack.provider.policy = None
    assert all(status == 200 and body["status"] == "ok" for status, body in episodes)
    return stack.servers.url(RESOURCES_SERVER), [body for _, body in episodes]


def _telecom() -> str:
    return domains.get_tasks("telecom", "base")[0].id


def verify(url: str, body: dict) -> requests.Response:
    return requests.post(f"{url}/verify", json=body, timeout=60)  # no cookie: no session


def test_every_stored_episode_gets_its_live_verdict_again(stored):
    url, episodes = stored
    assert {body["reward"] for body in episodes} == {0.0, 1.0}
    assert any(
        c["requestor"] == "user" for b in episodes for m in b["tau2_messages"] for c in m.get("tool_calls") or []
    )
    for body in episodes:
        again = verify(url, body)
        assert again.status_code == 200, again.text
        assert {key: again.json()[key] for key in VERDICT} == {key: body[key] for key in VERDICT}, body["task_id"]
    assert requests.get(f"{url}/reverify_mode", timeout=30).json() == "stateless"


def test_nemo_gym_reverifys_payload_the_row_and_the_stored_response_gets_the_verdict_again(stored):
    """NeMo-Gym 0.7.0's ``gym eval reverify`` posts each materialized input row with the rollout's ``response``
    (``_build_verify_payload``): the response carries the trajectory in its ``metadata``."""
    url, episodes = stored
    for body in episodes:
        payload = task_row(body["domain"], body["task_id"]) | {"_ng_task_index": 0, "response": body["response"]}
        again = verify(url, payload)
        assert again.status_code == 200, again.text[-300:]
        assert {key: again.json()[key] for key in VERDICT} == {key: body[key] for key in VERDICT}, body["task_id"]


def _edited(body: dict, edit) -> dict:
    body = copy.deepcopy(body)
    edit(body)
    return body


def _answer_changed(body: dict) -> None:
    answer = next(m for m in body["tau2_messages"] if m["role"] == "tool" and not m["error"])
    answer["content"] = answer["content"].replace("1", "2") + " "


def _answer_dropped(body: dict) -> None:
    messages = body["tau2_messages"]
    messages.remove(next(m for m in messages if m["role"] == "tool"))


@pytest.mark.parametrize(
    ("edit", "status", "reason"),
    [
        (lambda b: b.pop("tau2_messages") and b["response"].pop("metadata"), 404, "no live tau2 session"),
        (lambda b: b.pop("task_id"), 400, "needs the row's domain and task_id (task_id: Field required)"),
        (lambda b: b.update(tau2_version="v1.0.1"), 400, "the row is of tau2 v1.0.1"),
        (lambda b: b.update(task_id="no-such-task"), 404, "no-such-task"),
        (_answer_dropped, 400, "have no answer"),
        (lambda b: b.update(tau2_messages="torn"), 422, "tau2_messages"),  # the request's own schema
        (lambda b: b.update(tau2_messages=[{"role": "robot"}]), 400, "is not a tau2 message"),
        (_answer_changed, 400, "on replay where the trajectory recorded"),
    ],
    ids=[
        "no trajectory",
        "no task",
        "other release",
        "unknown task",
        "unanswered",
        "not a list",
        "bad role",
        "edited",
    ],
)
def test_a_stored_episode_that_cannot_be_rescored_is_refused_with_its_reason(stored, edit, status, reason):
    url, episodes = stored
    refused = verify(url, _edited(episodes[0], edit))
    assert refused.status_code == status and reason in refused.text, refused.text[-300:]
