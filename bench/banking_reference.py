"""tau2 v1.0.1 itself playing banking_knowledge's gold episodes, timed step by step (runs in v1.0.1's environment).

The reference side of ``bench/banking_speed.py``: reads ``{"variant", "task_ids", "reads", "judge_base_url"}`` on
stdin; per task, the environment tau2's runner builds (``_build_env_kwargs``: variant, task, read-log allowlist) with
the task's initial state (seed), every gold call and the knowledge reads through ``Environment.get_response``, then
``evaluate_simulation(..., ALL)``. Writes ``{"seed": [s...], "tool": [...], "read": [...], "verify": [...]}``.
"""

import json
import os
import sys
import time
import uuid

_OUT = os.fdopen(os.dup(sys.stdout.fileno()), "w")
os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # tau2 prints while importing
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from loguru import logger  # noqa: E402

logger.remove()

import tau2.evaluator.evaluator_nl_assertions as nl_assertions  # noqa: E402
from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage  # noqa: E402
from tau2.data_model.simulation import SimulationRun, TerminationReason, TextRunConfig  # noqa: E402
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation  # noqa: E402
from tau2.orchestrator.orchestrator import DEFAULT_FIRST_AGENT_MESSAGE  # noqa: E402
from tau2.runner import build_environment, get_tasks  # noqa: E402
from tau2.runner.build import _build_env_kwargs  # noqa: E402

DOMAIN = "banking_knowledge"
_SENDERS = {"assistant": AssistantMessage, "user": UserMessage}


def play(task, run: TextRunConfig, reads: list[dict], timings: dict) -> float:
    start = time.perf_counter()
    env_kwargs = _build_env_kwargs(run, task)
    env = build_environment(DOMAIN, env_kwargs=env_kwargs)
    state = task.initial_state
    env.set_state(
        initialization_data=state.initialization_data if state else None,
        initialization_actions=state.initialization_actions if state else None,
        message_history=[],
    )
    env.sync_tools()
    timings["seed"].append(time.perf_counter() - start)
    messages = [
        AssistantMessage(role="assistant", content=DEFAULT_FIRST_AGENT_MESSAGE.content),
        UserMessage(role="user", content="Hello."),
    ]
    criteria = task.evaluation_criteria
    steps = [(read, "read") for read in reads] + [(action.model_dump(), "tool") for action in criteria.actions or []]
    for index, (action, kind) in enumerate(steps):
        requestor = action.get("requestor", "assistant")
        call = ToolCall(id=f"c{index}", name=action["name"], arguments=action["arguments"], requestor=requestor)
        messages.append(_SENDERS[requestor](role=requestor, content=None, tool_calls=[call]))
        start = time.perf_counter()
        messages.append(env.get_response(call))
        timings[kind].append(time.perf_counter() - start)
    closing = " ".join(["Done.", *(criteria.communicate_info or [])])
    messages.append(AssistantMessage(role="assistant", content=closing))
    messages.append(UserMessage(role="user", content="###STOP###"))
    simulation = SimulationRun(
        id=uuid.uuid4().hex, task_id=task.id, start_time="", end_time="", duration=0.0,
        termination_reason=TerminationReason.USER_STOP, messages=messages,
    )  # fmt: skip
    start = time.perf_counter()
    info = evaluate_simulation(simulation, task, EvaluationType.ALL, False, domain=DOMAIN, env_kwargs=env_kwargs)
    timings["verify"].append(time.perf_counter() - start)
    return info.reward


def main() -> None:
    request = json.loads(sys.stdin.read())
    nl_assertions.DEFAULT_LLM_NL_ASSERTIONS = "openai/scripted-judge"
    nl_assertions.DEFAULT_LLM_NL_ASSERTIONS_ARGS = {"api_base": request["judge_base_url"], "api_key": "none"}
    run = TextRunConfig(domain=DOMAIN, retrieval_config=request["variant"])
    tasks = {task.id: task for task in get_tasks(DOMAIN, "base")}
    timings: dict[str, list[float]] = {"seed": [], "tool": [], "read": [], "verify": []}
    for task_id in request["task_ids"]:
        reward = play(tasks[task_id], run, request["reads"], timings)
        assert reward == 1.0, (task_id, reward)
    _OUT.write(json.dumps(timings))
    _OUT.flush()


if __name__ == "__main__":
    main()
