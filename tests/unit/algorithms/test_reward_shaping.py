"""Partial-credit reward shaping (slime tau2 pipeline) against hand-computed values."""

import pytest
from pydantic import ValidationError

from nemo_tau2.algorithms.reward_shaping import ComponentWeights, RewardShapingConfig, partial_credit, shape_reward

CFG = RewardShapingConfig()


def components(action=None, env=None, communicate=None):
    return {"action_match_fraction": action, "env_assertion_fraction": env, "communicate_fraction": communicate}


def test_airline_partial_credit_renormalised_over_present_components():
    # weights .5 / .35 / .15, env assertions absent: (.5 * .5 + .15 * 1) / (.5 + .15) = .4 / .65
    partial = 0.4 / 0.65
    assert partial_credit(components(0.5, None, 1.0), CFG.weights_for("airline")) == pytest.approx(partial)
    assert shape_reward(True, components(0.5, None, 1.0), "airline", CFG) == pytest.approx(1 + 0.25 * 1.0 * partial)


def test_telecom_uses_its_own_weights_and_scale():
    # weights .35 / .35 / .30, communicate absent: (.35 * 1 + .35 * .5) / .7 = .75; shaped = 0 + .25 * 1.6 * .75
    assert shape_reward(False, components(1.0, 0.5, None), "telecom", CFG) == pytest.approx(0.3)


def test_retail_with_all_components():
    # (.5 * 0 + .35 * 1 + .15 * .5) / 1 = .425; shaped = 0 + .25 * .8 * .425 = .085
    assert shape_reward(False, components(0.0, 1.0, 0.5), "retail", CFG) == pytest.approx(0.085)


def test_no_components_means_no_partial_credit():
    assert shape_reward(True, components(), "airline", CFG) == 1.0
    assert shape_reward(False, components(), "airline", CFG) == 0.0


def test_disabled_shaping_returns_binary_success():
    off = RewardShapingConfig(enabled=False)
    assert shape_reward(False, components(1.0, 1.0, 1.0), "airline", off) == 0.0
    assert shape_reward(True, components(0.0, 0.0, 0.0), "unknown-domain", off) == 1.0


def test_custom_alpha_scale_and_weights():
    cfg = RewardShapingConfig(
        alpha=0.5,
        domain_scale={"airline": 2.0},
        component_weights=ComponentWeights(action=1.0, env_assertion=0.0, communicate=1.0),
        domain_component_weights={},
    )
    # (1 * .2 + 0 * 1 + 1 * .6) / 2 = .4; shaped = 0 + .5 * 2 * .4
    assert shape_reward(False, components(0.2, 1.0, 0.6), "airline", cfg) == pytest.approx(0.4)


def test_bad_inputs_are_rejected_with_the_offending_value():
    with pytest.raises(TypeError, match="success must be a bool"):
        shape_reward(0.7, components(), "airline", CFG)
    with pytest.raises(ValueError, match="no reward_shaping.domain_scale for domain 'mock'"):
        shape_reward(True, components(), "mock", CFG)
    with pytest.raises(ValueError, match=r"communicate_fraction=1.5 must lie in \[0, 1\]"):
        shape_reward(True, components(communicate=1.5), "airline", CFG)
    with pytest.raises(ValueError, match=r"\['env_assertion_fraction'\] are missing"):
        shape_reward(True, {"action_match_fraction": 1.0, "communicate_fraction": None}, "airline", CFG)
    with pytest.raises(ValidationError, match="domain_scale values must be >= 0"):
        RewardShapingConfig(domain_scale={"airline": -1.0})
    with pytest.raises(ValidationError, match="alpha"):
        RewardShapingConfig(alpha=-0.1)
