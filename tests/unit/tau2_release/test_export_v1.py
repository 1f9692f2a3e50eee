"""Episodes scored by nemo-tau2 on tau2 v1.0.1, exported in v1.0.1's results format, are re-scored by tau2's own
``tau2 evaluate-trajs`` (in v1.0.1's environment, same scripted judge) to identical rewards."""

import json
import subprocess
from pathlib import Path

import pytest

from nemo_tau2.tau2_release.client import Tau2RequestError, Tau2Worker
from tests.tau2_v1_env import tau2_v1_python
from tests.unit.tau2_release.episode_scripts import episode_scripts
from tests.unit.tau2_release.worker_episodes import play

RESCORE = Path(__file__).with_name("v1_rescore.py")
RUN = {"llm_agent": "policy", "llm_user": "user-sim", "num_trials": 1, "max_steps": 200, "max_errors": 10, "seed": 300}
TASKS_PER_DOMAIN = 2  # 6 episodes a domain (oracle + 2 perturbations each): passes and failures


def scored_episodes(worker: Tau2Worker, domain: str) -> list[dict]:
    greeting = worker.request("greeting")
    episodes = []
    for task in worker.request("tasks", domain=domain, split="base")[:TASKS_PER_DOMAIN]:
        for script in episode_scripts(task, greeting).values():
            played = play(worker, domain, task["id"], script)
            episodes.append(
                {
                    "task_id": task["id"],
                    "messages": played["messages"],
                    "termination_reason": script["termination_reason"],
                    "reward_info": played["reward_info"],
                    "trial": 0,
                    "seed": 300,
                }
            )
    return episodes


DOMAINS = ("airline", "retail", "telecom")


@pytest.fixture(scope="module")
def rescored(worker, judge, tmp_path_factory) -> dict[str, tuple[list[dict], dict]]:
    """Per domain: our scored episodes, and tau2's re-scoring of their export (one ``evaluate-trajs`` for all)."""
    folder = tmp_path_factory.mktemp("export")
    episodes = {domain: scored_episodes(worker, domain) for domain in DOMAINS}
    files = [str(folder / f"{domain}.json") for domain in DOMAINS]
    for domain, path in zip(DOMAINS, files, strict=True):
        worker.request("export", path=path, domain=domain, run=RUN, episodes=episodes[domain])
    rescored_dir = folder / "rescored"
    done = subprocess.run(
        [tau2_v1_python(), str(RESCORE), judge.base_url, str(rescored_dir), *files],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return {d: (episodes[d], json.loads((rescored_dir / f"updated_{d}.json").read_text())) for d in DOMAINS}


@pytest.mark.parametrize("domain", DOMAINS)
def test_tau2_evaluate_trajs_rescores_our_export_to_the_same_rewards(rescored, domain):
    episodes, rescored_file = rescored[domain]
    ours = [episode["reward_info"]["reward"] for episode in episodes]
    theirs = [simulation["reward_info"]["reward"] for simulation in rescored_file["simulations"]]
    assert theirs == ours
    assert 0.0 in ours and 1.0 in ours  # the export holds passes and failures
    info = rescored_file["info"]
    assert info["user_info"]["llm"] == "user-sim" and info["agent_info"]["llm"] == "policy"


def test_export_refuses_bad_run_settings_in_one_line(worker, tmp_path):
    with pytest.raises(Tau2RequestError, match="run settings"):
        worker.request("export", path=str(tmp_path / "x.json"), domain="retail", run={"num_trials": "x"}, episodes=[])
