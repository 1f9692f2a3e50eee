"""The GRPO loop end to end on CPU: real Gym servers, the hf backend, the scripted fake user, a tiny policy.

The policy is the warm-started tiny Llama of :mod:`nemo_tau2.algorithms.tiny_policy`; it picks the right first tool
call about as often as a wrong one. What GRPO must change is read exactly, not from noisy sampled success: the
log-probability margin of the right call over the wrong one.
"""

from pathlib import Path

import pytest
import torch

from nemo_tau2.algorithms import grpo
from nemo_tau2.algorithms.grpo_config import GRPOMasterConfig
from nemo_tau2.algorithms.tiny_policy import build_tiny_policy, first_call_preference
from nemo_tau2.config import apply_overrides, load_config, validate_config
from nemo_tau2.generation.validation import gym_rule_violations

CONFIGS = Path(__file__).parents[3] / "examples" / "configs"
SMOKE = CONFIGS / "grpo_tau2_cpu_smoke.yaml"


def _config(tmp: Path, model_dir: Path, *overrides: str) -> GRPOMasterConfig:
    raw = apply_overrides(
        load_config(SMOKE),
        [
            f"policy.model_name={model_dir}",
            f"logger.log_dir={tmp / 'logs'}",
            f"checkpointing.checkpoint_dir={tmp / 'checkpoints'}",
            "logger.tensorboard_enabled=false",
            "grpo.val_period=0",
            "grpo.val_at_end=false",
            *overrides,
        ],
    )
    return validate_config(raw, GRPOMasterConfig)


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny") / "policy"
    cfg = _config(directory.parent, directory)
    train_rows, _ = grpo.load_rows(cfg)
    return build_tiny_policy(cfg.tiny_policy, train_rows, directory)


@pytest.mark.parametrize("name", ["grpo_tau2_cpu_smoke.yaml", "grpo_tau2_qwen3_4b.yaml"])
def test_shipped_grpo_configs_validate_and_keep_the_gym_rules(name):
    raw = load_config(CONFIGS / name)
    cfg = validate_config(raw, GRPOMasterConfig)
    assert gym_rule_violations(raw["policy"]["generation"], key="policy.generation") == []
    assert cfg.grpo.max_num_steps > 0


def test_grpo_makes_the_right_first_call_more_likely_than_the_wrong_one(tiny_policy, tmp_path):
    cfg = _config(tmp_path, tiny_policy, "grpo.max_num_steps=8", "checkpointing.enabled=false")
    train_rows, _ = grpo.load_rows(cfg)
    before = first_call_preference(tiny_policy, train_rows)
    s = grpo.setup(cfg, train_rows, [])
    try:
        history = grpo.grpo_train(s)
        trained = s.policy.save_hf_model(tmp_path / "trained")
    finally:
        s.close()
    after = first_call_preference(trained, train_rows)
    assert len(history) == 8
    assert all(step["train/rollout/num_infrastructure_errors"] == 0 for step in history)
    assert abs(before) < 1.0, f"the warm start should leave the two calls near even, margin {before:.2f}"
    # measured: about +0.1 before, +3 to +5 after 8 to 12 steps at lr 2e-4
    assert after > before + 1.5, f"GRPO did not learn: margin {before:.2f} -> {after:.2f}"


def test_a_rerun_resumes_from_the_latest_checkpoint_with_its_weights(tiny_policy, tmp_path):
    first = _config(tmp_path, tiny_policy, "grpo.max_num_steps=2", "checkpointing.save_period=1")
    train_rows, _ = grpo.load_rows(first)
    s = grpo.setup(first, train_rows, [])
    try:
        grpo.grpo_train(s)
        weights_at_2 = {name: t.clone() for name, t in s.policy.state_dict_for_generation().items()}
        curriculum_at_2 = s.curriculum.state_dict()
    finally:
        s.close()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("step_")) == [
        "step_1",
        "step_2",
    ]

    resumed = _config(tmp_path, tiny_policy, "grpo.max_num_steps=3", "checkpointing.save_period=1")
    s = grpo.setup(resumed, train_rows, [])
    try:
        assert s.start_step == 2
        assert s.curriculum.state_dict() == curriculum_at_2
        restored = s.policy.state_dict_for_generation()
        assert all(torch.equal(restored[name], weights_at_2[name]) for name in weights_at_2)
        served = s.generation.engine.model.state_dict()
        assert all(torch.equal(served[name], weights_at_2[name]) for name in weights_at_2)
        steps = []
        grpo.grpo_train(s, on_step=lambda step, metrics: steps.append(step))
    finally:
        s.close()
    assert steps == [3]
