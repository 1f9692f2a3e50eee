"""``tau2.version``: one schema and one default for every run; a wrong value is one line naming the choices; the
version is recorded in the run's summary. GRPO and evaluation take v1.0.1."""

from pathlib import Path

import pytest

from nemo_tau2.algorithms.grpo_config import GRPOMasterConfig
from nemo_tau2.config import ConfigError, apply_overrides, load_config, validate_config
from nemo_tau2.evals.eval import setup_eval, summarize
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig

FAKE_EVAL = Path("examples/configs/evals/tau2_fake.yaml")
GRPO_SMOKE = Path("examples/configs/grpo_tau2_cpu_smoke.yaml")


def _eval(*overrides: str):
    return setup_eval(apply_overrides(load_config(FAKE_EVAL), list(overrides)))


def test_the_default_release_is_v021_everywhere():
    assert Tau2ReleaseConfig().version == "v0.2.1"
    assert _eval().tau2.version == "v0.2.1"
    assert validate_config(load_config(GRPO_SMOKE), GRPOMasterConfig).tau2.version == "v0.2.1"


def test_an_unknown_release_is_one_line_naming_the_choices():
    with pytest.raises(ConfigError) as error:
        _eval("++tau2.version=v1.0")
    message = str(error.value)
    assert "tau2.version" in message and "'v0.2.1'" in message and "'v1.0.1'" in message
    assert len(message.strip().splitlines()) <= 2  # "invalid ... config:" + the one problem


def test_a_typo_in_the_tau2_block_is_refused():
    with pytest.raises(ConfigError, match="tau2.verison"):
        _eval("++tau2.verison=v1.0.1")


def test_v101_is_taken_by_grpo_and_eval():
    raw = apply_overrides(load_config(GRPO_SMOKE), ["++tau2.version=v1.0.1"])
    assert validate_config(raw, GRPOMasterConfig).tau2.version == "v1.0.1"
    assert _eval("++tau2.version=v1.0.1").tau2.version == "v1.0.1"


def test_the_summary_records_the_release():
    record = {"domain": "mock", "task_id": "create_task_1", "success": True, "reward": 1.0, "status": "ok"}
    record |= {"termination_reason": "user_stop", "num_turns": 2, "total_tokens": None, "token_contiguity_breaks": []}
    raw = load_config(FAKE_EVAL)
    assert summarize(setup_eval(raw), raw, [record])["tau2_version"] == "v0.2.1"
