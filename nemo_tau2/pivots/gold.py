"""tau2's gold actions as a trajectory: each task's demonstration, with the answers tau2 gives its calls.

The task's gold actions (both parties': telecom's user device calls too) run in order in a real episode of the task
(tau2 v0.2.1, in process), each recorded with its answer, after the greeting and an optional opening by the user.
The verifier's own tests and ``bench/pivots.py`` cut their pivots from these: every demonstrated call of every task,
in the state the demonstration reached.
"""

from nemo_tau2.gym.resources_server.rescoring import replay
from nemo_tau2.pivots.candidates import StoredTrajectory
from nemo_tau2.tau2_env import domains, prompts
from nemo_tau2.tau2_release.trajectory import Trajectory


def gold_trajectory(domain: str, task_id: str, opening: str | None = None, closing: str | None = None):
    """The task's gold demonstration as a :class:`StoredTrajectory` (``source`` ``gold:<domain>/<task>``)."""
    trajectory = Trajectory()
    trajectory.text("assistant", prompts.greeting())
    if opening is not None:
        trajectory.text("user", opening)
    episode = replay(domain, task_id, trajectory.messages)
    for index, action in enumerate(domains.get_task(domain, task_id).evaluation_criteria.actions or []):
        answer = episode.call_tool(action.name, action.arguments, action.requestor, f"gold-{index}")
        trajectory.tool_call(action.requestor, f"gold-{index}", action.name, action.arguments,
                             {"content": answer.content, "error": answer.error})  # fmt: skip
    if closing is not None:
        trajectory.text("assistant", closing)
    return StoredTrajectory(domain, str(task_id), trajectory.messages, source=f"gold:{domain}/{task_id}", reward=1.0)
