"""examples/prepare_data.py writes every task a row can express and names each one it skips, with the reason."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.gym_rows import UnsupportedTaskError, split_rows

ROOT = Path(__file__).resolve().parents[3]
WITH_HISTORY = ["update_task_with_message_history", "update_task_with_history_and_env_assertions"]


def test_split_rows_skips_tasks_that_start_from_a_message_history_only_when_asked():
    with pytest.raises(UnsupportedTaskError, match="pre-written message history"):
        split_rows(["mock"], "base")
    skipped: list[tuple[str, str, str]] = []
    rows = split_rows(["mock"], "base", skipped=skipped)
    assert [task_id for _, task_id, _ in skipped] == WITH_HISTORY
    assert all("pre-written message history" in reason for _, _, reason in skipped)
    assert len(rows) + len(skipped) == len(domains.get_tasks("mock", "base"))


def test_prepare_data_names_each_skipped_mock_task_and_writes_the_rest(tmp_path):
    output = tmp_path / "mock.jsonl"
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples/prepare_data.py"), "--domains", "mock", "--split", "base"]
        + ["--output", str(output)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    for task_id in WITH_HISTORY:
        assert f"skipped mock task {task_id!r}: it starts from a pre-written message history" in done.stderr
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(rows) == 7 and not {row["task_id"] for row in rows} & set(WITH_HISTORY)
    assert done.stdout.strip() == f"wrote 7 rows (mock 7) to {output}; 2 skipped (above)"


def test_prepare_data_writes_the_tasks_asked_for_and_refuses_an_unknown_one_in_one_line(tmp_path):
    def prepare(*arguments: str) -> subprocess.CompletedProcess:
        command = [sys.executable, str(ROOT / "examples/prepare_data.py"), "--output", str(tmp_path / "rows.jsonl")]
        return subprocess.run([*command, *arguments], capture_output=True, text=True, timeout=300)

    done = prepare("--domains", "airline,retail", "--split", "test", "--num-tasks", "2")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    expected = [("airline", t.id) for t in domains.get_tasks("airline", "test")[:2]]
    expected += [("retail", t.id) for t in domains.get_tasks("retail", "test")[:2]]
    assert [(row["domain"], row["task_id"]) for row in rows] == expected
    done = prepare("--domains", "airline", "--split", "test", "--task-ids", f"{expected[1][1]},no-such-task")
    assert done.returncode == 2 and done.stderr.strip() == "error: --task-ids: not in the split: ['no-such-task']"
