"""The gym rules (top_k null, no stop strings, explicit temperature/top_p, async vLLM over HTTP) are validators of
the config models: they run for the policy AND the user simulator, in evaluation and in GRPO alike, and every
broken rule is reported with its key."""

from pathlib import Path

import pytest

from nemo_tau2.algorithms.grpo_config import GRPOMasterConfig
from nemo_tau2.config import ConfigError, apply_overrides, load_config, validate_config
from nemo_tau2.evals.config import EvalMasterConfig
from nemo_tau2.generation.config import GenerationConfig
from nemo_tau2.gym.environment import Tau2EnvironmentSpec

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"
EVAL = (CONFIGS / "evals" / "tau2_fake.yaml", EvalMasterConfig)
GRPO = (CONFIGS / "grpo_tau2_cpu_smoke.yaml", GRPOMasterConfig)
RULES = [
    ("top_k=20", "top_k: must be null"),
    ("stop_strings=[x]", "stop_strings: must be null"),
    ("stop_token_ids=[7]", "stop_token_ids: must be null"),
    ("temperature=null", "temperature: must be given explicitly"),
]


def _validate(config, *overrides: str):
    path, model = config
    return validate_config(apply_overrides(load_config(path), list(overrides)), model)


@pytest.mark.parametrize("config", [EVAL, GRPO], ids=["eval", "grpo"])
@pytest.mark.parametrize("block", ["policy.generation", "user.generation"])
@pytest.mark.parametrize(("override", "message"), RULES, ids=[rule for rule, _ in RULES])
def test_each_gym_rule_is_checked_for_the_policy_and_the_user_simulator(config, block, override, message):
    with pytest.raises(ConfigError) as error:
        _validate(config, f"++{block}.{override}")
    assert f"{block}.{message}" in str(error.value)


@pytest.mark.parametrize("config", [EVAL, GRPO], ids=["eval", "grpo"])
def test_broken_rules_of_both_blocks_are_reported_together(config):
    with pytest.raises(ConfigError) as error:
        _validate(
            config, "++policy.generation.top_k=5", "++user.generation.stop_strings=[x]", "++user.generation.top_k=1"
        )
    text = str(error.value)
    for line in ("policy.generation.top_k:", "user.generation.stop_strings:", "user.generation.top_k:"):
        assert line in text


@pytest.mark.parametrize("config", [EVAL, GRPO], ids=["eval", "grpo"])
def test_the_shipped_config_keeps_the_rules(config):
    _validate(config)


def test_an_environment_built_in_code_checks_its_blocks_too():
    good = GenerationConfig(backend="fake", temperature=0.0, top_p=1.0)
    with pytest.raises(ValueError, match="top_k: must be null"):
        Tau2EnvironmentSpec(policy=good.model_copy(update={"top_k": 3}), user=good, domains=["mock"])
    with pytest.raises(ValueError, match="top_p: must be given explicitly"):
        Tau2EnvironmentSpec(policy=good, user=GenerationConfig(backend="fake", temperature=0.0), domains=["mock"])
