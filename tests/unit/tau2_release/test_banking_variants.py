"""banking_knowledge on every other offline retrieval variant tau2 v1.0.1 has (bm25_grep, the default, is
test_banking_knowledge.py's and test_parity_v1.py's): ``no_knowledge``, ``full_kb``, ``golden_retrieval``, ``bm25``
and ``grep_only``. For each, our worker built with the variant plays the oracle of every fourth task (all 97 with
``--all-base-tasks``, as before a release: 97 of 97 on each, 2026-11-29), each 1.0 (task_102 through the scripted
judge), and every 24th task's oracle and perturbations are also scored by tau2 v1.0.1's own run of the variant, while
ours plays: rewards, breakdowns and every tool answer identical (the variants differ in the tools the agent has, so
``extra_reads`` gets each variant's own answer: a search, or tau2's error for a tool it lacks). About 20 s a variant
on 2 cores."""

import pytest

from nemo_tau2.tau2_release.client import Tau2Worker
from nemo_tau2.tau2_release.config import NLJudgeConfig, Tau2ReleaseConfig
from tests.tau2_v1_env import tau2_v1_python
from tests.unit.tau2_release.episode_scripts import episode_scripts
from tests.unit.tau2_release.test_parity_v1 import assert_same_as_tau2, reference_results, start_references
from tests.unit.tau2_release.worker_episodes import play, play_every_script

DOMAIN = "banking_knowledge"
OFFLINE_VARIANTS = ["no_knowledge", "full_kb", "golden_retrieval", "bm25", "grep_only"]


@pytest.mark.parametrize("variant", OFFLINE_VARIANTS)
def test_the_oracle_scores_one_and_a_sample_scores_as_tau2_scores_it(variant, judge, request):
    every_task = request.config.getoption("--all-base-tasks")
    config = Tau2ReleaseConfig(
        version="v1.0.1",
        python=tau2_v1_python(),
        judge=NLJudgeConfig(model="scripted-judge", base_url=judge.base_url),
        retrieval_variant=variant,
    )
    with Tau2Worker(config) as worker:
        assert worker.retrieval["variant"] == variant
        greeting = worker.request("greeting")
        tasks = worker.request("tasks", domain=DOMAIN, split="base")
        sampled = tasks[::24]
        references = start_references({DOMAIN: sampled}, judge.base_url, retrieval_variant=variant)
        ours = play_every_script(worker, DOMAIN, sampled, greeting)
        others = [task for task in (tasks if every_task else tasks[::4]) if task not in sampled]
        oracle = {task["id"]: play(worker, DOMAIN, task["id"], episode_scripts(task, greeting)["oracle"])["reward"]
                  for task in others}  # fmt: skip
        assert_same_as_tau2(ours, reference_results(references))  # tau2's own run, done while ours played
    assert len(tasks) == 97 and len(sampled) == 5
    oracle |= {key.split("/")[1]: value["reward"] for key, value in ours.items() if key.endswith("/oracle")}
    assert sorted(task_id for task_id, reward in oracle.items() if reward != 1.0) == []
    assert len(oracle) == (97 if every_task else 25)
    for kind in ("call_without_unlock", "no_verification"):  # perturbations tau2 sees on this variant too
        assert any(key.endswith(f"/{kind}") and ours[key]["reward"] == 0.0 for key in ours), kind
