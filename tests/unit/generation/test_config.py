"""`policy.generation` parsing: typos fail, each backend's block is checked where it is used."""

import pytest
from pydantic import ValidationError

from nemo_tau2.generation import GenerationConfig
from nemo_tau2.generation.config import HfConfig, LlamacppConfig


def test_unknown_keys_are_rejected_at_every_level():
    with pytest.raises(ValidationError, match="vllm_cfg.tensor_paralel_size"):
        GenerationConfig(backend="vllm", model_name="m", vllm_cfg={"tensor_paralel_size": 2})


def test_vllm_and_hf_need_a_model_name():
    with pytest.raises(ValidationError, match="model_name is required for backend 'hf'"):
        GenerationConfig(backend="hf")


def test_openai_backend_needs_its_block():
    with pytest.raises(ValidationError, match="backend 'openai' needs an openai_cfg block"):
        GenerationConfig(backend="openai")


@pytest.mark.parametrize("url", ["localhost:8000/v1", "http://localhost:8000"])
def test_openai_base_url_must_be_http_and_end_in_v1(url):
    with pytest.raises(ValidationError, match="base_url must"):
        GenerationConfig(backend="openai", openai_cfg={"base_url": url, "model": "m"})


def test_backend_block_defaults_when_absent():
    assert GenerationConfig(backend="hf", model_name="m").backend_block == HfConfig()
    assert GenerationConfig(backend="llamacpp").backend_block == LlamacppConfig()


def test_nemo_rl_style_vllm_block_is_accepted():
    cfg = GenerationConfig(
        backend="vllm",
        model_name="Qwen/Qwen3-4B-Instruct-2507",
        max_new_tokens=512,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        stop_token_ids=None,
        stop_strings=None,
        vllm_cfg={
            "async_engine": True,
            "expose_http_server": True,
            "tensor_parallel_size": 1,
            "gpu_memory_utilization": 0.6,
            "max_model_len": 8192,
            "http_server_serving_chat_kwargs": {"enable_auto_tools": True, "tool_parser": "hermes"},
        },
    )
    assert cfg.vllm_cfg is not None and cfg.vllm_cfg.http_server_serving_chat_kwargs.tool_parser == "hermes"
