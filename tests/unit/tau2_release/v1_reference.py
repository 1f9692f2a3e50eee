"""tau2 v1.0.1 itself scoring the parity test's scripted episodes; runs in v1.0.1's environment, not the project's.

Reads ``{"domains": [...], "judge_base_url": ..., "task_ids": {domain: [...]}, "retrieval_variant": ...,
"reads": [...], "scripts": [...]}`` on stdin (a domain missing from ``task_ids``: all its base tasks; ``reads``: the
knowledge reads of ``extra_reads``; ``scripts``, optional: the only scripts played). For every base task of each
domain it plays every script of ``episode_scripts`` with tau2's own parts only (``build_environment`` with the
arguments its runner builds for the task, ``_build_env_kwargs``, which for banking_knowledge adds the retrieval
variant; the task's initial state as the orchestrator applies it; ``Environment.get_response``; tau2's message
models) and scores it with ``evaluate_simulation(..., ALL)``, the NL-assertion judge pointed at the same scripted
judge. Writes ``{"<domain>/<task>/<script>": {"reward", "reward_basis", "reward_breakdown", "tool_answers"}}`` on
stdout.
"""

import json
import os
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
_OUT = os.fdopen(os.dup(sys.stdout.fileno()), "w")
os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # tau2 prints while importing
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from episode_scripts import episode_scripts  # noqa: E402
from loguru import logger  # noqa: E402

logger.remove()

import tau2.evaluator.evaluator_nl_assertions as nl_assertions  # noqa: E402
from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage  # noqa: E402
from tau2.data_model.simulation import SimulationRun, TerminationReason, TextRunConfig  # noqa: E402
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation  # noqa: E402
from tau2.orchestrator.orchestrator import DEFAULT_FIRST_AGENT_MESSAGE  # noqa: E402
from tau2.runner import build_environment, get_tasks  # noqa: E402
from tau2.runner.build import _build_env_kwargs  # noqa: E402

_SENDERS = {"assistant": AssistantMessage, "user": UserMessage}


def play(domain: str, task, script: dict, run: TextRunConfig) -> dict:
    env_kwargs = _build_env_kwargs(run, task)  # what tau2's runner gives the environments (banking: the variant)
    env = build_environment(domain, env_kwargs=env_kwargs)
    state = task.initial_state
    env.set_state(
        initialization_data=state.initialization_data if state else None,
        initialization_actions=state.initialization_actions if state else None,
        message_history=[],
    )
    env.sync_tools()
    messages, answers = [], []
    for index, step in enumerate(script["steps"]):
        if step[0] == "text":
            messages.append(_SENDERS[step[1]](role=step[1], content=step[2]))
            continue
        _, requestor, name, arguments = step
        call = ToolCall(id=f"call_{index}", name=name, arguments=arguments, requestor=requestor)
        messages.append(_SENDERS[requestor](role=requestor, content=None, tool_calls=[call]))
        answer = env.get_response(call)
        messages.append(answer)
        answers.append({"content": answer.content, "error": answer.error})
    simulation = SimulationRun(
        id=uuid.uuid4().hex,
        task_id=task.id,
        start_time="",
        end_time="",
        duration=0.0,
        termination_reason=TerminationReason(script["termination_reason"]),
        messages=messages,
    )
    info = evaluate_simulation(
        simulation, task, EvaluationType.ALL, solo_mode=False, domain=domain, env_kwargs=env_kwargs
    )
    return {
        "reward": info.reward,
        "reward_basis": [basis.value for basis in info.reward_basis or []],
        "reward_breakdown": {key.value: value for key, value in (info.reward_breakdown or {}).items()},
        "tool_answers": answers,
    }


def main() -> None:
    request = json.loads(sys.stdin.read())
    nl_assertions.DEFAULT_LLM_NL_ASSERTIONS = "openai/scripted-judge"
    nl_assertions.DEFAULT_LLM_NL_ASSERTIONS_ARGS = {
        "temperature": 0.0,
        "api_base": request["judge_base_url"],
        "api_key": "none",
        "num_retries": 0,
    }
    results = {}
    for domain in request["domains"]:
        variant = request.get("retrieval_variant") if domain == "banking_knowledge" else None
        run = TextRunConfig(domain=domain, retrieval_config=variant)
        wanted = (request.get("task_ids") or {}).get(domain)
        for task in get_tasks(domain, "base"):
            if wanted is not None and task.id not in wanted:
                continue
            greeting = DEFAULT_FIRST_AGENT_MESSAGE.content
            scripts = episode_scripts(task.model_dump(mode="json"), greeting, request.get("reads"))
            for name, script in scripts.items():
                if name not in request.get("scripts", scripts):
                    continue
                results[f"{domain}/{task.id}/{name}"] = play(domain, task, script, run)
    _OUT.write(json.dumps(results))
    _OUT.flush()


if __name__ == "__main__":
    main()
