"""NeMo-RL's own Gym path (test_nemo_rl_client.py) on NeMo-Gym 0.4.0, the release our main environment has (Python
3.12): the same NeMo-RL code and shipped configs, in the environment ``scripts/setup.sh nemo-rl-gym04`` builds. 0.4.0
finds servers only under the working directory or its own install (it has no NEMO_GYM_EXTRA_ROOTS), so NeMo-RL runs
from the checkout's root here, as docs/nemo-rl.md says for 0.4.0. Two runs in one NeMo-RL process, on the same Gym
servers (the two configs describe the same ones): GRPO's validation and the eval config's trajectory collection (rows
repeated by ``data.validation.repeat``), both with the oracle; and a real model, SmolLM2-135M on llama.cpp, playing
tau2's mock domain (its reward is whatever it earns; what is checked is that a non-oracle episode converts and
batches)."""

import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from nemo_tau2.generation.smollm2 import smollm2_hf_dir
from nemo_tau2.gym.launch import free_port
from nemo_tau2.testing import start_fake_server
from tests.env_python import environment_python
from tests.unit.gym.cli_shell import clean_copy, uv_cache_dir
from tests.unit.gym.nemo_rl_client import (
    CONFIGS,
    Run,
    check_metric_keys,
    machine_overrides,
    nemo_rl_environment,
    oracle_batch,
    prepare_rows,
    run_nemo_rl,
)


@pytest.fixture(scope="module")
def smollm2_server():
    """SmolLM2-135M-Instruct on llama.cpp, serving under its tokenizer folder's path (what NeMo-RL names the model)."""
    name = str(smollm2_hf_dir())
    port = free_port()
    command = [sys.executable, "-m", "nemo_tau2.generation.llamacpp_server", "--port", str(port), "--n-ctx", "8192"]
    command += ["--n-parallel", "1", "--n-threads", "1", "--served-model-name", name]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", server)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def _wait_healthy(base: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"the llama.cpp server exited with {server.returncode}")
        try:
            urllib.request.urlopen(f"{base}/health", timeout=2).close()
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(1)
    pytest.fail("the llama.cpp server did not answer /health in 180 s")


@pytest.fixture(scope="module")
def nemo_rl_runs(tmp_path_factory, smollm2_server):
    python = environment_python("NEMO_TAU2_NEMO_RL_GYM04_PYTHON", "nemo-rl-gym04", "NeMo-RL on NeMo-Gym 0.4.0")
    checkout = clean_copy(tmp_path_factory.mktemp("nemo-tau2"))
    prepare_rows(checkout, "data/tau2/test.jsonl", "--split", "test", "--num-tasks", "1")
    prepare_rows(checkout, "data/tau2/mock.jsonl", "--domains", "mock", "--split", "base", "--num-tasks", "1")
    shutil.copy(checkout / "data/tau2/test.jsonl", checkout / "data/tau2/train.jsonl")  # NeMo-RL reads both
    base = machine_overrides(smollm2_hf_dir(), uv_cache_dir())
    with start_fake_server(mode="subprocess") as fake:
        runs = [
            Run("grpo", str(CONFIGS / "grpo_tau2.yaml"), fake.base_url,
                [*base, "grpo.val_num_generations_per_prompt=2"]),
            Run("eval", str(CONFIGS / "eval_tau2.yaml"), fake.base_url, [*base, "data.validation.repeat=2"]),
            Run("grpo_smollm2_mock", str(CONFIGS / "grpo_tau2.yaml"), smollm2_server, [
                *base,
                "++env.nemo_gym.skip_venv_if_present=true",
                "data.train.data_path=data/tau2/mock.jsonl",
                "data.validation.data_path=data/tau2/mock.jsonl",
                "++env.nemo_gym.tau2_agent.responses_api_agents.tau2_agent.domains=[mock]",
                "++env.nemo_gym.tau2_resources_server.resources_servers.tau2.domains=[mock]",
                "++env.nemo_gym.tau2_agent.responses_api_agents.tau2_agent.max_steps=6",
                "policy.generation.max_new_tokens=48",
                "policy.max_total_sequence_length=8192",
            ]),
        ]  # fmt: skip
        env = nemo_rl_environment(
            python, USER_SIM_BASE_URL=fake.base_url, USER_SIM_MODEL="fake-model", USER_SIM_API_KEY="EMPTY"
        )
        return run_nemo_rl(python, runs, checkout, checkout / "summary.json", env)


def test_grpo_on_nemo_gym_0_4_converts_every_turn_and_batches(nemo_rl_runs):
    oracle_batch(nemo_rl_runs["grpo"], collection=False, rows=3, episodes=6)
    log = nemo_rl_runs["_log"]
    assert "+ nemo-gym==0.4.0" in log and "unsatisfiable" not in log  # our servers beside 0.4.0, on its openai


def test_the_eval_config_collects_the_repeated_rows(nemo_rl_runs):
    # 3 tasks, data.validation.repeat=2
    oracle_batch(nemo_rl_runs["eval"], collection=True, rows=6, episodes=6)


def test_a_real_model_episode_converts_and_batches(nemo_rl_runs):
    run = nemo_rl_runs["grpo_smollm2_mock"]
    (batch,) = run["batches"]
    assert batch["batch_size"] == 1 and batch["episodes"][0]["domain"] == "mock"
    assert batch["rewards"][0] in (0.0, 1.0)  # what a 135M model earns; tau2 scored it
    assert batch["loss_mask_tokens"] == batch["generated_tokens"] and batch["generated_tokens"][0] > 0
    assert batch["logprobs_outside_mask"] == 0.0 and batch["sample_mask"] == [1.0]
    check_metric_keys(batch)
