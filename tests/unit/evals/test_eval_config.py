"""The evaluation config: every example loads, gym rules are checked before anything starts, modes don't mix."""

from pathlib import Path

import pytest

from nemo_tau2.config import ConfigError, apply_overrides, load_config
from nemo_tau2.evals.eval import build_eval_rows, environment_spec, setup_eval
from nemo_tau2.gym.agent.user_strategies import UserStrategyConfig

CONFIGS = sorted(Path("examples/configs/evals").glob("*.yaml"))
FAKE = Path("examples/configs/evals/tau2_fake.yaml")


def _setup(*overrides: str, path: Path = FAKE):
    return setup_eval(apply_overrides(load_config(path), list(overrides)))


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.name != "tau2_base.yaml"], ids=lambda p: p.name)
def test_every_example_eval_config_validates(path):
    cfg = _setup(path=path)
    assert cfg.eval.rollout_mode == "nemo_gym" and cfg.user_simulator().generation is not None


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("policy.generation.top_k=-1", "policy.generation.top_k: must be null for gym rollouts"),
        ("policy.generation.stop_strings=[</s>]", "policy.generation.stop_strings: must be null"),
        ("policy.generation.stop_token_ids=[2]", "policy.generation.stop_token_ids: must be null"),
        ("policy.generation.temperature=null", "policy.generation.temperature: must be given explicitly"),
        ("policy.generation.top_p=null", "policy.generation.top_p: must be given explicitly"),
        ("eval.greedy=true", "greedy decoding is not allowed with gym rollouts"),
        ("user.generation.top_k=5", "user.generation.top_k: must be null"),
    ],
)
def test_each_gym_rule_is_enforced(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        _setup(override)


def test_vllm_backend_needs_the_async_engine_and_http_server():
    path = Path("examples/configs/evals/tau2_test.yaml")
    with pytest.raises(ConfigError) as error:
        _setup(
            "policy.generation.vllm_cfg.async_engine=false",
            "policy.generation.vllm_cfg.expose_http_server=false",
            path=path,
        )
    assert "vllm_cfg.async_engine: must be true" in str(error.value)
    assert "vllm_cfg.expose_http_server: must be true" in str(error.value)


def test_several_violations_are_reported_together():
    with pytest.raises(ConfigError) as error:
        _setup(
            "policy.generation.top_k=-1",
            "policy.generation.stop_strings=[x]",
            "eval.greedy=true",
            "eval.k_values=[1,8]",
        )
    text = str(error.value)
    for part in ("policy.generation.top_k", "policy.generation.stop_strings", "greedy", "k_values [1, 8]"):
        assert part in text


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["+eval.verifier=exact_match"], "eval.verifier applies only to rollout_mode=single_turn"),
        (["+data.prompt_key=question"], "data.prompt_key applies only to rollout_mode=single_turn"),
        (
            ["eval.rollout_mode=single_turn", "+eval.verifier=exact_match", "data.data_path=x.jsonl"],
            "user applies only to rollout_mode=nemo_gym",
        ),
        (
            ["eval.rollout_mode=single_turn", "~user", "~env", "+eval.verifier=contains", "data.data_path=x.jsonl"],
            "data.domains applies only to rollout_mode=nemo_gym",
        ),
        (
            ["eval.rollout_mode=single_turn", "~user", "~env", "~data", "+data.data_path=x.jsonl"],
            "eval.verifier is required for rollout_mode=single_turn",
        ),
    ],
)
def test_settings_of_the_other_rollout_mode_are_rejected(overrides, message):
    raw = load_config(FAKE)
    for override in [o for o in overrides if o.startswith("~")]:
        raw.pop(override[1:])
    raw = apply_overrides(raw, [o for o in overrides if not o.startswith("~")])
    with pytest.raises(ConfigError, match=message):
        setup_eval(raw)


def test_unknown_key_override_is_rejected_with_a_suggestion():
    with pytest.raises(ConfigError, match="eval.num_tests_per_prompt"):
        _setup("eval.num_test_per_prompt=3")


def test_the_user_strategy_reaches_the_agent_server_config(tmp_path):
    cfg = _setup("+user.strategy=verify", "+user.max_checks=2")
    spec = environment_spec(cfg, build_eval_rows(cfg), tmp_path)
    assert spec.episode_settings().user_strategy == UserStrategyConfig(strategy="verify", max_checks=2)
    default = _setup()
    settings = environment_spec(default, build_eval_rows(default), tmp_path).episode_settings()
    assert settings.user_strategy.model_fields_set == set()
    with pytest.raises(ConfigError, match="max_checks applies only to strategy verify or reflection"):
        _setup("+user.max_checks=2")
    with pytest.raises(ConfigError, match="user.strategy"):
        _setup("+user.strategy=socratic")
