"""tau2 v1.0.1's own tool schemas and prompts, for the worker's memoised ones to be compared with; runs in v1.0.1's
environment. Reads ``{"tasks": {domain: task_id}}`` on stdin; writes, per domain, the agent's tool schemas
(``Environment.get_tools``) and system prompt (``LLMAgent``'s template), and for the task the user simulator's
system prompt and tool schemas (``build_user`` on the task's initial state, as the orchestrator sets it)."""

import json
import os
import sys

_OUT = os.fdopen(os.dup(sys.stdout.fileno()), "w")
os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # tau2 prints while importing
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from tau2.agent.llm_agent import AGENT_INSTRUCTION, SYSTEM_PROMPT  # noqa: E402
from tau2.runner import build_environment, build_user, get_tasks  # noqa: E402


def specs(domain: str, task_id: str) -> dict:
    env = build_environment(domain)
    agent = {
        "tool_schemas": [tool.openai_schema for tool in env.get_tools()],
        "system_prompt": SYSTEM_PROMPT.format(domain_policy=env.get_policy(), agent_instruction=AGENT_INSTRUCTION),
    }
    task = next(task for task in get_tasks(domain) if task.id == task_id)
    state = task.initial_state
    env.set_state(
        initialization_data=state.initialization_data if state else None,
        initialization_actions=state.initialization_actions if state else None,
        message_history=list(state.message_history or []) if state else [],
    )
    env.sync_tools()
    user = build_user("user_simulator", env, task, llm="none")
    user_specs = {"system_prompt": user.system_prompt, "tools": [tool.openai_schema for tool in user.tools or []]}
    return {"agent": agent, "user": user_specs}


if __name__ == "__main__":
    request = json.loads(sys.stdin.read())
    _OUT.write(json.dumps({domain: specs(domain, task_id) for domain, task_id in request["tasks"].items()}))
    _OUT.flush()
