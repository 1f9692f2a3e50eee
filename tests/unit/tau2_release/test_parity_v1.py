"""nemo-tau2 on tau2 v1.0.1 scores every base task of airline, retail and telecom as tau2 v1.0.1 itself does.

Both sides play the same scripted episodes (``episode_scripts``: the oracle and perturbations per task) against the
same scripted NL-assertion judge: ours through :class:`Tau2Worker` (seeding, tool calls, the trajectory we build,
``verify``), tau2's through ``v1_reference.py``, tau2's own parts in its own process. Rewards, reward breakdowns
and every tool answer (error strings included) must be identical. Both sides run at once (one subprocess each).
"""

import json
import subprocess
from pathlib import Path

import pytest

from nemo_tau2.tau2_release.client import Tau2Worker
from nemo_tau2.tau2_release.config import NLJudgeConfig, Tau2ReleaseConfig
from nemo_tau2.testing.scripted_judge import ScriptedJudge
from tests.tau2_v1_env import tau2_v1_python
from tests.unit.tau2_release.episode_scripts import JUDGE_FAIL_MARKER, episode_scripts
from tests.unit.tau2_release.worker_episodes import play, summary

DOMAINS = ("airline", "retail", "telecom")
REFERENCE = Path(__file__).with_name("v1_reference.py")


@pytest.fixture(scope="module")
def judge():
    server = ScriptedJudge(fail_marker=JUDGE_FAIL_MARKER)
    yield server
    server.close()


@pytest.fixture(scope="module")
def worker(judge):
    config = Tau2ReleaseConfig(
        version="v1.0.1", python=tau2_v1_python(), judge=NLJudgeConfig(model="scripted-judge", base_url=judge.base_url)
    )
    with Tau2Worker(config) as started:
        yield started


def judged(task: dict) -> bool:
    criteria = task["evaluation_criteria"] or {}
    return "NL_ASSERTION" in criteria.get("reward_basis", []) and bool(criteria.get("nl_assertions"))


def compare(worker: Tau2Worker, judge, max_tasks: int | None = None) -> tuple[dict, list[str]]:
    """Both sides on the first ``max_tasks`` base tasks of each domain (None: all); returns our results and the
    tasks the judge graded."""
    greeting = worker.request("greeting")
    tasks = {domain: worker.request("tasks", domain=domain, split="base")[:max_tasks] for domain in DOMAINS}
    chosen = {domain: [task["id"] for task in tasks[domain]] for domain in DOMAINS} if max_tasks else None
    reference = subprocess.Popen(
        [tau2_v1_python(), str(REFERENCE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    reference.stdin.write(json.dumps({"domains": DOMAINS, "judge_base_url": judge.base_url, "task_ids": chosen}))
    reference.stdin.close()  # tau2 works while we do

    ours, judged_tasks = {}, []
    for domain in DOMAINS:
        for task in tasks[domain]:
            if judged(task):
                judged_tasks.append(f"{domain}/{task['id']}")
            for name, script in episode_scripts(task, greeting).items():
                ours[f"{domain}/{task['id']}/{name}"] = summary(play(worker, domain, task["id"], script))

    theirs = json.loads(reference.stdout.read())
    assert reference.wait() == 0
    assert ours.keys() == theirs.keys()
    mismatches = [key for key in ours if ours[key] != theirs[key]]
    example = mismatches[0] if mismatches else None
    assert not mismatches, f"{len(mismatches)} differ, e.g. {example}: {ours.get(example)} vs {theirs.get(example)}"
    return ours, judged_tasks


def test_every_base_task_scores_as_tau2_v1_scores_it(worker, judge):
    ours, judged_tasks = compare(worker, judge)

    counts = {domain: sum(key.startswith(f"{domain}/") for key in ours) for domain in DOMAINS}
    assert counts == {"airline": 150, "retail": 342, "telecom": 342}, counts
    # The scripts exercise what they claim: every oracle passes, every wrong message fails, NL tasks were judged.
    assert all(ours[key]["reward"] == 1.0 for key in ours if key.endswith("/oracle"))
    assert len(judged_tasks) == 40 and all(task.startswith("retail/") for task in judged_tasks)
    assert all(ours[f"{task}/wrong_message"]["reward"] == 0.0 for task in judged_tasks)
    assert judge.requests >= 2 * 2 * len(judged_tasks)  # each judged episode asked the judge once per side
