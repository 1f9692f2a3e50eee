"""``/verify_pivot`` on tau2 v0.2.1, over HTTP to the session's resources server: every base task's gold turns.

For every assistant gold action of every base task of airline, retail and telecom, the pivot is the task's gold
trajectory before it (earlier gold actions of both parties, with their answers). The demonstrated call scores 1
against itself; each argument mutated (another value of that argument from the domain's gold actions, a number
+1, a flag flipped, a list shortened) scores what an oracle says it must: 1 iff the mutated call, run in a state
rebuilt from the task's start (no fork), leaves tau2's own DB hashes and the answer as the gold call does. A
mutation that writes another database state must be among them, and score 0, in every domain. Parallel calls are
compared as a set, text turns by mode ``message``, and a prefix from other data is refused with its reason.
"""

import itertools
import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from nemo_tau2.gym.resources_server.rescoring import replay
from nemo_tau2.pivots.gold import gold_trajectory
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.session_db import SnapshotJsonCache, databases_equal

DOMAINS = ["airline", "retail", "telecom"]
SNAPSHOT_JSON = SnapshotJsonCache()
TAU2_HASH_EVERY = 25  # every 25th mutation's states are compared by tau2's own hash as well
MUTATIONS = itertools.count()


def gold_pivots(domain: str) -> list[dict]:
    """(task, the gold trajectory before each assistant gold action, the action): tau2's demonstrations cut at each
    of their calls (:func:`gold_trajectory`: both parties' gold actions played, with their answers)."""
    pivots = []
    for task_id in domains.task_splits(domain)["base"]:
        messages = gold_trajectory(domain, task_id).tau2_messages
        for index, message in enumerate(messages):
            for call in message.get("tool_calls") or []:
                if message["role"] == "assistant":
                    pivots.append({"task_id": task_id, "prefix": messages[:index], "name": call["name"],
                                   "arguments": call["arguments"]})  # fmt: skip
    return pivots


def mutations(arguments: dict, pool: dict[str, list]) -> list[dict]:
    """One mutated copy of ``arguments`` per argument that has another value to take."""
    mutated = []
    for key, value in arguments.items():
        if isinstance(value, bool):
            other = not value
        elif isinstance(value, int | float):
            other = value + 1
        elif isinstance(value, list) and len(value) > 1:
            other = value[:-1]
        else:
            other = next((candidate for candidate in pool.get(key, []) if candidate != value), None)
        if other is not None:
            mutated.append(arguments | {key: other})
    return mutated


def oracle(domain: str, task_id: str, prefix: list[dict], name: str, arguments: dict) -> tuple:
    """What a call does, found without forks: the episode after it (rebuilt from the task's start) and its answer."""
    episode = replay(domain, task_id, prefix)
    return episode, episode.call_tool(name, arguments, "assistant", "oracle").content


def same_state(left, right, checked_by_tau2: bool) -> bool:
    """Both databases equal, entry by entry (``session_db``, itself checked against tau2's hashes); and, for a
    sample of the mutations, by tau2's own ``get_db_hash`` too (100 ms each on airline: not for all)."""
    equal = all(
        databases_equal(getattr(left.env, side).db, getattr(right.env, side).db, SNAPSHOT_JSON)
        for side in ("tools", "user_tools") if getattr(left.env, side) is not None
    )  # fmt: skip
    if checked_by_tau2:
        hashes = [(env.get_db_hash(), env.get_user_db_hash()) for env in (left.env, right.env)]
        assert (hashes[0] == hashes[1]) == equal, hashes
    return equal


def body(domain: str, pivot: dict, expected: dict, output: list[dict]) -> dict:
    return {
        "domain": domain, "task_id": pivot["task_id"], "tau2_messages": pivot["prefix"],
        "expected_action": expected, "responses_create_params": {"input": []},
        "response": {"id": "r", "created_at": 0, "model": "m", "object": "response", "output": output,
                     "parallel_tool_calls": True, "tool_choice": "auto", "tools": []},
    }  # fmt: skip


def call(name: str, arguments: dict) -> dict:
    return {"type": "function_call", "name": name, "arguments": json.dumps(arguments), "call_id": "c", "id": "c"}


def text(content: str) -> dict:
    return {"type": "message", "role": "assistant", "id": "m", "status": "completed",
            "content": [{"type": "output_text", "text": content, "annotations": []}]}  # fmt: skip


def expected_call(name: str, arguments: dict) -> dict:
    return {"type": "function_call", "name": name, "arguments": json.dumps(arguments)}


def verdict(http: requests.Session, url: str, payload: dict) -> dict:
    answer = http.post(f"{url}/verify_pivot", json=payload, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.parametrize("domain", DOMAINS)
def test_every_gold_turn_scores_1_and_every_mutation_scores_what_it_does(resources_server_url, domain):
    url, pivots = resources_server_url, gold_pivots(domain)
    pool: dict[str, list] = {}
    for pivot in pivots:
        for key, value in pivot["arguments"].items():
            if isinstance(value, str) and value not in pool.setdefault(key, []):
                pool[key].append(value)

    def judge(pivot: dict) -> Counter:
        http, counts = requests.Session(), Counter()
        expected = expected_call(pivot["name"], pivot["arguments"])
        own = verdict(http, url, body(domain, pivot, expected, [call(pivot["name"], pivot["arguments"])]))
        assert (own["reward"], own["category"]) == (1.0, "equivalent"), (pivot["task_id"], pivot["name"], own)
        counts["gold"] += 1
        gold, gold_answer = oracle(domain, pivot["task_id"], pivot["prefix"], pivot["name"], pivot["arguments"])
        for mutated in mutations(pivot["arguments"], pool):
            got = verdict(http, url, body(domain, pivot, expected, [call(pivot["name"], mutated)]))
            episode, answer = oracle(domain, pivot["task_id"], pivot["prefix"], pivot["name"], mutated)
            same = same_state(gold, episode, checked_by_tau2=next(MUTATIONS) % TAU2_HASH_EVERY == 0)
            truth = same and answer == gold_answer
            assert got["reward"] == float(truth), (pivot["task_id"], pivot["name"], mutated, got, answer)
            counts["state"] += not same
            assert same or got["category"] == "different_state", got
            counts["mutations"] += 1
        return counts

    with ThreadPoolExecutor(4) as pool_:
        totals = sum(pool_.map(judge, pivots), Counter())
    assert totals["gold"] == len(pivots) and totals["state"] > 0, totals
    print(f"{domain}: {dict(totals)}")


def test_parallel_calls_as_a_set_text_turns_and_refusals(resources_server_url):
    url, http = resources_server_url, requests.Session()
    pivots = gold_pivots("retail")
    pivot = next(
        p for p in pivots if p["name"] == "get_order_details" and any(m["role"] == "tool" for m in p["prefix"])
    )
    first, second = pivot["arguments"], {"order_id": "#W0000000"}  # a read, and a read of no such order
    batch = {"type": "function_call_batch", "calls": [expected_call(pivot["name"], first),
                                                      expected_call(pivot["name"], second)]}  # fmt: skip
    swapped = verdict(
        http, url, body("retail", pivot, batch, [call(pivot["name"], second), call(pivot["name"], first)])
    )
    assert (swapped["reward"], swapped["category"]) == (1.0, "equivalent"), swapped
    subset = verdict(http, url, body("retail", pivot, batch, [call(pivot["name"], first)]))
    assert (subset["reward"], subset["category"]) == (0.0, "different_answer"), subset
    spoke = verdict(http, url, body("retail", pivot, batch, [text("Let me check.")]))
    assert (spoke["reward"], spoke["category"]) == (0.0, "call_expected"), spoke

    message = {"type": "message", "content": "Could you give me your order id?"}
    assert verdict(http, url, body("retail", pivot, message, [text("Your order id, please?")]))["reward"] == 1.0
    called = verdict(http, url, body("retail", pivot, message, [call(pivot["name"], first)]))
    assert (called["reward"], called["category"]) == (0.0, "message_expected"), called
    nothing = verdict(http, url, body("retail", pivot, message, []))
    assert (nothing["reward"], nothing["category"]) == (0.0, "no_action"), nothing
    malformed = {**call(pivot["name"], first), "arguments": "{not json"}
    bad = verdict(http, url, body("retail", pivot, batch, [malformed]))
    assert (bad["reward"], bad["category"]) == (0.0, "malformed_call"), bad

    surrogate = {**call(pivot["name"], first), "arguments": '{"order_id": "\\ud800"}'}  # a lone UTF-16 surrogate
    odd = verdict(http, url, body("retail", pivot, batch, [surrogate]))
    assert (odd["reward"], odd["category"]) == (0.0, "different_answer"), odd  # its tool error is its answer

    edited = [dict(message) for message in pivot["prefix"]]
    answer_index = max(i for i, message in enumerate(edited) if message["role"] == "tool")
    edited[answer_index]["content"] = "an answer this data never gave"
    refused = http.post(f"{url}/verify_pivot", json=body("retail", pivot | {"prefix": edited}, batch, []), timeout=60)
    assert refused.status_code == 400 and "cannot be rebuilt" in refused.json()["detail"], refused.text
    assert "\n" not in refused.json()["detail"]
    no_row = {key: value for key, value in body("retail", pivot, batch, []).items() if key != "task_id"}
    missing = http.post(f"{url}/verify_pivot", json=no_row, timeout=60)
    assert missing.status_code == 400 and "task_id" in missing.json()["detail"], missing.text
    not_action = body("retail", pivot, {"type": "function_call", "name": "x"}, [])
    assert http.post(f"{url}/verify_pivot", json=not_action, timeout=60).status_code == 400
    unknown = http.post(f"{url}/verify_pivot", json=body("retail", pivot | {"task_id": "nope"}, batch, []), timeout=60)
    assert unknown.status_code == 404, unknown.text
