"""NeMo-RL's own Gym path (test_nemo_rl_client.py) on NeMo-Gym 0.4.0, the release our main environment has (Python
3.12): the same NeMo-RL code and shipped configs, in the environment ``scripts/setup.sh nemo-rl-gym04`` builds. 0.4.0
finds servers only under the working directory or its own install (it has no NEMO_GYM_EXTRA_ROOTS), so NeMo-RL runs
from the checkout's root here, as docs/nemo-rl.md says for 0.4.0. Two runs in one NeMo-RL process, on the same Gym
servers (the two configs describe the same ones): GRPO's validation and the eval config's trajectory collection (rows
repeated by ``data.validation.repeat``), both with the oracle."""

import pytest

from nemo_tau2.generation.smollm2 import smollm2_hf_dir
from nemo_tau2.testing import start_fake_server
from tests.env_python import environment_python
from tests.unit.gym.cli_shell import clean_copy, uv_cache_dir
from tests.unit.gym.nemo_rl_client import (
    CONFIGS,
    Run,
    check_metric_keys,
    check_oracle_batch,
    machine_overrides,
    nemo_rl_environment,
    prepare_rows,
    run_nemo_rl,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nemo_rl_runs(tmp_path_factory):
    python = environment_python("NEMO_TAU2_NEMO_RL_GYM04_PYTHON", "nemo-rl-gym04", "NeMo-RL on NeMo-Gym 0.4.0")
    checkout = clean_copy(tmp_path_factory.mktemp("nemo-tau2"))
    for split in ("train", "test"):
        prepare_rows(checkout, f"data/tau2/{split}.jsonl", "--split", split, "--num-tasks", "1")
    base = machine_overrides(smollm2_hf_dir(), uv_cache_dir())
    with start_fake_server(mode="subprocess") as fake:
        runs = [
            Run("grpo", str(CONFIGS / "grpo_tau2.yaml"), fake.base_url,
                [*base, "grpo.val_num_generations_per_prompt=2"]),
            Run("eval", str(CONFIGS / "eval_tau2.yaml"), fake.base_url, [*base, "data.validation.repeat=2"]),
        ]  # fmt: skip
        env = nemo_rl_environment(
            python, USER_SIM_BASE_URL=fake.base_url, USER_SIM_MODEL="fake-model", USER_SIM_API_KEY="EMPTY"
        )
        return run_nemo_rl(python, runs, checkout, checkout / "summary.json", env)


def test_grpo_on_nemo_gym_0_4_converts_every_turn_and_batches(nemo_rl_runs):
    run = nemo_rl_runs["grpo"]
    assert not run["is_trajectory_collection"] and run["validation_rows"] == 3
    (batch,) = run["batches"]
    check_oracle_batch(batch, episodes=6)
    check_metric_keys(batch)
    log = nemo_rl_runs["_log"]
    assert "+ nemo-gym==0.4.0" in log and "unsatisfiable" not in log  # our servers beside 0.4.0, on its openai


def test_the_eval_config_collects_the_repeated_rows(nemo_rl_runs):
    run = nemo_rl_runs["eval"]
    assert run["is_trajectory_collection"] and run["validation_rows"] == 6  # 3 tasks, data.validation.repeat=2
    (batch,) = run["batches"]
    check_oracle_batch(batch, episodes=6)
    check_metric_keys(batch)
