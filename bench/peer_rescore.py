"""tau2 v1.0.1 scoring each side's trajectory itself (run in v1.0.1's environment), for
``bench/peer_nemo_gym_tau2.py``: the reference both agents' rewards are held to.

stdin: a JSON list of ``{"domain", "task_id", "messages", "termination_reason", "retrieval_config"}`` (``messages``:
tau2's message dicts, as each side played them); stdout: a JSON list of ``{"reward"}`` or ``{"error"}``, in that
order. Each is ``evaluate_simulation(..., ALL)`` with the environment arguments tau2's runner builds
(``_build_env_kwargs``).
"""

import json
import os
import sys
import uuid

_OUT = os.fdopen(os.dup(sys.stdout.fileno()), "w")
os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # tau2 prints while importing
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from loguru import logger  # noqa: E402

logger.remove()

from tau2.data_model.message import AssistantMessage, ToolMessage, UserMessage  # noqa: E402
from tau2.data_model.simulation import SimulationRun, TerminationReason, TextRunConfig  # noqa: E402
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation  # noqa: E402
from tau2.registry import registry  # noqa: E402
from tau2.runner.build import _build_env_kwargs  # noqa: E402

_MESSAGES = {"assistant": AssistantMessage, "user": UserMessage, "tool": ToolMessage}


def score(episode: dict, tasks: dict) -> dict:
    domain = episode["domain"]
    if domain not in tasks:
        tasks[domain] = {task.id: task for task in registry.get_tasks_loader(domain)(task_split_name=None)}
    task = tasks[domain][episode["task_id"]]
    messages = [_MESSAGES[m["role"]].model_validate(m) for m in episode["messages"] if m.get("role") in _MESSAGES]
    simulation = SimulationRun(
        id=uuid.uuid4().hex, task_id=task.id, start_time="", end_time="", duration=0.0,
        termination_reason=TerminationReason(episode["termination_reason"]), messages=messages,
    )  # fmt: skip
    run = TextRunConfig(domain=domain, llm_agent="unused", llm_user="unused",
                        retrieval_config=episode.get("retrieval_config"))  # fmt: skip
    env_kwargs = _build_env_kwargs(run, task)
    info = evaluate_simulation(
        simulation, task, EvaluationType.ALL, False, domain=domain, env_kwargs=env_kwargs or None
    )
    return {"reward": info.reward}


def main() -> None:
    tasks: dict = {}
    answers = []
    for episode in json.load(sys.stdin):
        try:
            answers.append(score(episode, tasks))
        except Exception as e:  # noqa: BLE001  (reported per episode: the bench says which could not be scored)
            answers.append({"error": f"{type(e).__name__}: {e}"[:300]})
    _OUT.write(json.dumps(answers))
    _OUT.flush()


if __name__ == "__main__":
    main()
