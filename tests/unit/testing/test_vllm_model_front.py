"""NeMo-Gym's real ``vllm_model`` model server in front of the fake, both on 127.0.0.1 in this process.

vllm_model converts Responses <-> Chat Completions, asks for logprobs with ``return_tokens_as_token_ids`` and
calls ``/tokenize``: if the fake's surface drifted from vLLM's, these tests fail. NeMo-Gym's global aiohttp
client retries connection errors forever, so every request here has a client-side timeout.
"""

import asyncio
import json
from collections.abc import AsyncIterator
from unittest.mock import MagicMock

import aiohttp
import nemo_gym.server_utils as gym_server_utils
import pytest
import uvicorn
from nemo_gym.server_utils import GlobalAIOHTTPAsyncClientConfig, ServerClient, set_global_aiohttp_client
from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig

from nemo_tau2.testing import PolicyScriptConfig, Turn, check_contiguity, tau2_key

TIMEOUT = aiohttp.ClientTimeout(total=30)
TOOLS = [
    {
        "type": "function",
        "name": "get_user",
        "description": "Look up a user.",
        "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}}},
        "strict": False,
    }
]


@pytest.fixture
async def vllm_model_url(fake, monkeypatch) -> AsyncIterator[str]:
    """vllm_model (return_token_id_information on, no reasoning parser) served by uvicorn, pointing at the fake."""
    monkeypatch.setattr(gym_server_utils, "get_global_config_dict", MagicMock(return_value={}))
    monkeypatch.setattr(gym_server_utils, "_GLOBAL_AIOHTTP_CLIENT", None)
    client = set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig())  # bound to this test's event loop
    config = VLLMModelConfig(
        host="127.0.0.1",
        port=0,
        entrypoint="",
        name="policy_model",
        base_url=fake.base_url,
        api_key="unused",  # pragma: allowlist secret
        model="fake-model",
        return_token_id_information=True,
        uses_reasoning_parser=False,
    )
    app = VLLMModel(config=config, server_client=MagicMock(spec=ServerClient)).setup_webserver()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(20):
            while not server.started:
                await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, timeout=20)
        await client.close()


async def _responses(url: str, body: dict) -> dict:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session, session.post(f"{url}/v1/responses", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def _token_items(output: list[dict]) -> list[dict]:
    return [item for item in output if "prompt_token_ids" in item]


async def test_vllm_model_returns_token_ids_logprobs_and_function_calls(fake, vllm_model_url):
    fake.register_script("conv", [Turn.call("get_user", {"user_id": "u1"}), Turn.say("Found you, Ann.")])
    input_items = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Find me."}]
    first = await _responses(vllm_model_url, {"input": input_items, "tools": TOOLS, "user": "conv"})
    (call,) = [item for item in first["output"] if item["type"] == "function_call"]
    assert call["name"] == "get_user" and json.loads(call["arguments"]) == {"user_id": "u1"}
    (tokens,) = _token_items(first["output"])
    assert tokens is call  # vllm_model attaches the token fields to the turn's last output item
    assert all(type(token_id) is int for token_id in tokens["prompt_token_ids"] + tokens["generation_token_ids"])
    assert len(tokens["generation_log_probs"]) == len(tokens["generation_token_ids"]) > 0
    assert all(isinstance(logprob, float) and logprob < 0 for logprob in tokens["generation_log_probs"])

    tool_output = {"type": "function_call_output", "call_id": call["call_id"], "output": '{"name": "Ann"}'}
    second = await _responses(
        vllm_model_url, {"input": [*input_items, *first["output"], tool_output], "tools": TOOLS, "user": "conv"}
    )
    assert second["output"][-1]["content"][0]["text"] == "Found you, Ann."
    items = (tokens, *_token_items(second["output"]))
    turns = [(item["prompt_token_ids"], item["generation_token_ids"]) for item in items]
    assert check_contiguity(turns) == []
    assert fake.stats().requests_by_route == {"chat": 2, "tokenize": 2}


async def test_splice_keeps_an_inconsistent_policy_contiguous_through_vllm_model(fake, vllm_model_url):
    fake.set_tau2_scripts(policy=PolicyScriptConfig(token_consistent=False))
    key = tau2_key("retail", "2", 0, "policy")
    items = [{"role": "system", "content": "Retail policy."}, {"role": "user", "content": "Hi, I am Yusuf Rossi."}]
    turns = []
    for _ in range(3):  # the oracle's first calls: each output carries its token ids into the next input
        response = await _responses(vllm_model_url, {"input": items, "user": key})
        (tokens,) = _token_items(response["output"])
        turns.append((tokens["prompt_token_ids"], tokens["generation_token_ids"]))
        items += response["output"]
        items += [
            {"type": "function_call_output", "call_id": item["call_id"], "output": "{}"}
            for item in response["output"]
            if item["type"] == "function_call"
        ]
    assert check_contiguity(turns) == []
    # Without the carried ids, re-rendering the history differs from what was generated.
    stripped = [{k: v for k, v in item.items() if "token" not in k and "log_probs" not in k} for item in items]
    response = await _responses(vllm_model_url, {"input": stripped, "user": key})
    (tokens,) = _token_items(response["output"])
    assert check_contiguity([*turns, (tokens["prompt_token_ids"], tokens["generation_token_ids"])]) != []
