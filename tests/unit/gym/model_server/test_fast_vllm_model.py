"""fast_vllm_model over HTTP on 127.0.0.1, in front of the fake vLLM surface: whole tau2 episodes answer exactly as
through NeMo-Gym's vllm_model, and failures are named (400 for the request, 502 for the endpoint)."""

import asyncio
import re
from contextlib import ExitStack

import aiohttp
import pytest
import requests

from nemo_tau2.gym.launch import GymServers
from nemo_tau2.gym.stack import AGENT, POLICY_MODEL, ModelEndpoint, model_server_spec, tau2_stack
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.gym_rows import task_row
from nemo_tau2.testing import start_fake_server, tau2_key

_RANDOM_ID = re.compile(r"\b(resp|msg|fc_call|call|fc|rs)_[0-9a-f]{8,}\b")
_PER_RUN = {"timings", "conversation_id", "created_at"}
_OURS = {"weight_version"}  # what fast_vllm_model adds: the weights that sampled each policy turn (async GRPO)


def _normalized(value):
    """The answer without what differs from run to run: generated ids, timings, the conversation id."""
    if isinstance(value, dict):
        return {key: _normalized(item) for key, item in value.items() if key not in _PER_RUN | _OURS}
    if isinstance(value, list):
        return [_normalized(item) for item in value]
    if isinstance(value, str):
        return _RANDOM_ID.sub(r"\1_<id>", value)
    return value


def _first_difference(ours, theirs, path: str = "") -> str:
    """Where two answers first differ, and how (a failure message that says what to fix)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in sorted(set(ours) | set(theirs)):
            if ours.get(key, "<absent>") != theirs.get(key, "<absent>"):
                return _first_difference(ours.get(key, "<absent>"), theirs.get(key, "<absent>"), f"{path}.{key}")
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        for index, (mine, stock) in enumerate(zip(ours, theirs, strict=True)):
            if mine != stock:
                return _first_difference(mine, stock, f"{path}[{index}]")
    return f"{path}: fast_vllm_model {str(ours)[:300]} != vllm_model {str(theirs)[:300]}"


async def _run_all(agent_url: str, rows: list[dict]) -> list[dict]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        gate = asyncio.Semaphore(16)

        async def one(row: dict) -> dict:
            async with gate, http.post(f"{agent_url}/run", json=row) as response:
                return await response.json()

        return await asyncio.gather(*(one(row) for row in rows))


@pytest.mark.slow  # two Gym stacks for 35 episodes each
def test_test_split_episodes_match_nemo_gyms_vllm_model_item_for_item():
    # every third test task of each domain (35 episodes of the 100; CI time): the conversion is per model call, and
    # test_conversion_parity.py compares it on every message shape
    rows = [
        task_row(domain, task.id) | {"sample_index": i}
        for domain in ("airline", "retail", "telecom")
        for i, task in enumerate(domains.get_tasks(domain, "test")[::3])
    ]
    answers = {}
    with start_fake_server(preload_domains=["airline", "retail", "telecom"]) as fake:
        for server in ("vllm_model", "fast_vllm_model"):
            specs = tau2_stack(
                ModelEndpoint([fake.base_url], "fake-policy", server=server, return_token_ids=True),
                ModelEndpoint([fake.base_url], "fake-user", server=server),
                domains=["airline", "retail", "telecom"],
            )
            with GymServers(specs) as servers:
                answers[server] = asyncio.run(_run_all(servers.url(AGENT), rows))
    stock, fast = answers["vllm_model"], answers["fast_vllm_model"]
    assert all(answer["status"] == "ok" and answer["reward"] == 1.0 for answer in stock)
    with_token_ids = [item for item in fast[0]["response"]["output"] if "prompt_token_ids" in item]
    assert len(with_token_ids) == fast[0]["num_turns"] > 0
    assert all(item["weight_version"] == 0 for item in with_token_ids)  # the fake's starting weights
    assert not any("weight_version" in item for answer in stock for item in answer["response"]["output"])
    for row, stock_answer, fast_answer in zip(rows, stock, fast, strict=True):
        ours, theirs = _normalized(fast_answer), _normalized(stock_answer)
        assert ours == theirs, (row["domain"], row["task_id"], _first_difference(ours, theirs))


@pytest.fixture
def fast_server():
    """Start a fast_vllm_model in front of the given base URLs; yields a function returning its URL."""
    with ExitStack() as started:

        def start(base_urls: list[str], return_token_ids: bool = True) -> str:
            endpoint = ModelEndpoint(
                base_urls, "fake-policy", server="fast_vllm_model", return_token_ids=return_token_ids
            )
            servers = started.enter_context(GymServers([model_server_spec(POLICY_MODEL, endpoint)]))
            return servers.url(POLICY_MODEL)

        yield start


def _policy_request(task: str = "0", conversation: str = "e1") -> dict:
    row = task_row("retail", task)["responses_create_params"]
    user_says = {"role": "user", "content": "Hi, I am Yusuf Rossi, zip 19122."}
    return row | {"input": [*row["input"], user_says], "user": tau2_key("retail", task, conversation, "policy")}


def test_prompt_ids_come_from_the_completion_or_else_from_tokenize(fast_server):
    with (
        start_fake_server(token_ids_in_completions="when_requested") as current,
        start_fake_server(token_ids_in_completions="never") as older,
    ):
        answers = {}
        for name, fake in (("current", current), ("older", older)):
            response = requests.post(
                f"{fast_server([fake.base_url])}/v1/responses", json=_policy_request(), timeout=60
            )
            assert response.status_code == 200, response.text
            answers[name] = response.json()["output"][-1]
        assert current.stats().requests_by_route["tokenize"] == 0  # vLLM >= 0.10.2: one request per turn
        assert older.stats().requests_by_route["tokenize"] == 1
    for key in ("prompt_token_ids", "generation_token_ids", "generation_log_probs"):
        assert answers["current"][key] == answers["older"][key]
    assert all(type(token_id) is int for token_id in answers["current"]["generation_token_ids"])


def test_chat_completions_route_returns_the_token_fields_on_the_message(fast_server):
    with start_fake_server() as fake:
        url = fast_server([fake.base_url])
        key = tau2_key("retail", "0", "c1", "policy")
        body = {"messages": [{"role": "user", "content": "Hi, I am Yusuf Rossi, zip 19122."}], "user": key}
        response = requests.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    assert len(message["generation_token_ids"]) == len(message["generation_log_probs"]) > 0
    assert message["prompt_token_ids"] and "logprobs" not in response.json()["choices"][0]


def test_a_prompt_over_the_context_length_ends_the_turn_as_vllm_model_does(fast_server):
    with start_fake_server(max_model_len=64) as fake:
        response = requests.post(f"{fast_server([fake.base_url])}/v1/responses", json=_policy_request(), timeout=60)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    (item,) = body["output"]
    assert item["type"] == "message" and item["content"][0]["text"] == "" and "prompt_token_ids" not in item


BAD_REQUESTS = [
    (b"{not json", "JSONDecodeError"),
    (b"[1, 2]", "the request body must be a JSON object"),
    (b'{"input": [], "top_k": 20}', "unknown Responses API parameter(s) ['top_k']"),
    (b'{"input": [{"type": "function_call", "name": "f"}]}', "input[0] (function_call) lacks call_id, arguments"),
    (b'{"input": "hi", "metadata": {"extra_body": "{oops"}}', "metadata.extra_body must be a JSON object encoded as"),
]


def test_bad_requests_get_400_naming_the_problem(fast_server):
    with start_fake_server() as fake:
        url = fast_server([fake.base_url])
        for payload, problem in BAD_REQUESTS:
            response = requests.post(
                f"{url}/v1/responses", data=payload, headers={"Content-Type": "application/json"}, timeout=60
            )
            assert response.status_code == 400 and problem in response.json()["detail"], (payload, response.text)
        assert fake.stats().requests_by_route["chat"] == 0


def test_endpoint_failures_are_502_naming_the_endpoint(fast_server):
    with start_fake_server() as fake:
        url = fast_server([fake.base_url])
        fake.inject_fault("http_500", count=1)
        failed = requests.post(f"{url}/v1/responses", json=_policy_request(), timeout=60)
        recovered = requests.post(f"{url}/v1/responses", json=_policy_request(), timeout=60)
        fake.inject_fault("garbage", count=1)
        garbage = requests.post(f"{url}/v1/responses", json=_policy_request(), timeout=60)
        dead_url = fake.base_url
    unreachable = requests.post(f"{fast_server([dead_url])}/v1/responses", json=_policy_request(), timeout=60)
    assert failed.status_code == 502 and "the endpoint answered HTTP 500" in failed.json()["detail"]
    assert recovered.status_code == 200
    assert garbage.status_code == 502 and "not a JSON object" in garbage.json()["detail"]
    assert unreachable.status_code == 502 and "chat completion failed" in unreachable.json()["detail"]


def test_a_session_stays_on_one_endpoint_and_sessions_spread(fast_server):
    with start_fake_server() as first, start_fake_server() as second:
        url = fast_server([first.base_url, second.base_url])
        with requests.Session() as session:  # one episode: its cookie pins it to one endpoint (prefix cache)
            for _ in range(4):
                assert session.post(f"{url}/v1/responses", json=_policy_request(), timeout=60).status_code == 200
        chats = [fake.stats().requests_by_route["chat"] for fake in (first, second)]
        assert sorted(chats) == [0, 4]
        for i in range(16):  # sixteen more episodes, one request each: both endpoints get some
            body = _policy_request(conversation=f"s{i}")
            assert requests.post(f"{url}/v1/responses", json=body, timeout=60).status_code == 200
        chats = [fake.stats().requests_by_route["chat"] for fake in (first, second)]
        assert min(chats) > 0 and sum(chats) == 20


def test_a_replica_that_is_gone_moves_its_sessions_next_turns_to_a_live_one(fast_server):
    with start_fake_server() as first, start_fake_server() as second:
        url = fast_server([first.base_url, second.base_url])
        with requests.Session() as session:  # one episode, pinned to a replica by its first call
            assert session.post(f"{url}/v1/responses", json=_policy_request(), timeout=60).status_code == 200
            pinned, survivor = (first, second) if first.stats().requests_by_route["chat"] else (second, first)
            pinned.close()
            lost = session.post(f"{url}/v1/responses", json=_policy_request(), timeout=60)
            retried = [session.post(f"{url}/v1/responses", json=_policy_request(), timeout=60) for _ in range(3)]
        new_episode = requests.post(f"{url}/v1/responses", json=_policy_request(conversation="n1"), timeout=60)
        survivor_chats = survivor.stats().requests_by_route["chat"]
    assert lost.status_code == 502 and "chat completion failed" in lost.json()["detail"]  # the turn's call failed
    assert [r.status_code for r in retried] == [200, 200, 200]  # the agent's retry and later turns: the survivor
    assert new_episode.status_code == 200 and survivor_chats == 4
