"""PivotRL on CPU: ``run_pivot_rl.py`` with ``pivot_rl_tau2_cpu_smoke.yaml`` (the tiny warm-started policy, our hf
backend, the real Gym servers, one sampled turn per rollout rewarded by ``/verify_pivot`` in a fork of the pivot's
state, real weight updates).

It learns: the call pivots' accuracy on validation rises from step 0 to step 8 by more than ``MARGIN``. The sampling is
not seeded across runs (concurrent requests), so the margin is set from the noise: 16 samples a pivot at each
validation leave the rise of the two call pivots' mean with a standard deviation of about 0.13, and the rise measured
is about 0.4 (runs on 2026-12-02: 0.34, 0.44 and 0.53 with 16 samples; 0.73, 0.43 and, in stop 61's CI, 0.19 with 8,
which failed the 0.25 margin then in force): 0.05 is about three standard deviations of the rise under it. The text
pivots score 1 for any text (mode ``message``) from the start. It resumes: a run stopped after 4 steps goes on from its
checkpoint to 8. It reports: the pivots table and JSON line on the console, ``pivots.json`` and the report's pivots
section. The committed pivots file is what the pipeline writes from the oracle episodes (``pivot_data``), and rows that
are not pivots are refused with exit 2.
"""

import json
import subprocess
import sys

from tests.unit.algorithms.pivot_data import COMMITTED, REPO, write_oracle_pivots

CONFIG = "examples/configs/pivot_rl_tau2_cpu_smoke.yaml"
MARGIN = 0.05


def run(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "examples/run_pivot_rl.py", "--config", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)


def test_the_committed_pivots_are_what_prepare_pivots_writes(tmp_path):
    write_oracle_pivots(tmp_path / "pivots.jsonl")
    assert (tmp_path / "pivots.jsonl").read_bytes() == COMMITTED.read_bytes(), "regenerate: python -m " + __name__


def test_pivot_rl_smoke_learns_resumes_and_reports(tmp_path):
    paths = [f"policy.model_name={tmp_path}/tiny_policy", f"logger.log_dir={tmp_path}/logs",
             f"checkpointing.checkpoint_dir={tmp_path}/checkpoints"]  # fmt: skip
    stopped = run(CONFIG, *paths, "grpo.max_num_steps=4")
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    resumed = run(CONFIG, *paths)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming: 4 of 8 steps already done" in resumed.stderr, resumed.stderr[-2000:]
    measured = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert (measured["first_step"], measured["last_step"]) == (0, 8), measured
    assert measured["pivot_accuracy_last"] > measured["pivot_accuracy_first"], measured
    assert "update_task_status" in resumed.stdout and "create_task" in resumed.stdout, resumed.stdout
    summary = json.loads((tmp_path / "logs" / "pivots.json").read_text())
    calls = [row for row in summary["rows"] if row["tool"] != "message"]  # text pivots score 1 for any text
    first, last = (sum(row[key] for row in calls) / len(calls) for key in ("accuracy_first", "accuracy_last"))
    assert last - first > MARGIN, (first, last, summary)
    assert {row["tool"] for row in summary["rows"]} == {"update_task_status", "create_task", "message"}
    assert sum(row["pivots"] for row in summary["rows"]) == 4  # every pivot, none merged with its task's others
    report = (tmp_path / "logs" / "report.html").read_text()
    assert 'id="pivots"' in report and "update_task_status" in report


def test_rows_that_are_not_pivots_are_refused():
    refused = run("examples/configs/grpo_tau2_cpu_smoke.yaml")
    assert refused.returncode == 2 and "is not a pivot" in refused.stderr, refused.stderr[-2000:]
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
