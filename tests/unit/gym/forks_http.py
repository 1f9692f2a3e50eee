"""Forks over HTTP against a running resources server (either release): the scenario both releases' tests play.

A task whose last gold action ``W`` is a write that answers otherwise the second time (a cancelled reservation, an
exchanged order, a toggled setting) shows a fork's state by ``W``'s answer: its first answer in a state without it,
its second in a state with it.
"""

import copy
import json
import time

import requests

from nemo_tau2.pivots.candidates import policy_items
from nemo_tau2.tau2_release.trajectory import Trajectory


def seeded(url: str, domain: str, task_id: str) -> requests.Session:
    http = requests.Session()
    answer = http.post(f"{url}/seed_session", json={"domain": domain, "task_id": task_id}, timeout=120)
    assert answer.status_code == 200, answer.text
    return http


def play(http: requests.Session, url: str, action: dict, call_id: str = "") -> dict:
    """One gold action (``requestor``, ``name``, ``arguments``): its answer as ``{"content", "error"}``."""
    user = action.get("requestor", "assistant") == "user"
    route = f"/user_tools/{action['name']}" if user else f"/{action['name']}"
    answer = http.post(url + route, json=action["arguments"], headers={"X-Tool-Call-Id": call_id}, timeout=120)
    assert answer.status_code == 200, answer.text
    return {"content": answer.text, "error": answer.headers["X-Tau2-Tool-Error"] == "1"}


VERDICT_KEYS = ("reward", "db_match", "action_match_fraction", "env_assertion_fraction", "communicate_fraction",
                "num_tool_calls")  # fmt: skip


def verify_body(row: dict, messages: list[dict]) -> dict:
    """A ``/verify`` of the trajectory ``messages`` ended by the user: its texts as the policy saw them (what v0.2.1's
    live verdict reads), its messages (what a re-scoring and v1.0.1 read)."""
    return row | {
        "tau2_messages": messages, "termination_reason": "user_stop",
        "responses_create_params": {"input": policy_items(messages)},
        "response": {"id": "r", "created_at": 0, "model": "m", "object": "response", "output": [],
                     "parallel_tool_calls": True, "tool_choice": "auto", "tools": []},
    }  # fmt: skip


def fork(http: requests.Session, url: str, body: dict) -> requests.Response:
    return http.post(f"{url}/fork", json=body, timeout=300)


def adopted(url: str, answer: requests.Response) -> list[requests.Session]:
    """A new client for each fork of ``answer``, its cookie the fork's session."""
    assert answer.status_code == 200, answer.text
    clients = []
    for fork_id in answer.json()["fork_ids"]:
        client = requests.Session()
        assert client.post(f"{url}/adopt_fork", json={"fork_id": fork_id}).status_code == 200
        clients.append(client)
    return clients


def trajectory_of(actions: list[dict], answers: list[dict]) -> Trajectory:
    """tau2's messages for the greeting, the user's request, then each action and its answer."""
    trajectory = Trajectory()
    trajectory.text("assistant", "Hi! How can I help you today?")
    trajectory.text("user", "Please help me.")
    for index, (action, answer) in enumerate(zip(actions, answers, strict=True)):
        trajectory.tool_call(action.get("requestor", "assistant"), f"c{index}", action["name"], action["arguments"],
                             answer)  # fmt: skip
    return trajectory


def check_forks(url: str, domain: str, task_id: str, actions: list[dict]) -> dict:
    """The scenario (see the module docstring); what it measured: seconds per fork request."""
    *prefix, write = actions
    parent = seeded(url, domain, task_id)
    answers = [play(parent, url, action, f"p{index}") for index, action in enumerate(prefix)]
    started = time.perf_counter()
    first, second = adopted(url, fork(parent, url, {"n": 2}))
    live_fork_s = time.perf_counter() - started

    once, twice = play(first, url, write), play(first, url, write)
    assert once != twice, f"{write['name']} answers alike twice: it shows nothing"
    assert play(second, url, write) == once, "a sibling saw the first fork's write"
    assert play(parent, url, write) == once, "the parent saw its fork's write"
    (after_write,) = adopted(url, fork(parent, url, {"n": 1}))
    assert play(after_write, url, write) == twice, "a fork of the parent after its write does not hold it"

    trajectory = trajectory_of(prefix, answers)
    trajectory.text("assistant", "One moment.")  # the turn the stored episode is forked before
    turn = sum(message["role"] == "assistant" for message in trajectory.messages) - 1
    trajectory.tool_call(write.get("requestor", "assistant"), "w", write["name"], write["arguments"], once)
    row = {"domain": domain, "task_id": task_id}
    started = time.perf_counter()
    stored = fork(requests.Session(), url, row | {"n": 1, "tau2_messages": trajectory.messages, "turn": turn})
    stored_fork_s = time.perf_counter() - started
    assert stored.status_code == 200, stored.text
    assert stored.json()["tau2_messages"] == trajectory.messages[:-3]  # before "One moment." and the W call
    assert stored.json()["num_tool_calls"] == len(prefix)
    assert stored.json()["user_system_prompt"] and isinstance(stored.json()["user_tools"], list)  # a user plays on
    (rebuilt,) = adopted(url, stored)
    assert play(rebuilt, url, write) == once, "a fork of the stored prefix is not in the prefix's state"
    # played on to the last gold action, the adopted fork scores as tau2 re-scores its trajectory without a session
    # (pivot_text_reward: continue's path): the whole gold state, on both releases
    live = rebuilt.post(f"{url}/verify", json=verify_body(row, trajectory.messages), timeout=300)
    rescored = requests.post(f"{url}/verify", json=verify_body(row, trajectory.messages), timeout=300)
    assert live.status_code == rescored.status_code == 200, (live.text, rescored.text)
    verdicts = [{key: answer.json().get(key) for key in VERDICT_KEYS} for answer in (live, rescored)]
    assert verdicts[0] == verdicts[1], verdicts
    assert 1.0 in (verdicts[0]["db_match"], verdicts[0]["env_assertion_fraction"]), verdicts[0]

    tampered = copy.deepcopy(trajectory.messages)
    tampered[3]["content"] = "an answer this release never gave"  # the first call's answer (tau2_messages[3])
    refused = fork(requests.Session(), url, row | {"n": 1, "tau2_messages": tampered, "turn": turn})
    assert refused.status_code == 400, refused.text
    detail = refused.json()["detail"]
    assert "cannot be forked" in detail and "tau2_messages[2]" in detail and "assistant turn" in detail, detail
    assert "\n" not in detail
    return {"live_fork_s": live_fork_s, "stored_fork_s": stored_fork_s}


def pivot_body(domain: str, task_id: str, prefix: list[dict], expected: dict, calls: list[dict]) -> dict:
    """A ``/verify_pivot`` body: the pivot row (its state: ``prefix``) and a response making ``calls``."""
    output = [{"type": "function_call", "name": call["name"], "arguments": json.dumps(call["arguments"]),
               "call_id": f"s{index}", "id": f"s{index}"} for index, call in enumerate(calls)]  # fmt: skip
    return {
        "domain": domain, "task_id": task_id, "tau2_messages": prefix, "expected_action": expected,
        "responses_create_params": {"input": []},
        "response": {"id": "r", "created_at": 0, "model": "m", "object": "response", "output": output,
                     "parallel_tool_calls": True, "tool_choice": "auto", "tools": []},
    }  # fmt: skip


def check_gold_pivots(url: str, domain: str, task_id: str, actions: list[dict], mutated: dict[int, dict]) -> dict:
    """Every assistant gold action of the task, at the pivot before it (the gold trajectory so far, played live for
    its answers), scores 1 against itself; each ``mutated[index]`` (other arguments for action ``index``, which
    write another state) scores 0 as ``different_state``. Returns the verdicts' categories by action index."""
    session = seeded(url, domain, task_id)
    answers = [play(session, url, action, f"c{index}") for index, action in enumerate(actions)]
    categories = {}
    for index, action in enumerate(actions):
        if action.get("requestor", "assistant") != "assistant":
            continue
        prefix = trajectory_of(actions[:index], answers[:index]).messages
        expected = {"type": "function_call", "name": action["name"], "arguments": json.dumps(action["arguments"])}
        own = requests.post(f"{url}/verify_pivot", json=pivot_body(domain, task_id, prefix, expected, [action]),
                            timeout=300)  # fmt: skip
        assert own.status_code == 200, own.text
        assert (own.json()["reward"], own.json()["category"]) == (1.0, "equivalent"), (index, own.json())
        categories[index] = own.json()["category"]
        if index in mutated:
            other = action | {"arguments": mutated[index]}
            body = pivot_body(domain, task_id, prefix, expected, [other])
            got = requests.post(f"{url}/verify_pivot", json=body, timeout=300).json()
            assert (got["reward"], got["category"]) == (0.0, "different_state"), (index, got)
            categories[f"{index} mutated"] = got["category"]
    return categories
