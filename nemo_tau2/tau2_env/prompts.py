"""The prompts tau2 gives its agent and its user simulator, built with tau2's own templates.

Prompts are part of reward parity: the texts come from tau2's modules, never retyped here. Those modules
import litellm (slow, ~3-5 s), so they are imported on first use, and only by the processes that need them.
"""

import functools

from tau2.user.base import OUT_OF_SCOPE, STOP, TRANSFER

from nemo_tau2.tau2_env import domains

#: Strings in a user message that end the episode (``UserSimulator.is_stop``): stop, transfer, out of scope.
USER_STOP_TOKENS = (STOP, TRANSFER, OUT_OF_SCOPE)


@functools.cache
def greeting() -> str:
    """tau2's fixed first message: without a task message history, the agent greets and the user speaks next."""
    from tau2.orchestrator.orchestrator import DEFAULT_FIRST_AGENT_MESSAGE

    return DEFAULT_FIRST_AGENT_MESSAGE.content


@functools.cache
def agent_system_prompt(domain: str) -> str:
    """tau2 ``LLMAgent.system_prompt``: its agent instruction plus the domain policy."""
    from tau2.agent.llm_agent import AGENT_INSTRUCTION, SYSTEM_PROMPT

    return SYSTEM_PROMPT.format(domain_policy=domains.policy(domain), agent_instruction=AGENT_INSTRUCTION)


def user_system_prompt(domain: str, task_id: str) -> str:
    """tau2 ``UserSimulator.system_prompt`` for the task: guidelines (tools variant if the user has tools)
    plus the task's scenario."""
    from tau2.user.user_simulator import UserSimulator

    task = domains.get_task(domain, task_id)
    has_user_tools = bool(domains.user_tool_names(domain))
    # UserSimulator picks the guidelines by whether it has tools; any non-None list selects the tools variant.
    simulator = UserSimulator(tools=[] if has_user_tools else None, instructions=str(task.user_scenario))
    return simulator.system_prompt


def is_user_stop(text: str | None) -> bool:
    return bool(text) and any(token in text for token in USER_STOP_TOKENS)
