"""Secrets and sessions: an endpoint's API key reaches only the model server that calls that endpoint, through a
pipe (never a process's environment, not even that server's, any command line, log, config dump or result); a
session cookie cannot be forged from a known session id; idle sessions and old verdicts are evicted on a timer,
not only when the next request comes."""

import base64
import json
import os
import time
from pathlib import Path

import itsdangerous
import pytest
import requests
from omegaconf import OmegaConf

from nemo_tau2.config import apply_overrides, load_config
from nemo_tau2.evals.eval import environment_spec, run_eval, setup_eval
from nemo_tau2.gym.environment import Tau2Environment
from nemo_tau2.gym.launch import GymServers
from nemo_tau2.gym.resources_server.bodies import verify_body
from nemo_tau2.gym.stack import POLICY_MODEL
from nemo_tau2.tau2_env.gym_rows import task_row
from nemo_tau2.testing import start_fake_server
from tests.unit.gym.conftest import RESOURCES_SERVER, resources_server_spec
from tests.unit.recording_proxy import RecordingProxy

KEY_VARIABLE = "NEMO_TAU2_TEST_POLICY_KEY"
SECRET = "sk-test-" + os.urandom(12).hex()
OTHER_CREDENTIAL = "hf_" + os.urandom(12).hex()  # in our environment under a credential-looking name


def _descendants(pid: int) -> set[int]:
    found, frontier = set(), {pid}
    while frontier:
        parent = frontier.pop()
        for child in Path(f"/proc/{parent}/task/{parent}/children").read_text().split():
            found.add(int(child))
            frontier.add(int(child))
    return found


def _memory_of(pid: int) -> bytes:
    """The process's writable memory (heap, anonymous maps): where a key it had been given would be."""
    chunks = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as mem:
        for line in maps:
            fields = line.split()
            if "w" not in fields[1] or (len(fields) > 5 and fields[5].startswith("/")):
                continue
            start, end = (int(part, 16) for part in fields[0].split("-"))
            try:
                mem.seek(start)
                chunks.append(mem.read(end - start))
            except (OSError, ValueError, OverflowError):
                continue
    return b"".join(chunks)


def _seen_by(pid: int) -> tuple[bytes, bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes(), Path(f"/proc/{pid}/cmdline").read_bytes()


@pytest.fixture
def openai_policy_config(monkeypatch, tmp_path):
    """An evaluation whose policy is an OpenAI-compatible endpoint (the fake, behind a proxy that records the
    Authorization header of each request) with a key from the environment."""
    monkeypatch.setenv(KEY_VARIABLE, SECRET)
    monkeypatch.setenv("HF_TOKEN", OTHER_CREDENTIAL)
    with start_fake_server() as fake:
        proxy = RecordingProxy.start(fake.root_url)
        base_url = proxy.base_url
        openai_cfg = f"{{base_url: '{base_url}', model: fake-policy, api_key_env: {KEY_VARIABLE}}}"
        overrides = [f"eval.save_path={tmp_path / 'out'}", "data.domains=[airline]", "data.num_tasks=1",
                     "eval.num_tests_per_prompt=1", "eval.k_values=[1]", "eval.bootstrap_samples=0",
                     "policy.generation.backend=openai", f"+policy.generation.openai_cfg={openai_cfg}"]  # fmt: skip
        raw = apply_overrides(load_config("examples/configs/evals/tau2_fake.yaml"), overrides)
        try:
            yield raw
        finally:
            proxy.stop()


def test_the_api_key_reaches_only_the_policy_model_server(openai_policy_config, tmp_path):
    cfg = setup_eval(openai_policy_config)
    spec = environment_spec(cfg, [task_row("airline", "0")], tmp_path / "logs")
    with Tau2Environment(spec) as env:
        status = requests.post(env.agent_urls["tau2_agent"][0] + "/run", json=task_row("airline", "0"), timeout=300)
        assert status.status_code == 200 and status.json()["status"] == "ok"
        policy_calls = [auth for path, auth, _ in RecordingProxy.seen if path != "/v1/models"]
        assert policy_calls and set(policy_calls) == {f"Bearer {SECRET}"}  # the policy model server had the key
        servers: GymServers = env.servers
        processes = _descendants(os.getpid())
        assert {servers.pid(spec.name) for spec in servers.specs} <= processes
        for pid in processes:
            try:
                environ, cmdline = _seen_by(pid)
            except FileNotFoundError:
                continue  # exited meanwhile
            assert SECRET.encode() not in cmdline, f"pid {pid} has the key on its command line"
            assert SECRET.encode() not in environ, f"pid {pid} has the key in its environment"
            if pid in {servers.pid(spec.name) for spec in servers.specs}:
                assert OTHER_CREDENTIAL.encode() not in environ, f"Gym server pid {pid} inherited HF_TOKEN"
        assert SECRET not in OmegaConf.to_yaml(servers.global_config)
        for name in (spec.name for spec in servers.specs if spec.name != POLICY_MODEL):
            assert SECRET.encode() not in _memory_of(servers.pid(name)), f"{name} holds the key"
    for path in (tmp_path / "logs").rglob("*"):
        assert not path.is_file() or SECRET.encode() not in path.read_bytes(), path


def test_no_result_config_dump_or_log_of_an_evaluation_holds_the_key(openai_policy_config):
    summary, _ = run_eval(setup_eval(openai_policy_config), openai_policy_config)
    assert summary["metrics"]["eval/overall/num_episodes"] == 1
    save_path = Path(openai_policy_config.eval.save_path)
    files = [path for path in save_path.rglob("*") if path.is_file()]
    assert {"config.json", "rollouts.jsonl", "summary.json"} <= {path.name for path in files}
    assert any(path.suffix == ".log" for path in files)  # the servers' logs are there too
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path


# ---------------------------------------------------------------- sessions

# Long enough that two requests in a row on a loaded box fall inside it (1 s did not: stop 61's CI saw the idle
# session gone before the stats read that followed its seed and another session's seed and verify).
IDLE_S = 3.0


@pytest.fixture(scope="module")
def resources_url():
    spec = resources_server_spec(domains=["airline"], session_idle_timeout_s=IDLE_S, verdict_ttl_s=IDLE_S)
    with GymServers([spec]) as servers:
        yield servers.url(RESOURCES_SERVER)


def _stats(url: str) -> dict:
    return requests.get(f"{url}/session_stats").json()


def test_a_cookie_signed_with_the_servers_old_guessable_secret_is_not_accepted(resources_url):
    owner = requests.Session()
    owner.post(f"{resources_url}/seed_session", json={"domain": "airline", "task_id": "0"}).raise_for_status()
    ((name, value),) = owner.cookies.items()
    payload = value.split(".")[0]
    session_id = json.loads(base64.b64decode(payload + "=" * (-len(payload) % 4)))["session_id"]
    # NeMo-Gym signs with the cookie's own name: anyone who knows a session id could forge its cookie.
    forged = itsdangerous.TimestampSigner(name).sign(base64.b64encode(json.dumps({"session_id": session_id}).encode()))
    attacker = requests.post(
        f"{resources_url}/get_user_details", json={"user_id": "mia_li_3668"}, cookies={name: forged.decode()}
    )
    assert attacker.status_code == 404  # a new, empty session: not the owner's episode
    assert owner.post(f"{resources_url}/get_user_details", json={"user_id": "mia_li_3668"}).status_code == 200
    owner.post(f"{resources_url}/end_session", json={})


def test_idle_sessions_and_old_verdicts_are_evicted_on_a_timer_without_any_request(resources_url):
    before = _stats(resources_url)
    idle = requests.Session()
    idle.post(f"{resources_url}/seed_session", json={"domain": "airline", "task_id": "0"}).raise_for_status()
    assert _stats(resources_url)["live_sessions"] == before["live_sessions"] + 1
    verified = requests.Session()
    verified.post(f"{resources_url}/seed_session", json={"domain": "airline", "task_id": "0"}).raise_for_status()
    assert verified.post(f"{resources_url}/verify", json=verify_body(["Done."])).status_code == 200
    assert _stats(resources_url)["verified_sessions_kept"] >= 1
    time.sleep(IDLE_S * 2.5)  # no request to the server meanwhile; reading the stats evicts nothing
    stats = _stats(resources_url)
    assert stats["live_sessions"] == 0 and stats["verified_sessions_kept"] == 0
    assert stats["evicted_idle_sessions"] == before["evicted_idle_sessions"] + 1
