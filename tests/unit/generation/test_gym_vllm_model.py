"""NeMo-Gym's own `vllm_model` server, unchanged, driving our endpoint over HTTP for two turns."""

import json
from unittest.mock import MagicMock

import nemo_gym.server_utils
from fastapi.testclient import TestClient
from nemo_gym.server_utils import ServerClient
from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig

from nemo_tau2.generation.tiny_model import WEATHER_TOOL

from .conftest import TOOL_PROMPT

GYM_TOOL = {"type": "function", "strict": False, **WEATHER_TOOL["function"]}


def _token_item(response: dict) -> dict:
    """The output item vllm_model attaches the call's token ids to (its last one)."""
    item = response["output"][-1]
    assert {"prompt_token_ids", "generation_token_ids", "generation_log_probs"} <= set(item), item
    return item


def test_gym_vllm_model_gets_tool_calls_and_contiguous_token_ids(hf_handle, monkeypatch):
    monkeypatch.setattr(nemo_gym.server_utils, "get_global_config_dict", lambda *args, **kwargs: {})
    # Gym keeps one aiohttp session per process; ours is bound to TestClient's loop, so drop it afterwards
    monkeypatch.setattr(nemo_gym.server_utils, "_GLOBAL_AIOHTTP_CLIENT", None)
    config = VLLMModelConfig(
        host="127.0.0.1",
        port=0,
        entrypoint="app.py",
        name="policy_model",
        base_url=hf_handle.base_urls,
        api_key="EMPTY",
        model=hf_handle.model_name,
        return_token_id_information=True,
        uses_reasoning_parser=False,
    )
    gym_model = VLLMModel(config=config, server_client=MagicMock(spec=ServerClient))
    first_input = [{"role": m["role"], "content": m["content"]} for m in TOOL_PROMPT]
    body = {"input": first_input, "tools": [GYM_TOOL], "temperature": 0.0, "top_p": 1.0, "max_output_tokens": 40}
    with TestClient(gym_model.setup_webserver()) as client:
        first = client.post("/v1/responses", json=body)
        assert first.status_code == 200, first.text
        first = first.json()
        (call,) = [item for item in first["output"] if item["type"] == "function_call"]
        assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
        turn1 = _token_item(first)

        result = {"type": "function_call_output", "call_id": call["call_id"], "output": '{"weather": "sunny"}'}
        second = client.post("/v1/responses", json=body | {"input": first_input + first["output"] + [result]})
        assert second.status_code == 200, second.text
        turn2 = _token_item(second.json())
        client.portal.call(nemo_gym.server_utils._GLOBAL_AIOHTTP_CLIENT.close)

    # NeMo-RL asserts exactly this when it turns a Gym rollout into a training sample ("contiguous messages")
    prefix = turn1["prompt_token_ids"] + turn1["generation_token_ids"]
    assert turn2["prompt_token_ids"][: len(prefix)] == prefix
    assert len(turn2["prompt_token_ids"]) > len(prefix)
    assert all(lp <= 0 for lp in turn1["generation_log_probs"] + turn2["generation_log_probs"])
