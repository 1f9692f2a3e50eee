"""Our Gym servers under NeMo-Gym's own tooling: `gym env validate` and `gym env start` (with Ray and its head
server, NeMo-Gym's own vllm_model, per-server virtualenvs) play a tau2 episode unchanged.

NeMo-Gym builds one virtualenv per server from its requirements.txt; with `+skip_venv_if_present=true` and
`+uv_venv_dir` pointing at links to this project's environment it reuses ours instead of downloading packages.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from nemo_tau2.gym.launch import free_port
from nemo_tau2.tau2_env.gym_rows import task_row
from nemo_tau2.testing import start_fake_server

ROOT = Path(__file__).resolve().parents[3]
GYM = str(Path(sys.executable).parent / "gym")
CONFIGS = [
    "resources_servers/tau2/configs/tau2.yaml",
    "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml",
    "responses_api_agents/tau2_agent/configs/user_model.yaml",
]


def _endpoints(policy_url: str, user_url: str) -> list[str]:
    return [
        f"+policy_base_url={policy_url}",
        "+policy_api_key=EMPTY",
        "+policy_model_name=fake",
        f"+user_base_url={user_url}",
        "+user_api_key=EMPTY",
        "+user_model_name=fake",
    ]


def _config_args(configs: list[str]) -> list[str]:
    return [arg for path in configs for arg in ("--config", path)]


def test_gym_validates_our_configs_and_names_a_missing_user_model():
    ok = subprocess.run(
        [GYM, "env", "validate", *_config_args(CONFIGS), *_endpoints("http://a/v1", "http://b/v1")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert ok.returncode == 0 and "Config is valid" in ok.stdout + ok.stderr, ok.stdout + ok.stderr
    missing = subprocess.run(
        [GYM, "env", "validate", *_config_args(CONFIGS[:2]), *_endpoints("http://a/v1", "x")[:3]],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert "references responses_api_models/'user_model', which is not defined" in " ".join(
        (missing.stdout + missing.stderr).split()
    )


def test_gym_env_start_runs_our_servers_and_plays_an_episode(tmp_path):
    for server_dir in ("resources_servers/tau2", "responses_api_agents/tau2_agent", "responses_api_models/vllm_model"):
        (tmp_path / server_dir).mkdir(parents=True)
        os.symlink(Path(sys.executable).parents[1], tmp_path / server_dir / ".venv")
    agent_port, head_port = free_port(), free_port()
    with start_fake_server(mode="subprocess") as fake:
        command = [
            GYM,
            "env",
            "start",
            *_config_args(CONFIGS),
            *_endpoints(fake.base_url, fake.base_url),
            "++policy_model.responses_api_models.vllm_model.uses_reasoning_parser=false",
            f"++tau2_agent.responses_api_agents.tau2_agent.port={agent_port}",
            f"++head_server.port={head_port}",
            "++head_server.host=127.0.0.1",
            "+skip_venv_if_present=true",
            f"+uv_venv_dir={tmp_path}",
        ]
        log = (tmp_path / "gym.log").open("w")
        gym = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            agent = f"http://127.0.0.1:{agent_port}"
            deadline = time.monotonic() + 300
            while True:
                assert gym.poll() is None, (tmp_path / "gym.log").read_text(errors="replace")[-3000:]
                assert time.monotonic() < deadline, "gym env start did not bring the agent up in 300 s"
                try:
                    requests.get(agent + "/", timeout=2)
                    break
                except requests.ConnectionError:
                    time.sleep(1)
            response = requests.post(agent + "/run", json=task_row("airline", "11"), timeout=300)
            body = response.json()
            assert response.status_code == 200, body
            assert (body["reward"], body["termination_reason"], body["status"]) == (1.0, "user_stop", "ok")
            assert any(item.get("generation_token_ids") for item in body["response"]["output"])
        finally:
            os.killpg(gym.pid, signal.SIGINT)
            try:
                gym.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(gym.pid, signal.SIGKILL)
                gym.wait()
