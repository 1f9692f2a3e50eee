"""The causes of failed training episodes, counted by what they mean, and the step files a resumed run supersedes."""

import json
from collections import Counter

from nemo_tau2.algorithms.train_rollouts import (
    TrainRolloutLog,
    describe_causes,
    normalised_cause,
    set_aside_steps_after,
)
from nemo_tau2.experience.rollouts import INFRASTRUCTURE_ERROR, OK, RolloutResult

# as the agents reported them on the 3-node cluster of issue 36 (two nodes, two ports, two episodes)
LOST_RESOURCES = (
    "agent /run HTTP 502: tool call create_task failed after 4 attempts: ClientConnectorError: Cannot connect to host "
    "{ip}:{port} ssl:default [Connect call failed ('{ip}', {port})]"
)
STOPPED = "agent /run HTTP 503: the server stopped before it answered (http://{ip}:{port}/run, episode {episode})"


def test_one_failure_on_several_addresses_and_episodes_is_one_cause():
    first = normalised_cause(LOST_RESOURCES.format(ip="10.0.0.3", port=41235))
    assert first == normalised_cause(LOST_RESOURCES.format(ip="10.0.0.4", port=40011))
    assert "10.0.0" not in first and "41235" not in first and "after 4 attempts" in first
    stopped = {
        normalised_cause(STOPPED.format(ip=f"10.0.0.{i}", port=40000 + i, episode=f"{i:x}9f3ab1c2d")) for i in (3, 4)
    }
    assert len(stopped) == 1 and first not in stopped
    causes = Counter({first: 4, stopped.pop(): 8, "agent /run HTTP 500: boom": 1, "x": 1})
    line = describe_causes(causes, top=2)
    assert line.startswith("8x agent /run HTTP 503: the server stopped") and "; 4x agent /run HTTP 502" in line
    assert line.endswith("; 2 more cause(s)")


def _result(step_index: int, ok: bool) -> RolloutResult:
    status, error = (OK, None) if ok else (INFRASTRUCTURE_ERROR, "agent /run HTTP 502: lost")
    return RolloutResult(step_index, 0, step_index, "mock", "t", status, error=error, reward=1.0 if ok else None)


def test_failed_episodes_are_written_per_step_and_a_resume_supersedes_the_steps_after_its_checkpoint(tmp_path):
    log = TrainRolloutLog(tmp_path, "failed", start_step=0)
    for step in (1, 2, 3):
        log.write(step, [_result(0, ok=True), _result(1, ok=False)])
    log.close()
    (tmp_path / "validation" / "step_3").mkdir(parents=True)
    (tmp_path / "validation" / "step_3" / "rollouts.jsonl").write_text("{}\n")
    lines = (tmp_path / "train" / "step_2" / "rollouts.jsonl").read_text().splitlines()
    assert [json.loads(line)["error"] for line in lines] == ["agent /run HTTP 502: lost"]  # the failed one only

    resumed = TrainRolloutLog(tmp_path, "all", start_step=1)  # resumed from step 1's checkpoint
    resumed.write(2, [_result(0, ok=True)])
    resumed.close()
    assert (tmp_path / "train" / "step_1" / "rollouts.jsonl").exists()  # trained before the checkpoint: kept
    for folder in ("train/step_2", "train/step_3", "validation/step_3"):
        assert (tmp_path / folder / "rollouts.jsonl.superseded-1").exists(), folder
    assert len((tmp_path / "train" / "step_2" / "rollouts.jsonl").read_text().splitlines()) == 1
    assert not (tmp_path / "train" / "step_3" / "rollouts.jsonl").exists()
    assert set_aside_steps_after(tmp_path / "train", 1) == [tmp_path / "train/step_2/rollouts.jsonl.superseded-2"]
