"""An evaluation on tau2 v1.0.1 through the real Gym servers (resources server with its v1.0.1 worker, agent, the
scripted fake model server as policy and user, the scripted NL judge): one task per domain plus an NL-assertion
retail task, each reward equal to tau2 v1.0.1's own ``evaluate_simulation`` of the trajectory the episode recorded;
a judge that gives no verdict makes the episode an infrastructure error with the judge's cause, never a score."""

import json
from pathlib import Path

from omegaconf import OmegaConf

from nemo_tau2.config import apply_overrides, load_config
from nemo_tau2.evals.eval import run_eval, setup_eval
from tests.tau2_v1_env import tau2_v1_python
from tests.unit.tau2_release.worker_episodes import JUDGE_ATTEMPTS

FAKE = "examples/configs/evals/tau2_fake.yaml"
TELECOM_TASK = "[service_issue]airplane_mode_on|lock_sim_card_pin[PERSONA:Easy]"
NL_RETAIL_TASK = "2"  # retail 2 carries nl_assertions (reward DB x NL_ASSERTION)
# The base split's rows for these ids: airline 2 and 5, retail 2 (NL) and 5, the telecom task.
TASK_IDS = ["5", NL_RETAIL_TASK, TELECOM_TASK]


def _run(judge, save: Path, domains: list[str], task_ids: list[str]) -> dict:
    raw = apply_overrides(
        load_config(FAKE),
        [
            f"eval.save_path={save}",
            "eval.num_tests_per_prompt=1",
            "eval.k_values=[1]",
            "eval.bootstrap_samples=0",
            "data.split=base",
            "++tau2.version=v1.0.1",
            f"++tau2.python={tau2_v1_python()}",
            "++tau2.judge.model=scripted-judge",
            f"++tau2.judge.base_url={judge.base_url}",
            f"++tau2.judge.max_attempts={JUDGE_ATTEMPTS}",
        ],
    )
    raw.data.domains = domains
    raw.data.task_ids = OmegaConf.create(task_ids)  # ids with brackets and pipes: set, not parsed
    summary, _ = run_eval(setup_eval(raw), raw)
    return summary


def _records(save: Path) -> list[dict]:
    return [json.loads(line) for line in (save / "rollouts.jsonl").read_text().splitlines() if line.strip()]


def test_v101_eval_rewards_equal_tau2_v101s_own_evaluation_of_each_trajectory(judge, worker, tmp_path):
    summary = _run(judge, tmp_path, ["airline", "retail", "telecom"], TASK_IDS)
    records = _records(tmp_path)
    assert summary["tau2_version"] == "v1.0.1"
    assert sorted((r["domain"], r["task_id"]) for r in records) == sorted(
        [("airline", "2"), ("airline", "5"), ("retail", "2"), ("retail", "5"), ("telecom", TELECOM_TASK)]
    )
    for record in records:
        assert record["status"] == "ok" and record["tau2_version"] == "v1.0.1", record.get("error")
        reference = worker.request(
            "evaluate", domain=record["domain"], task_id=record["task_id"], messages=record["tau2_messages"],
            termination_reason=record["termination_reason"],
        )  # fmt: skip
        assert record["reward"] == reference["reward"], (record["domain"], record["task_id"])
        assert record["reward_info"]["reward_breakdown"] == reference["reward_info"]["reward_breakdown"]
    by_task = {(r["domain"], r["task_id"]): r for r in records}
    nl_task = by_task[("retail", NL_RETAIL_TASK)]
    assert nl_task["reward_info"]["nl_assertions"], "the judge graded the NL-assertion task"
    assert "NL_ASSERTION" in nl_task["reward_info"]["reward_basis"]
    assert by_task[("telecom", TELECOM_TASK)]["reward"] == 1.0  # the oracle's device action reached the worker
    assert sum(r["reward"] for r in records) >= 3  # the oracle policy passes v1.0.1 where its gold is unchanged


def test_a_judge_without_a_verdict_is_an_infrastructure_error_with_its_cause(judge, tmp_path):
    judge.inject("invalid_json", count=1000)  # every attempt of every retry
    try:
        summary = _run(judge, tmp_path, ["retail"], [NL_RETAIL_TASK])
    finally:
        judge.inject("invalid_json", count=0)
    (record,) = _records(tmp_path)
    assert record["status"] == "infrastructure_error" and record["reward"] is None
    assert "NL-assertion judge failed" in record["error"] and f"after {JUDGE_ATTEMPTS} attempts" in record["error"]
    assert summary["metrics"]["eval/overall/num_infra_errors"] == 1
