"""Our worker on tau2 v1.0.1 wired to a judge, and a scripted episode (``episode_scripts``) played through it:
seed, tool calls, trajectory, verify."""

from collections.abc import Iterator
from contextlib import contextmanager

from nemo_tau2.tau2_release.client import Tau2Worker
from nemo_tau2.tau2_release.config import NLJudgeConfig, Tau2ReleaseConfig
from nemo_tau2.tau2_release.trajectory import Trajectory
from nemo_tau2.testing.scripted_judge import ScriptedJudge
from tests.tau2_v1_env import tau2_v1_python

JUDGE_ATTEMPTS = 2  # verdicts tried per episode by the tests' worker (the judge-fault tests inject that many)


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


@contextmanager
def judged_worker(judge: ScriptedJudge, **judge_settings) -> Iterator[Tau2Worker]:
    """Our worker on tau2 v1.0.1, its NL judge the scripted one (``judge_settings``: more NLJudgeConfig fields)."""
    judge_config = NLJudgeConfig(model="scripted-judge", base_url=judge.base_url, **judge_settings)
    with Tau2Worker(Tau2ReleaseConfig(version="v1.0.1", python=tau2_v1_python(), judge=judge_config)) as started:
        yield started
