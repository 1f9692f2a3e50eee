"""The pivots of oracle episodes of tau2's mock domain: what examples/data/pivots_mock_oracle.jsonl holds.

Each task's episode as the scripted fake plays it with its oracle policy: the greeting, the scripted user's opening
(what the tiny policy is warm-started on), every gold call with the answer tau2 gives it, the closing question.
"""

from pathlib import Path

from nemo_tau2.gym.resources_server.rescoring import replay
from nemo_tau2.pivots.candidates import StoredTrajectory
from nemo_tau2.pivots.prepare import PivotReport, prepare_pivots
from nemo_tau2.tau2_env import domains, prompts
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig
from nemo_tau2.tau2_release.trajectory import Trajectory
from nemo_tau2.testing.tau2_scripts import DEFAULT_CLOSING_TEXT, opening_text

REPO = Path(__file__).resolve().parents[3]
COMMITTED = REPO / "examples" / "data" / "pivots_mock_oracle.jsonl"
TASKS = ["update_task_1", "create_task_1"]  # grpo_tau2_cpu_smoke.yaml's


def oracle_trajectory(domain: str, task_id: str) -> StoredTrajectory:
    task = domains.get_task(domain, task_id)
    trajectory = Trajectory()
    trajectory.text("assistant", prompts.greeting())
    trajectory.text("user", opening_text(task))
    episode = replay(domain, task_id, trajectory.messages)
    for index, action in enumerate(task.evaluation_criteria.actions):
        answer = episode.call_tool(action.name, action.arguments, action.requestor, f"call_{index}")
        trajectory.tool_call(action.requestor, f"call_{index}", action.name, action.arguments,
                             {"content": answer.content, "error": answer.error})  # fmt: skip
    trajectory.text("assistant", DEFAULT_CLOSING_TEXT)
    return StoredTrajectory(domain, task_id, trajectory.messages, source=f"oracle:{domain}/{task_id}", reward=1.0)


def write_oracle_pivots(output: Path) -> PivotReport:
    trajectories = [oracle_trajectory("mock", task_id) for task_id in TASKS]
    return prepare_pivots(trajectories, Tau2ReleaseConfig(), output, compact=True)


if __name__ == "__main__":  # uv run python -m tests.unit.algorithms.pivot_data: write the committed file again
    print(write_oracle_pivots(COMMITTED).summary())
