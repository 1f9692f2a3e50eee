"""``examples/export_rollouts.py`` on what is not a finished eval: one line on stderr naming the folder and what to
give, exit 2, nothing written; a line without an episode's identity refused and named, a failed episode exported
to the failures sidecar (with no scored episode, no ATIF). (What
NeMo-Gym 0.7.0's and tau2's tools make of an export: tau2_release/test_stored_rollout_tools.py.)"""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _export(folder: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "examples" / "export_rollouts.py"), str(folder)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_a_folder_that_is_not_an_eval_is_one_line_and_exit_2(tmp_path):
    refused = _export(tmp_path)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"error: {tmp_path}: no rollouts.jsonl; give an evaluation's results folder (its save_path)"
    ]
    assert list(tmp_path.iterdir()) == []


def test_a_line_without_identity_is_refused_and_a_failed_episode_goes_to_the_failures_sidecar(tmp_path):
    failed = {"domain": "airline", "task_id": "2", "sample_index": 0, "status": "infrastructure_error",
              "error": "agent /run HTTP 502: policy down", "cause": "policy down", "row_index": 0}  # fmt: skip
    nameless = {"domain": "airline", "status": "ok", "reward": 1.0}
    (tmp_path / "rollouts.jsonl").write_text(json.dumps(failed) + "\n" + json.dumps(nameless) + "\n")
    done = _export(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "refused 1x: no episode identity (missing sample_index, task_id)" in done.stdout
    assert f"{tmp_path / 'atif'}: not written (no scored episode)" in done.stdout
    rows = [json.loads(line) for line in (tmp_path / "nemo_gym" / "rollouts_failures.jsonl").read_text().splitlines()]
    agent = {"type": "responses_api_agents", "name": "tau2_agent"}
    assert rows == [
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "agent_ref": agent, "domain": "airline", "task_id": "2",
         "sample_index": 0, "_ng_failure_class": "agent_request_failed", "_ng_failure_terminal": False,
         "_ng_failure_message": "policy down"}
    ]  # fmt: skip
    assert (tmp_path / "nemo_gym" / "rollouts.jsonl").read_text() == ""
    assert not (tmp_path / "atif").exists()
