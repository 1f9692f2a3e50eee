"""Play a scripted episode (``episode_scripts``) through nemo-tau2's worker: seed, tool calls, trajectory, verify."""

from nemo_tau2.tau2_release.client import Tau2Worker
from nemo_tau2.tau2_release.trajectory import Trajectory


def play(worker: Tau2Worker, domain: str, task_id: str, script: dict) -> dict:
    """The episode's verify answer plus its ``messages`` and ``tool_answers``."""
    seeded = worker.request("seed", domain=domain, task_id=task_id)
    trajectory, answers = Trajectory(), []
    for index, step in enumerate(script["steps"]):
        if step[0] == "text":
            trajectory.text(step[1], step[2])
            continue
        _, requestor, name, arguments = step
        call_id = f"call_{index}"
        answer = worker.request(
            "call_tool", episode_id=seeded["episode_id"], name=name, arguments=arguments, requestor=requestor,
            call_id=call_id,
        )  # fmt: skip
        trajectory.tool_call(requestor, call_id, name, arguments, answer)
        answers.append(answer)
    scored = worker.verify(seeded["episode_id"], trajectory.messages, script["termination_reason"])
    return scored | {"messages": trajectory.messages, "tool_answers": answers}


def summary(played: dict) -> dict:
    """What the parity test compares: reward, basis, breakdown and every tool answer."""
    info = played["reward_info"]
    return {
        "reward": played["reward"],
        "reward_basis": info["reward_basis"] or [],
        "reward_breakdown": info["reward_breakdown"] or {},
        "tool_answers": played["tool_answers"],
    }
