"""Our worker on tau2 v1.0.1 wired to a judge, and a scripted episode (``episode_scripts``) played through it:
seed, tool calls, trajectory, verify."""

import re
from collections.abc import Iterator
from contextlib import contextmanager

from nemo_tau2.tau2_release.client import Tau2Worker
from nemo_tau2.tau2_release.config import NLJudgeConfig, Tau2ReleaseConfig
from nemo_tau2.tau2_release.trajectory import Trajectory
from nemo_tau2.testing.scripted_judge import ScriptedJudge
from tests.tau2_v1_env import tau2_v1_python
from tests.unit.tau2_release.episode_scripts import episode_scripts

JUDGE_ATTEMPTS = 2  # verdicts tried per episode by the tests' worker (the judge-fault tests inject that many)


def play(worker: Tau2Worker, domain: str, task_id: str, script: dict) -> dict:
    """The episode's verify answer plus its ``messages`` and ``tool_answers``."""
    return play_interleaved(worker, domain, task_id, [script])[0]


def play_interleaved(worker: Tau2Worker, domain: str, task_id: str, scripts: list[dict]) -> list[dict]:
    """Episodes of one task, each seeded before any plays, their steps taken in turn (the first's step 0, the
    second's step 0, ...): what two concurrent sessions of one task do to the worker."""
    seeded = [worker.request("seed", domain=domain, task_id=task_id) for _ in scripts]
    trajectories, answers = [Trajectory() for _ in scripts], [[] for _ in scripts]
    for index in range(max(len(script["steps"]) for script in scripts)):
        for episode, script in enumerate(scripts):
            if index >= len(script["steps"]):
                continue
            step = script["steps"][index]
            if step[0] == "text":
                trajectories[episode].text(step[1], step[2])
                continue
            _, requestor, name, arguments = step
            call_id = f"call_{index}"
            answer = worker.request(
                "call_tool", episode_id=seeded[episode]["episode_id"], name=name, arguments=arguments,
                requestor=requestor, call_id=call_id,
            )  # fmt: skip
            trajectories[episode].tool_call(requestor, call_id, name, arguments, answer)
            answers[episode].append(answer)
    return [
        worker.verify(seed["episode_id"], trajectory.messages, script["termination_reason"])
        | {"messages": trajectory.messages, "tool_answers": episode_answers}
        for seed, trajectory, episode_answers, script in zip(seeded, trajectories, answers, scripts, strict=True)
    ]


def play_every_script(
    worker: Tau2Worker, domain: str, tasks: list[dict], greeting: str, reads: list[dict] | None = None
) -> dict[str, dict]:
    """Each task's oracle and perturbations (``episode_scripts``, ``reads`` for ``extra_reads``) played by ``worker``
    in turn: ``"<domain>/<task_id>/<name>"`` -> what the parity tests compare (:func:`summary`)."""
    return {
        f"{domain}/{task['id']}/{name}": summary(play(worker, domain, task["id"], script))
        for task in tasks
        for name, script in episode_scripts(task, greeting, reads).items()
    }


def summary(played: dict) -> dict:
    """What the parity test compares: reward, basis, breakdown and every tool answer (banking_knowledge's searches
    end with how long they took, ``[Timing: retrieval=2ms, ...]``, which no two runs share: compared without it)."""
    info = played["reward_info"]
    return {
        "reward": played["reward"],
        "reward_basis": info["reward_basis"] or [],
        "reward_breakdown": info["reward_breakdown"] or {},
        "tool_answers": [untimed(answer) for answer in played["tool_answers"]],
    }


def untimed(answer: dict) -> dict:
    return answer | {"content": _TIMING.sub("[Timing]", answer["content"] or "")}


_TIMING = re.compile(r"\[Timing: [^\]]*\]")


@contextmanager
def judged_worker(judge: ScriptedJudge, **judge_settings) -> Iterator[Tau2Worker]:
    """Our worker on tau2 v1.0.1, its NL judge the scripted one (``judge_settings``: more NLJudgeConfig fields)."""
    judge_config = NLJudgeConfig(model="scripted-judge", base_url=judge.base_url, **judge_settings)
    with Tau2Worker(Tau2ReleaseConfig(version="v1.0.1", python=tau2_v1_python(), judge=judge_config)) as started:
        yield started
