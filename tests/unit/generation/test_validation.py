"""The gym-rollout validator: one test per rule, and every violation reported at once."""

import pytest

from nemo_tau2.generation import GenerationConfig, GenerationConfigError, validate_gym_generation_config

VALID = {"backend": "vllm", "model_name": "Qwen/Qwen3-4B-Instruct-2507", "temperature": 1.0, "top_p": 1.0}


def _violations(cfg, **kwargs) -> list[str]:
    with pytest.raises(GenerationConfigError) as info:
        validate_gym_generation_config(cfg, **kwargs)
    return info.value.violations


def test_valid_config_passes_and_is_returned_parsed():
    parsed = validate_gym_generation_config(VALID)
    assert isinstance(parsed, GenerationConfig) and parsed.temperature == 1.0


def test_top_k_minus_one_is_rejected_because_it_must_be_null():
    (line,) = _violations(VALID | {"top_k": -1})
    assert line.startswith("policy.generation.top_k: must be null") and "got -1" in line


def test_stop_strings_are_rejected():
    (line,) = _violations(VALID | {"stop_strings": ["</answer>"]})
    assert line.startswith("policy.generation.stop_strings:") and "</answer>" in line


def test_stop_token_ids_are_rejected():
    (line,) = _violations(VALID | {"stop_token_ids": [151645]})
    assert line.startswith("policy.generation.stop_token_ids:") and "151645" in line


def test_vllm_without_async_engine_is_rejected():
    (line,) = _violations(VALID | {"vllm_cfg": {"async_engine": False}})
    assert line.startswith("policy.generation.vllm_cfg.async_engine: must be true")


def test_vllm_without_http_server_is_rejected():
    (line,) = _violations(VALID | {"vllm_cfg": {"expose_http_server": False}})
    assert line.startswith("policy.generation.vllm_cfg.expose_http_server: must be true")


def test_greedy_is_rejected():
    (line,) = _violations(VALID, greedy=True)
    assert "greedy decoding is not allowed" in line


def test_temperature_must_be_given_explicitly():
    (line,) = _violations({k: v for k, v in VALID.items() if k != "temperature"})
    assert line.startswith("policy.generation.temperature: must be given explicitly")


def test_top_p_must_be_given_explicitly():
    (line,) = _violations({k: v for k, v in VALID.items() if k != "top_p"})
    assert line.startswith("policy.generation.top_p: must be given explicitly")


def test_several_violations_are_reported_together_with_key_paths():
    cfg = {
        "backend": "vllm",
        "model_name": "m",
        "top_k": -1,
        "stop_strings": ["x"],
        "stop_token_ids": [1],
        "vllm_cfg": {"async_engine": False, "expose_http_server": False},
    }
    with pytest.raises(GenerationConfigError) as info:
        validate_gym_generation_config(cfg, greedy=True)
    keys = [line.split(":")[0] for line in info.value.violations]
    assert keys == [
        "policy.generation.top_k",
        "policy.generation.stop_strings",
        "policy.generation.stop_token_ids",
        "policy.generation.temperature",
        "policy.generation.top_p",
        "policy.generation.vllm_cfg.async_engine",
        "policy.generation.vllm_cfg.expose_http_server",
        "policy.generation",
    ]
    assert str(info.value).startswith("8 problems in the generation config:")


def test_structural_errors_are_reported_before_rule_violations():
    lines = _violations(VALID | {"top_k": -1, "temprature": 0.7})
    assert any(line.startswith("policy.generation.temprature: Extra inputs are not permitted") for line in lines)


def test_key_prefix_follows_where_the_block_sits():
    (line,) = _violations(VALID | {"top_k": 20}, key="generation")
    assert line.startswith("generation.top_k:")


def test_a_parsed_config_is_checked_too():
    cfg = GenerationConfig(**(VALID | {"stop_strings": ["x"]}))
    assert _violations(cfg)[0].startswith("policy.generation.stop_strings")
