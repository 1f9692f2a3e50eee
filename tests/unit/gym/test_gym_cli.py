"""Our Gym servers under NeMo-Gym's own CLI, typed as docs/nemo-gym-cli.md types it: in a clean copy
of the repository (what CI checks out), an ``env.yaml`` with the policy and user endpoints (the scripted fake
server), ``ng_run`` with NeMo-Gym's default per-server virtualenvs (built from each folder's requirements.txt),
then ``ng_collect_rollouts`` and ``gym eval run --no-serve`` over the example rows. A SIGTERM, and a start that fails
(through ``gym env start``, the newer spelling), leave no process of the session behind (``ps -s``: Ray included).

It runs on both NeMo-Gym releases: here on 0.4.0, and in NeMo-Gym 0.7.0's Python 3.13 environment through
test_nemo_gym_0_7.py, where the CLI is 0.7.0's and the servers' virtualenvs resolve ``-e ../..`` to nemo-gym 0.7.0.

The only setting beyond the endpoints is NeMo-Gym's own ``uv_cache_dir`` (in ``env.yaml``), pointed at uv's cache,
which ``uv sync`` has filled: the virtualenvs are then linked from it instead of downloaded again (~1.8 GB).
"""

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

import pytest

from nemo_tau2.gym.launch import free_port
from nemo_tau2.tau2_release.client import Tau2Worker
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig
from nemo_tau2.tau2_release.template import TEMPLATE_ENV
from nemo_tau2.testing import start_fake_server
from nemo_tau2.testing.release_tasks import write_release_tasks
from tests.tau2_v1_env import tau2_v1_python
from tests.unit.gym.cli_shell import clean_copy, shell_path, uv_cache_dir

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
CONFIGS = [
    "resources_servers/tau2/configs/tau2.yaml",
    "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml",
    "responses_api_agents/tau2_agent/configs/user_model.yaml",
]
# NeMo-Gym 0.7.0 reaches agents only through environment servers: ours is declared (no deprecation), and 0.7.0 is run
# as the release that will reject agents without one does
ENVIRONMENT_SERVERS = tuple(int(part) for part in version("nemo-gym").split(".")[:2]) >= (0, 7)
if ENVIRONMENT_SERVERS:
    CONFIGS.append("responses_api_agents/tau2_agent/configs/environment_server.yaml")
STRICT = ["+error_on_agent_without_environment_server=true"] if ENVIRONMENT_SERVERS else []
NG_RUN = [str(BIN / "ng_run"), *(arg for path in CONFIGS for arg in ("--config", path))]
# banking_knowledge's config in tau2.yaml's place (the same server names), its resources server on tau2 v1.0.1
BANKING_NG_RUN = [arg.replace("tau2.yaml", "tau2_banking.yaml") for arg in NG_RUN]
GYM_ENV_START = [str(BIN / "gym"), "env", "start", *NG_RUN[1:]]  # the same servers through NeMo-Gym's newer CLI
START_TIMEOUT_S = 600
BANKING = "banking_knowledge"


def _cli_environment() -> dict[str, str]:
    """The user's shell: the project's environment on PATH (``ng_run``, ``gym``), the real ``uv`` (not pyenv's shim,
    which NeMo-Gym's servers cannot run from their folders: cli_shell) and the Python it was made from, nothing else
    of ours."""
    ours = ("NEMO_GYM_", "VIRTUAL_ENV", "UV_RUN_RECURSION_DEPTH", "RAY_ENABLE_UV_RUN_RUNTIME_ENV", "PYTEST_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(ours) and k not in ("UV", "PYTHONPATH")}
    env.pop(TEMPLATE_ENV, None)  # its servers' tau2 workers started as a user's are: in ng_run's session
    env["PATH"] = shell_path(BIN)
    # A shell that ran `.ci/run` (or the README's `uv sync` with a chosen interpreter) has UV_PYTHON naming the base
    # Python: the servers' venvs must get their packages all the same.
    env["UV_PYTHON"] = env.get("UV_PYTHON", sys._base_executable)
    # A Ray of its own, as docs/nemo-gym-cli.md says to start ng_run: else it joins whatever Ray runs on the machine
    # (here another test's cluster, whose end took the servers down mid-start)
    env["RAY_ADDRESS"] = "local"
    if (3, 13) <= sys.version_info[:3] < (3, 13, 14):  # as docs/nemo-gym-cli.md says for a 3.13 older than 0.7.0's
        env["UV_CONFIG_FILE"] = str(ROOT / "scripts" / "uv_python_3.13.14.toml")
    return env


def _session_processes(session_id: int) -> list[str]:
    listing = subprocess.run(["ps", "-o", "pid=,args=", "-s", str(session_id)], capture_output=True, text=True)
    return [line.strip() for line in listing.stdout.splitlines() if line.strip()]


def _start_servers(command: list[str], copy: Path, log: Path, *overrides: str) -> subprocess.Popen:
    # Its own session: like a terminal's job, and the test can count what it leaves behind.
    with log.open("w") as out:
        return subprocess.Popen(
            [*command, *overrides],
            cwd=copy,
            env=_cli_environment(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_for_no_process(session_id: int, timeout_s: float) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while (left := _session_processes(session_id)) and time.monotonic() < deadline:
        time.sleep(1)
    return left


@pytest.fixture(scope="module")
def gym_copy(tmp_path_factory):
    """A clean copy with an ``env.yaml`` pointing both endpoints at a scripted fake server."""
    copy = clean_copy(tmp_path_factory.mktemp("clone"))
    uv_cache = uv_cache_dir()
    scripts = {}
    if ENVIRONMENT_SERVERS:  # the banking test's oracle plays the release's tasks
        with Tau2Worker(Tau2ReleaseConfig(version="v1.0.1", python=tau2_v1_python())) as worker:
            tasks = {BANKING: worker.request("tasks", domain=BANKING, split=None)}
        scripts = {"release_tasks": str(write_release_tasks(tmp_path_factory.mktemp("tasks") / "banking.json", tasks))}
    with start_fake_server(mode="subprocess", tau2=scripts) as fake:
        (copy / "env.yaml").write_text(
            f"policy_base_url: {fake.base_url}\npolicy_api_key: EMPTY\npolicy_model_name: fake-model\n"
            f"user_base_url: {fake.base_url}\nuser_api_key: EMPTY\nuser_model_name: fake-model\n"
            f"uv_cache_dir: {uv_cache}\nhead_server:\n  host: 127.0.0.1\n  port: {free_port()}\n"
        )
        yield copy


def _run_cli(copy: Path, *command: str) -> str:
    done = subprocess.run(list(command), cwd=copy, env=_cli_environment(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return done.stdout + done.stderr


def _rewards(path: Path) -> list[float]:
    return [json.loads(line)["reward"] for line in path.read_text().splitlines()]


def test_gym_validates_our_configs_and_names_a_missing_user_model(tmp_path):
    endpoints = [f"+{role}_{key}=x" for role in ("policy", "user") for key in ("base_url", "api_key", "model_name")]
    log_dir = f"hydra.run.dir={tmp_path}"  # its log, not outputs/ in the checkout (the configs' paths need ROOT)
    ok = subprocess.run(
        [str(BIN / "gym"), "env", "validate", *NG_RUN[1:], *endpoints, log_dir],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert ok.returncode == 0 and "Config is valid" in ok.stdout + ok.stderr, ok.stdout + ok.stderr
    missing = subprocess.run(
        [str(BIN / "gym"), "env", "validate", *NG_RUN[1:5], *endpoints[:3], log_dir],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert "references responses_api_models/'user_model', which is not defined" in " ".join(
        (missing.stdout + missing.stderr).split()
    )


@contextmanager
def _serving(command: list[str], copy: Path, log: Path, *overrides: str) -> Iterator[None]:
    """``command`` (``ng_run``) until its servers are ready; on exit a SIGTERM, as kill or a job scheduler stops it
    (Ctrl-C, SIGINT, left none either), and every process of its session gone, Ray's agents from ng_run's
    ray.init() too (after a SIGTERM they outlived ng_run by ~65 s before our servers left a reaper for them)."""
    ng_run = _start_servers(command, copy, log, *overrides)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "servers ready!" not in log.read_text(errors="replace"):
            assert ng_run.poll() is None, log.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, f"ng_run not up in {START_TIMEOUT_S} s"
            time.sleep(1)
        yield
    finally:
        if ng_run.poll() is None:
            os.kill(ng_run.pid, signal.SIGTERM)
        try:
            ng_run.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(ng_run.pid, signal.SIGKILL)
    left = _wait_for_no_process(ng_run.pid, 30)
    if left:
        os.killpg(ng_run.pid, signal.SIGKILL)
    assert left == []


def test_ng_run_with_default_venvs_then_collect_rollouts_and_gym_eval_run(gym_copy):
    log = gym_copy / "ng_run.log"
    with _serving(NG_RUN, gym_copy, log, *STRICT):
        for server in ("resources_servers/tau2", "responses_api_agents/tau2_agent"):
            assert (gym_copy / server / ".venv" / "bin" / "python").exists()  # NeMo-Gym built its own venv
        started = log.read_text(errors="replace")
        assert "agents without an environment server" not in started
        assert ("All 5 / 5 servers ready" if ENVIRONMENT_SERVERS else "All 4 / 4 servers ready") in started
        (gym_copy / "results").mkdir()
        output = _run_cli(
            gym_copy,
            str(BIN / "ng_collect_rollouts"),
            "+agent_name=tau2_agent",
            "+input_jsonl_fpath=resources_servers/tau2/data/example.jsonl",
            "+output_jsonl_fpath=results/rollouts.jsonl",
            "+limit=3",
        )
        assert '"mean/reward": 1.0' in output
        assert _rewards(gym_copy / "results/rollouts.jsonl") == [1.0, 1.0, 1.0]
        _run_cli(
            gym_copy,
            str(BIN / "gym"),
            "eval",
            "run",
            "--no-serve",
            "--agent",
            "tau2_agent",
            "--input",
            "resources_servers/tau2/data/example.jsonl",
            "--output",
            "results/eval.jsonl",
            "--limit",
            "2",
        )
        assert _rewards(gym_copy / "results/eval.jsonl") == [1.0, 1.0]


@pytest.mark.skipif(
    not ENVIRONMENT_SERVERS,
    reason="runs in NeMo-Gym 0.7.0's environment (test_nemo_gym_0_7.py), the release NeMo-Gym users have: one ng_run "
    "of banking is enough for CI's time (on 0.4.0 it passed too, 2026-11-29)",
)
def test_ng_run_serves_banking_knowledge_from_its_config(gym_copy):
    """resources_servers/tau2/configs/tau2_banking.yaml as its comment types it (tau2 v1.0.1's interpreter given on
    the command line), on the venvs the test above built (NeMo-Gym's ``skip_venv_if_present``, as the failed-start
    test below: resolving five venvs again took ~20 s of its 44 s and is not what it checks; built here when that
    test did not run): the oracle's rollouts of the example rows score 1.0, each with what it retrieved and
    unlocked."""
    python = f"++tau2_resources_server.resources_servers.tau2.tau2.python={tau2_v1_python()}"
    log = gym_copy / "ng_run_banking.log"
    with _serving(BANKING_NG_RUN, gym_copy, log, *STRICT, python, "+skip_venv_if_present=true"):
        (gym_copy / "results").mkdir(exist_ok=True)
        output = _run_cli(
            gym_copy,
            str(BIN / "ng_collect_rollouts"),
            "+agent_name=tau2_agent",
            "+input_jsonl_fpath=resources_servers/tau2/data/example_banking.jsonl",
            "+output_jsonl_fpath=results/banking.jsonl",
        )
    assert '"mean/reward": 1.0' in output
    rollouts = [json.loads(line) for line in (gym_copy / "results/banking.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in rollouts] == [1.0, 1.0, 1.0]
    assert {r["retrieval_variant"] for r in rollouts} == {"bm25_grep"}
    assert all(r["retrieval"]["unlock_recall"] in (1.0, None) and r["retrieval"]["searches"] == [] for r in rollouts)


def test_a_failed_start_leaves_no_process_behind(gym_copy):
    """A config error in one server, started with ``gym env start`` (NeMo-Gym's newer spelling of ``ng_run``): it
    gives up, and neither the servers it had started (ours and NeMo-Gym's own model servers) nor its Ray cluster
    outlive it. The servers' venvs are the ones the default-venv test built (NeMo-Gym's ``skip_venv_if_present``;
    built here when that test did not run): building them again cost ~50 s and is not what this test checks."""
    log = gym_copy / "gym_env_start_failing.log"
    failing = "++tau2_agent.responses_api_agents.tau2_agent.max_steps=0"
    start = _start_servers(GYM_ENV_START, gym_copy, log, "+skip_venv_if_present=true", failing)
    try:
        start.wait(timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(start.pid, signal.SIGKILL)
        pytest.fail("gym env start did not give up on a server that cannot start: " + log.read_text()[-3000:])
    text = log.read_text(errors="replace")
    assert start.returncode != 0 and "Process `tau2_agent` finished unexpectedly" in text, text[-3000:]
    left = _wait_for_no_process(start.pid, 30)
    if left:
        os.killpg(start.pid, signal.SIGKILL)
    assert left == []
