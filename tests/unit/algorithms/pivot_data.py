"""The pivots of oracle episodes of tau2's mock domain: what examples/data/pivots_mock_oracle.jsonl holds.

Each task's episode as the scripted fake plays it with its oracle policy: the greeting, the scripted user's opening
(what the tiny policy is warm-started on), every gold call with the answer tau2 gives it, the closing question.
"""

from pathlib import Path

from nemo_tau2.pivots.candidates import StoredTrajectory
from nemo_tau2.pivots.gold import gold_trajectory
from nemo_tau2.pivots.prepare import PivotReport, prepare_pivots
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig
from nemo_tau2.testing.tau2_scripts import DEFAULT_CLOSING_TEXT, opening_text

REPO = Path(__file__).resolve().parents[3]
COMMITTED = REPO / "examples" / "data" / "pivots_mock_oracle.jsonl"
TASKS = ["update_task_1", "create_task_1"]  # grpo_tau2_cpu_smoke.yaml's


def oracle_trajectory(domain: str, task_id: str) -> StoredTrajectory:
    task = domains.get_task(domain, task_id)
    played = gold_trajectory(domain, task_id, opening=opening_text(task), closing=DEFAULT_CLOSING_TEXT)
    return StoredTrajectory(domain, task_id, played.tau2_messages, source=f"oracle:{domain}/{task_id}", reward=1.0)


def write_oracle_pivots(output: Path) -> PivotReport:
    trajectories = [oracle_trajectory("mock", task_id) for task_id in TASKS]
    return prepare_pivots(trajectories, Tau2ReleaseConfig(), output, compact=True)


if __name__ == "__main__":  # uv run python -m tests.unit.algorithms.pivot_data: write the committed file again
    print(write_oracle_pivots(COMMITTED).summary())
