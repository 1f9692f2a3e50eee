"""Config errors of async GRPO and truncated importance sampling: one line each, naming the keys, and exit 2 from
``run_grpo.py`` before anything starts. ``grpo.async_grpo.enabled: true`` validates with the importance correction
and generation in its own process, with or without in-flight weight updates."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_tau2.algorithms.grpo_config import GRPOMasterConfig
from nemo_tau2.config import ConfigError, apply_overrides, load_config, validate_config

EXAMPLES = Path(__file__).parents[3] / "examples"
SMOKE = EXAMPLES / "configs" / "grpo_tau2_cpu_smoke.yaml"  # hf backend in-process, IS correction on
ASYNC = "+grpo.async_grpo.enabled=true"
NOT_COLOCATED = "policy.generation.hf_cfg.in_process=false"
TIS = ["+loss_fn.truncated_importance_sampling_ratio=2.0", "+loss_fn.truncated_importance_sampling_ratio_min=0.5"]

CASES = [
    pytest.param(
        ["+loss_fn.truncated_importance_sampling_type=clip", *TIS],
        "loss_fn.truncated_importance_sampling_type: Input should be 'tis', 'icepop' or 'seq-mask-tis'",
        id="unknown-tis-type",
    ),
    pytest.param(
        ["+loss_fn.truncated_importance_sampling_ratio=2.0", "+loss_fn.truncated_importance_sampling_ratio_min=3.0"],
        "loss_fn.truncated_importance_sampling_ratio_min: 3.0 is above the ratio 2.0",
        id="min-above-upper",
    ),
    pytest.param(
        ["+loss_fn.truncated_importance_sampling_type=icepop"],
        "loss_fn.truncated_importance_sampling_ratio: required (the upper bound) when "
        "truncated_importance_sampling_type is 'icepop'",
        id="type-without-ratio",
    ),
    pytest.param(
        ["+loss_fn.truncated_importance_sampling_type=seq-mask-tis", "+loss_fn.truncated_importance_sampling_ratio=2"],
        "loss_fn.truncated_importance_sampling_ratio_min: required for type 'seq-mask-tis'",
        id="seq-mask-tis-without-min",
    ),
    pytest.param(
        ["loss_fn.use_importance_sampling_correction=false", *TIS],
        "loss_fn.use_importance_sampling_correction: must be true when truncated_importance_sampling_ratio is set",
        id="tis-without-is-correction",
    ),
    pytest.param(
        [ASYNC, NOT_COLOCATED, "loss_fn.use_importance_sampling_correction=false"],
        "grpo.async_grpo.enabled requires loss_fn.use_importance_sampling_correction=true",
        id="async-without-is-correction",
    ),
    pytest.param(
        [ASYNC],
        "grpo.async_grpo.enabled cannot run with colocated generation: policy.generation.hf_cfg.in_process is true",
        id="async-colocated",
    ),
    pytest.param(
        [ASYNC, NOT_COLOCATED, "+grpo.async_grpo.max_trajectory_age_steps=0"],
        "grpo.async_grpo.max_trajectory_age_steps: Input should be greater than or equal to 1",
        id="async-age-zero",
    ),
]


def _raw(*overrides: str):
    return apply_overrides(load_config(SMOKE), list(overrides))


@pytest.mark.parametrize(("overrides", "message"), CASES)
def test_each_config_error_is_one_line_naming_its_keys(overrides, message):
    with pytest.raises(ConfigError) as caught:
        validate_config(_raw(*overrides), GRPOMasterConfig)
    assert len(caught.value.problems) == 1 and "\n" not in caught.value.problems[0], caught.value.problems
    assert message in caught.value.problems[0], caught.value.problems


def test_defaults_are_nemo_rl_and_the_valid_keys_validate():
    cfg = validate_config(_raw(*TIS, "+loss_fn.truncated_importance_sampling_type=seq-mask-tis"), GRPOMasterConfig)
    settings = cfg.grpo.async_grpo
    assert not settings.enabled and settings.max_trajectory_age_steps == 1
    assert not settings.in_flight_weight_updates and not settings.recompute_kv_cache_after_weight_updates
    assert cfg.loss_fn.truncation_type == "seq-mask-tis"
    assert validate_config(_raw(), GRPOMasterConfig).loss_fn.truncation_type is None  # off by default
    ratio_only = validate_config(_raw("+loss_fn.truncated_importance_sampling_ratio=2.0"), GRPOMasterConfig)
    assert ratio_only.loss_fn.truncation_type == "tis"  # the ratio alone clips, as in NeMo-RL


def test_async_grpo_validates_with_importance_correction_and_its_own_generation_process():
    cfg = validate_config(
        _raw(ASYNC, NOT_COLOCATED, "+grpo.async_grpo.max_trajectory_age_steps=2", *TIS), GRPOMasterConfig
    )
    settings = cfg.grpo.async_grpo
    assert settings.enabled and settings.max_trajectory_age_steps == 2 and not settings.in_flight_weight_updates
    assert cfg.loss_fn.use_importance_sampling_correction and not cfg.policy.generation.hf_cfg.in_process
    assert settings.recompute_kv_cache()  # episodes drain before each update: no KV of old weights is worth keeping
    in_flight = validate_config(
        _raw(ASYNC, NOT_COLOCATED, "+grpo.async_grpo.in_flight_weight_updates=true"), GRPOMasterConfig
    ).grpo.async_grpo
    assert in_flight.in_flight_weight_updates and not in_flight.recompute_kv_cache()  # NeMo-RL's default keeps it
    recompute = "+grpo.async_grpo.recompute_kv_cache_after_weight_updates=true"
    in_flight = validate_config(
        _raw(ASYNC, NOT_COLOCATED, "+grpo.async_grpo.in_flight_weight_updates=true", recompute), GRPOMasterConfig
    ).grpo.async_grpo
    assert in_flight.recompute_kv_cache()


def _run_grpo_main(monkeypatch, capsys, *argv: str) -> tuple[int, str]:
    spec = importlib.util.spec_from_file_location("run_grpo", EXAMPLES / "run_grpo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from nemo_tau2.algorithms import grpo

    def must_not_start(*args, **kwargs):
        raise AssertionError("the run started although its config is refused")

    monkeypatch.setattr(grpo, "setup", must_not_start)
    monkeypatch.setattr(sys, "argv", ["run_grpo.py", "--config", str(SMOKE), *argv])
    code = module.main()
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("overrides", "message"), [case for case in CASES if case.id.startswith(("async", "unknown"))]
)  # fmt: skip
def test_run_grpo_exits_2_with_the_line(monkeypatch, capsys, tmp_path, overrides, message):
    # a model that does not exist and no tiny policy to build: were the config accepted, the run would stop at once
    paths = [f"logger.log_dir={tmp_path / 'logs'}", f"policy.model_name={tmp_path / 'none'}", "tiny_policy=null"]
    code, err = _run_grpo_main(monkeypatch, capsys, *overrides, *paths)
    assert code == 2, err
    header, *problems = err.strip().splitlines()
    assert header == "error: invalid GRPOMasterConfig config:" and len(problems) == 1, err
    assert message in problems[0] and "Traceback" not in err
    assert not (tmp_path / "logs").exists()


def test_a_config_is_read_and_refused_before_torch_is_imported():
    """The training configs (GRPO's, SFT's, RFT's, the policy's) import neither torch nor transformers, so a wrong key
    is refused in about a second (it took ~6 CPU-s of torch's and transformers' import before the line came)."""
    configs = [f"nemo_tau2.algorithms.{name}_config" for name in ("grpo", "sft", "rft")]
    probe = (
        f"import sys, {', '.join(configs)}, nemo_tau2.models.policy as policy; policy.PolicyConfig; "
        "policy.CheckpointingConfig; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    )
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout == "[]\n"
    configs_dir = EXAMPLES / "configs"
    for script, config, typo in (
        ("run_grpo.py", SMOKE, "grpo.max_num_stepz=3"),
        ("run_sft.py", configs_dir / "sft_tau2_cpu_smoke.yaml", "sft.max_num_stepz=3"),
        ("run_rft.py", configs_dir / "rft_tau2_cpu_smoke.yaml", "rft.num_roundz=1"),
    ):
        command = [sys.executable, "-X", "importtime", str(EXAMPLES / script), "--config", str(config), typo]
        run = subprocess.run(command, capture_output=True, text=True)
        lines = run.stderr.splitlines()
        imported = {line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time")}
        assert run.returncode == 2 and typo.split("=")[0] in run.stderr, run.stderr[-500:]
        assert not {"torch", "transformers"} & imported, f"{script} imported torch or transformers to refuse a key"
