"""An evaluation on tau2 v1.0.1 through the real Gym servers (resources server with its v1.0.1 worker, agent, the
scripted fake model server as policy and user, the scripted NL judge): one task per domain plus an NL-assertion
retail task, each reward equal to tau2 v1.0.1's own ``evaluate_simulation`` of the trajectory the episode recorded;
a judge that gives no verdict (on one NL task of the same run) makes that episode an infrastructure error with the
judge's cause, never a score. prepare_sft_data.py turns the run's rollouts into SFT rows of v1.0.1 when given the
same ``tau2`` keys (and refuses them as v0.2.1's default)."""

import json
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from nemo_tau2.config import apply_overrides, load_config
from nemo_tau2.evals.eval import run_eval, setup_eval
from tests.tau2_v1_env import tau2_v1_python
from tests.unit.tau2_release.worker_episodes import JUDGE_ATTEMPTS

FAKE = "examples/configs/evals/tau2_fake.yaml"
DOMAINS = ("airline", "retail", "telecom")
TELECOM_TASK = "[service_issue]airplane_mode_on|lock_sim_card_pin[PERSONA:Easy]"
NL_RETAIL_TASK = "2"  # retail 2 carries nl_assertions (reward DB x NL_ASSERTION)
FAULTY_NL_TASK = "60"  # a retail-only id with an NL assertion the judge fails on: it names this price
FAULTY_NL_ASSERTION = "$242.92"
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
    summary, table = run_eval(setup_eval(raw), raw)
    assert table.splitlines()[1] == "tau2 v1.0.1, policy fake, user simulator fake"  # what a leaderboard row names
    return summary


def _records(save: Path) -> list[dict]:
    return [json.loads(line) for line in (save / "rollouts.jsonl").read_text().splitlines() if line.strip()]


def test_v101_eval_rewards_equal_tau2_v101s_own_evaluation_and_a_judge_fault_is_an_infrastructure_error(
    judge, worker, tmp_path
):
    # one run for both (CI time: each eval starts the Gym servers and a worker): retail 60's judge gives no verdict
    judge.inject("invalid_json", count=1000, when=FAULTY_NL_ASSERTION)  # every attempt of every retry
    try:
        summary = _run(judge, tmp_path, list(DOMAINS), [*TASK_IDS, FAULTY_NL_TASK])
    finally:
        judge.inject("invalid_json", count=0)
    records = _records(tmp_path)
    assert summary["tau2_version"] == "v1.0.1"
    assert sorted((r["domain"], r["task_id"]) for r in records) == sorted(
        [("airline", "2"), ("airline", "5"), ("retail", "2"), ("retail", "5"), ("retail", FAULTY_NL_TASK),
         ("telecom", TELECOM_TASK)]
    )  # fmt: skip
    by_task = {(r["domain"], r["task_id"]): r for r in records}
    faulty = by_task.pop(("retail", FAULTY_NL_TASK))
    assert faulty["status"] == "infrastructure_error" and faulty["reward"] is None
    assert "NL-assertion judge failed" in faulty["error"] and f"after {JUDGE_ATTEMPTS} attempts" in faulty["error"]
    assert summary["metrics"]["eval/overall/num_infra_errors"] == 1
    assert summary["infrastructure_causes"] == {faulty["cause"]: 1}  # counted by cause, which names no place
    assert faulty["cause"] == (
        f"agent /run HTTP 502: verifying the episode failed after 4 attempts: HTTP 502: tau2 v1.0.1: NL-assertion "
        f"judge failed: JSONDecodeError: Expecting value: line 1 column 1 (char 0) (after {JUDGE_ATTEMPTS} attempts)"
    )
    for record in by_task.values():
        assert record["status"] == "ok" and record["tau2_version"] == "v1.0.1", record.get("error")
        reference = worker.request(
            "evaluate", domain=record["domain"], task_id=record["task_id"], messages=record["tau2_messages"],
            termination_reason=record["termination_reason"],
        )  # fmt: skip
        assert record["reward"] == reference["reward"], (record["domain"], record["task_id"])
        assert record["reward_info"]["reward_breakdown"] == reference["reward_info"]["reward_breakdown"]
    nl_task = by_task[("retail", NL_RETAIL_TASK)]
    assert nl_task["reward_info"]["nl_assertions"], "the judge graded the NL-assertion task"
    assert "NL_ASSERTION" in nl_task["reward_info"]["reward_basis"]
    assert by_task[("telecom", TELECOM_TASK)]["reward"] == 1.0  # the oracle's device action reached the worker
    assert sum(r["reward"] for r in by_task.values()) >= 3  # the oracle passes v1.0.1 where its gold is unchanged
    # the release's own results files (its Results.save): the scored episodes, each with the reward it got here
    assert summary["tau2_results"] == {d: str(tmp_path / "tau2_results" / f"{d}.json") for d in DOMAINS}
    for domain in DOMAINS:
        results = json.loads((tmp_path / "tau2_results" / f"{domain}.json").read_text())
        assert results["info"]["num_trials"] == 1 and results["info"]["user_info"]["llm"] == "fake"
        exported = {(s["task_id"], s["trial"]): s for s in results["simulations"]}
        ours = {(r["task_id"], r["sample_index"]): r for (d, _), r in by_task.items() if d == domain}
        assert exported.keys() == ours.keys()  # retail 60, an infrastructure error, has no trajectory to export
        for key, simulation in exported.items():
            assert simulation["reward_info"]["reward"] == ours[key]["reward"]
            assert len(simulation["messages"]) == len(ours[key]["tau2_messages"])
    # the judge is back: --rescore gives the episode its outage left unscored a verdict (tau2 v1.0.1's own for its
    # stored trajectory) and re-scores every other to the reward it had, without playing any episode again
    rescored = subprocess.run(
        [sys.executable, "examples/run_eval.py", "--rescore", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert rescored.returncode == 0, rescored.stderr[-2000:]
    after = {(r["domain"], r["task_id"]): r for r in _records(tmp_path)}
    recovered = after[("retail", FAULTY_NL_TASK)]
    assert recovered["status"] == "ok" and recovered["rescored"]["previous"]["status"] == "infrastructure_error"
    reference = worker.request(
        "evaluate", domain="retail", task_id=FAULTY_NL_TASK, messages=recovered["tau2_messages"],
        termination_reason=recovered["termination_reason"],
    )  # fmt: skip
    assert recovered["reward"] == reference["reward"] and recovered["reward_info"]["nl_assertions"]
    assert {key: after[key]["reward"] for key in by_task} == {key: r["reward"] for key, r in by_task.items()}
    report = json.loads((tmp_path / "summary.json").read_text())
    assert report["rescore"]["recovered"] == 1 and report["rescore"]["refused"] == {}
    assert report["metrics"]["eval/overall/num_infra_errors"] == 0 and report["infrastructure_causes"] == {}
    # SFT rows of this run: the release named by the runs' tau2 keys; refused under the default release (v0.2.1)
    command = [sys.executable, "examples/prepare_sft_data.py", "--rollouts", str(tmp_path / "rollouts.jsonl")]
    command += ["--allow-test-split", "--output", str(tmp_path / "sft.jsonl")]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "not tau2.version v0.2.1" in refused.stderr, refused.stderr
    release = ["tau2.version=v1.0.1", f"tau2.python={tau2_v1_python()}"]
    done = subprocess.run(command + release, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert sorted((row["domain"], row["task_id"]) for row in rows) == sorted(after)  # the recovered one too
    assert {row["tau2_version"] for row in rows} == {"v1.0.1"}
