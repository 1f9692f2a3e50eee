"""nemo-tau2 on tau2 v1.0.1 scores every base task of airline, retail and telecom as tau2 v1.0.1 itself does.

Both sides play the same scripted episodes (``episode_scripts``: the oracle and perturbations per task) against the
same scripted NL-assertion judge: ours through :class:`Tau2Worker` (seeding, tool calls, the trajectory we build,
``verify``), tau2's through ``v1_reference.py``, tau2's own parts in its own process. Rewards, reward breakdowns
and every tool answer (error strings included) must be identical, for the tasks whose gold side our worker warmed
when they were seeded (every other task: ``warm``, as the resources server asks) and for the rest. Both sides run
at once (one subprocess each).
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

from nemo_tau2.tau2_release.client import Tau2Worker
from tests.tau2_v1_env import tau2_v1_python
from tests.unit.tau2_release.episode_scripts import episode_scripts
from tests.unit.tau2_release.worker_episodes import play, summary

DOMAINS = ("airline", "retail", "telecom")
REFERENCE = Path(__file__).with_name("v1_reference.py")


def judged(task: dict) -> bool:
    criteria = task["evaluation_criteria"] or {}
    return "NL_ASSERTION" in criteria.get("reward_basis", []) and bool(criteria.get("nl_assertions"))


# What CI compares on every run (the whole base set, 834 episodes, is the opt-in test below; 10 min for the former
# 40-task selection on a loaded box was too much of CI): a share of the tasks whose gold writes v1.0.1 changed, the
# first retail tasks with NL assertions (the new judged scoring), the first two of each domain. The whole set took
# 1,310 s (passed, 2026-11-26, load average 6-7 on 2 cores) when our worker seeded and scored as tau2 does; since its
# DB snapshots and memoised hashes (nemo_tau2_tau2_snapshots) it took 628 s (passed, load average 4-5), of which our
# side (worker and client) was 26 s of CPU for the 834 episodes: the rest is the reference, tau2 v1.0.1 itself
# (v1_reference.py, 0.1-1.7 s an episode), which must stay the release's own unshortened code.
CHANGED_GOLD = {"airline": ["2", "23", "38", "44"], "retail": ["12", "107"]}
JUDGED_RETAIL_TASKS = 4
FULL_PARITY_ENV = "NEMO_TAU2_V1_FULL_PARITY"


def ci_selection(tasks: dict[str, list[dict]]) -> dict[str, list[dict]]:
    judged_retail = [task for task in tasks["retail"] if judged(task)][:JUDGED_RETAIL_TASKS]
    chosen = {}
    for domain in DOMAINS:
        ids = set(CHANGED_GOLD.get(domain, [])) | {task["id"] for task in tasks[domain][:2]}
        ids |= {task["id"] for task in judged_retail} if domain == "retail" else set()
        chosen[domain] = [task for task in tasks[domain] if task["id"] in ids]
    return chosen


def compare(worker: Tau2Worker, judge, full: bool) -> tuple[dict, list[str]]:
    """Both sides on every base task (``full``) or the CI selection; returns our results and the tasks the judge
    graded."""
    greeting = worker.request("greeting")
    tasks = {domain: worker.request("tasks", domain=domain, split="base") for domain in DOMAINS}
    if not full:
        tasks = ci_selection(tasks)
    chosen = None if full else {domain: [task["id"] for task in tasks[domain]] for domain in DOMAINS}
    reference = subprocess.Popen(
        [tau2_v1_python(), str(REFERENCE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    reference.stdin.write(json.dumps({"domains": DOMAINS, "judge_base_url": judge.base_url, "task_ids": chosen}))
    reference.stdin.close()  # tau2 works while we do

    ours, judged_tasks = {}, []
    for domain in DOMAINS:
        for index, task in enumerate(tasks[domain]):
            if index % 2:  # as the resources server does on a seed: the gold side hashed by a forked child
                worker.request("warm", domain=domain, task_id=task["id"])
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
    warming = worker.request("warming")
    assert warming["failed"] == 0 and warming["adopted"] > 0, warming  # half the tasks scored warmed, all as tau2
    return ours, judged_tasks


def test_changed_and_judged_tasks_score_as_tau2_v1_scores_them(worker, judge):
    ours, judged_tasks = compare(worker, judge, full=False)
    assert len(judged_tasks) >= JUDGED_RETAIL_TASKS
    assert all(ours[key]["reward"] == 1.0 for key in ours if key.endswith("/oracle"))
    assert all(ours[f"{task}/wrong_message"]["reward"] == 0.0 for task in judged_tasks)
    assert {key.split("/")[0] for key in ours} == set(DOMAINS)


@pytest.mark.skipif(
    os.environ.get(FULL_PARITY_ENV) != "1", reason=f"every base task (834 episodes): set {FULL_PARITY_ENV}=1"
)
def test_every_base_task_scores_as_tau2_v1_scores_it(worker, judge):
    ours, judged_tasks = compare(worker, judge, full=True)

    counts = {domain: sum(key.startswith(f"{domain}/") for key in ours) for domain in DOMAINS}
    assert counts == {"airline": 150, "retail": 342, "telecom": 342}, counts
    # The scripts exercise what they claim: every oracle passes, every wrong message fails, NL tasks were judged.
    assert all(ours[key]["reward"] == 1.0 for key in ours if key.endswith("/oracle"))
    assert len(judged_tasks) == 40 and all(task.startswith("retail/") for task in judged_tasks)
    assert all(ours[f"{task}/wrong_message"]["reward"] == 0.0 for task in judged_tasks)
    assert judge.requests >= 2 * 2 * len(judged_tasks)  # each judged episode asked the judge once per side
