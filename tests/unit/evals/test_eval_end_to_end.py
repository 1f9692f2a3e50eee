"""The evaluator end to end with the scripted fake model server: real Gym servers, real tau2, real files."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from nemo_tau2.config import apply_overrides, load_config
from nemo_tau2.evals.eval import run_eval, setup_eval
from nemo_tau2.tau2_env.gym_rows import task_row
from tests.sigterm import as_from_a_terminal

FAKE = "examples/configs/evals/tau2_fake.yaml"
# Tasks whose first write action, given one wrong argument (the fake's `wrong_argument` policy), scores 0.
FLAKY_TASKS = [("airline", "2"), ("airline", "8"), ("retail", "5"), ("retail", "9")]
EVERY_OTHER_SAMPLE_FAILS = "{tau2: {policy: {variant: wrong_argument, variant_every: 2}}}"
# n = 4 with samples 1 and 3 failing: c = 2 per task.
EXPECTED = {"pass@1": 0.5, "pass@2": 1 - 1 / 6, "pass@4": 1.0, "pass^1": 0.5, "pass^2": 1 / 6, "pass^4": 0.0}


def _rows_file(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(task_row(domain, task_id)) + "\n" for domain, task_id in FLAKY_TASKS))
    return path


def _run(*overrides: str):
    raw = apply_overrides(load_config(FAKE), list(overrides))
    return run_eval(setup_eval(raw), raw)


def _lines(save_path: Path) -> list[dict]:
    return [json.loads(line) for line in (save_path / "rollouts.jsonl").read_text().splitlines() if line.strip()]


def test_oracle_policy_scores_pass_at_1_and_pass_hat_4_of_one_in_every_domain(tmp_path):
    summary, table = _run(f"eval.save_path={tmp_path}", "data.num_tasks=2", "eval.bootstrap_samples=0")
    metrics = summary["metrics"]
    for scope in ("overall", "airline", "retail", "telecom"):
        assert metrics[f"eval/{scope}/pass@1"] == 1.0 and metrics[f"eval/{scope}/pass^4"] == 1.0
        assert metrics[f"eval/{scope}/mean_reward"] == 1.0
    assert metrics["eval/overall/num_episodes"] == 24 and metrics["eval/overall/num_infra_errors"] == 0
    records = _lines(tmp_path)
    assert len(records) == 24 and all(r["status"] == "ok" and r["transcript"] for r in records)
    assert json.loads((tmp_path / "summary.json").read_text())["metrics"] == metrics
    saved_config = json.loads((tmp_path / "config.json").read_text())
    assert saved_config["eval"]["save_path"] == str(tmp_path)
    assert "pass^4" in table and "Telecom" in table
    # how each episode ended, on its line, in the summary per domain, and in the table
    assert {r["tau2_failure_kind"] for r in records} <= {"ended_normally", "transfer"}
    for scope in ("overall", "airline", "retail", "telecom"):
        shares = [metrics[f"eval/{scope}/failure_kind/{kind}/pct"] for kind in ("ended_normally", "transfer")]
        assert sum(shares) == pytest.approx(1.0)
        assert metrics[f"eval/{scope}/trajectory_termination_reason/user_stop/pct"] == 1.0
    assert "ended normally %" in table


def test_a_policy_failing_every_other_sample_gives_the_exact_pass_at_k_and_pass_hat_k(tmp_path):
    summary, _ = _run(
        f"eval.save_path={tmp_path / 'out'}",
        f"data.data_path={_rows_file(tmp_path)}",
        f"policy.generation.fake_cfg={EVERY_OTHER_SAMPLE_FAILS}",
        "eval.bootstrap_samples=0",
    )
    metrics = summary["metrics"]
    # an infrastructure error leaves its task out of pass@k (fewer than k valid episodes): name it, not a missing key
    assert summary["infrastructure_causes"] == {}, summary["infrastructure_causes"]
    for name, value in EXPECTED.items():
        for scope in ("overall", "airline", "retail"):
            assert metrics[f"eval/{scope}/{name}"] == pytest.approx(value), (scope, name)
    successes = {(r["domain"], r["task_id"], r["sample_index"]): r["success"] for r in _lines(tmp_path / "out")}
    assert all(success == (sample % 2 == 0) for (_, _, sample), success in successes.items())


def test_killing_the_run_halfway_and_rerunning_completes_it_without_repeating_episodes(tmp_path):
    save = tmp_path / "out"
    command = [
        sys.executable,
        "examples/run_eval.py",
        "--config",
        FAKE,
        f"eval.save_path={save}",
        f"data.data_path={_rows_file(tmp_path)}",
        "eval.max_concurrency=2",
        "eval.bootstrap_samples=0",
        f"policy.generation.fake_cfg={{latency_ms: 150, {EVERY_OTHER_SAMPLE_FAILS[1:-1]}}}",
    ]
    first = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=as_from_a_terminal
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        rollouts = save / "rollouts.jsonl"
        if rollouts.exists() and len(rollouts.read_text().splitlines()) >= 5:
            break
        assert first.poll() is None, first.stdout.read()
        time.sleep(0.2)
    first.send_signal(signal.SIGINT)  # Ctrl-C
    output, _ = first.communicate(timeout=60)
    assert first.returncode == 130, output
    assert "rerun the same command to resume" in output
    finished_before = {(r["domain"], r["task_id"], r["sample_index"]) for r in _lines(save)}
    assert 5 <= len(finished_before) < 16

    second = subprocess.run(command, capture_output=True, text=True, timeout=600, env=os.environ)  # same command
    assert second.returncode == 0, second.stderr[-3000:]
    records = _lines(save)
    counts = Counter((r["domain"], r["task_id"], r["sample_index"]) for r in records)
    assert len(counts) == 16 and set(counts.values()) == {1}  # nothing ran twice
    metrics = json.loads((save / "summary.json").read_text())["metrics"]
    for name, value in EXPECTED.items():
        assert metrics[f"eval/overall/{name}"] == pytest.approx(value), name
