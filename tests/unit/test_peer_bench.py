"""``bench/peer_nemo_gym_tau2.py --quick`` as CI runs it: NeMo-Gym 0.7.0's own tau2 agent and ours, each on one task
of every domain (banking_knowledge included), on the same scripted endpoint, from the set-up's environments.

What it checks is that both sides really ran and that the JSON has every field: their agent started under its own
``ng_run`` and scored episodes; every reward of either side equals tau2 v1.0.1's own scoring of the trajectory; the
training-data and failure probes reached both. Speed is the bench's to measure (BENCHMARKS.md), not this test's: it
shares the machine with the suite."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.env_python import environment_python
from tests.unit.gym.cli_shell import real_uv

ROOT = Path(__file__).resolve().parents[2]
LEVELS = ("c1", "c4")
LEVEL_FIELDS = {
    "ours_episodes_per_s", "theirs_episodes_per_s", "theirs_best_setting", "ratio_episodes_per_s",
    "ours_cpu_s_per_episode", "theirs_cpu_s_per_episode", "ratio_cpu_s_per_episode",
}  # fmt: skip
TRAINING_FIELDS = {"policy_turns", "turns_with_token_ids", "token_ids_on_output_items", "contiguous_turns", "breaks"}


def test_the_quick_bench_runs_both_agents_and_reports_every_field(tmp_path):
    environment_python("NEMO_TAU2_GYM07_PYTHON", "gym07", "NeMo-Gym 0.7.0 (Python 3.13)")
    environment_python("NEMO_TAU2_TAU2_V1_PYTHON", "tau2-v1", "tau2 v1.0.1")
    env = os.environ | {"UV": str(real_uv())}
    command = [sys.executable, "bench/peer_nemo_gym_tau2.py", "--quick", "--work-dir", str(tmp_path / "work")]
    run = subprocess.run(command, cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    for level in LEVELS:
        assert set(summary[level]) == LEVEL_FIELDS
        assert summary[level]["theirs_best_setting"] == "theirs (num_workers=1)"
    assert summary["tasks"] == 4  # one per domain: airline, retail, telecom, banking_knowledge
    # the oracle and the mistaken policy on each task: 8 episodes a side, every reward tau2's own
    assert summary["ours_rewards_identical_to_tau2"] == "8/8"
    assert summary["theirs_rewards_identical_to_tau2"] == "8/8"
    assert {name: set(found) for name, found in summary["training"].items()} == {
        "ours": TRAINING_FIELDS, "theirs": TRAINING_FIELDS
    }  # fmt: skip
    ours, theirs = summary["training"]["ours"], summary["training"]["theirs"]
    assert ours["breaks"] == 0 and ours["contiguous_turns"] == ours["policy_turns"] > 1  # our splice holds
    assert theirs["token_ids_on_output_items"] is False  # theirs: only inside tau2's messages' raw_data
    assert summary["failures"]["ours"] == {
        "policy_500s": "no reward (infrastructure failure)", "policy_hangs": "no reward (infrastructure failure)"
    }  # fmt: skip
    assert summary["failures"]["theirs"]["policy_500s"] == "a reward of 0 (failure scored)"
    results = json.loads(Path(run.stdout.split("full results: ")[1].split()[0]).read_text())
    sides = {row["side"] for row in results["throughput"]}
    assert sides == {"ours", "theirs (num_workers=1)"}
    assert all(row["ok"] == row["episodes"] for row in results["throughput"]), results["throughput"]
