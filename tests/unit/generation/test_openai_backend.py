"""The openai backend: an endpoint that is already running, with its API key read from the environment."""

import socket

import pytest

from nemo_tau2.generation import GenerationConfig, GenerationStartupError, start_generation
from nemo_tau2.generation.surface_check import check_surface


def _openai_cfg(base_url: str, **fields) -> GenerationConfig:
    return GenerationConfig(backend="openai", temperature=1.0, top_p=1.0, openai_cfg={"base_url": base_url, **fields})


def test_connects_to_a_running_endpoint_with_the_key_from_the_environment(hf_handle, monkeypatch):
    monkeypatch.setenv("POLICY_KEY_FOR_TEST", "secret-value")
    cfg = _openai_cfg(hf_handle.base_urls[0], model="tiny", api_key_env="POLICY_KEY_FOR_TEST")
    with start_generation(cfg) as handle:
        assert handle.base_urls == hf_handle.base_urls and handle.model_name == "tiny"
        assert handle.api_key == "secret-value" and "secret-value" not in repr(handle)
        check_surface(handle.base_urls[0], api_key=handle.api_key, check_context_limit=False)
        with pytest.raises(NotImplementedError, match="serves fixed weights"):
            handle.update_weights(checkpoint_dir="/tmp")


def test_an_unset_key_variable_is_named(hf_handle, monkeypatch):
    monkeypatch.delenv("POLICY_KEY_FOR_TEST", raising=False)
    cfg = _openai_cfg(hf_handle.base_urls[0], model="tiny", api_key_env="POLICY_KEY_FOR_TEST")
    with pytest.raises(GenerationStartupError, match="api_key_env names 'POLICY_KEY_FOR_TEST'.*not set"):
        start_generation(cfg)


def test_an_unreachable_endpoint_is_reported():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: connections are refused
        with pytest.raises(GenerationStartupError, match="cannot reach .*/v1/models"):
            start_generation(_openai_cfg(f"http://127.0.0.1:{port}/v1", model="m", timeout_s=5))
