"""tau2 tasks as NeMo-Gym dataset rows: what ``examples/prepare_data.py`` writes and every rollout starts from.

A row holds what the policy sees at the start of the episode, exactly as tau2's ``LLMAgent`` would: its system
prompt (tau2's agent instruction + the domain policy), the agent tools, and the conversation start (tau2's fixed
greeting; the simulated user speaks next). ``domain`` and ``task_id`` tell the resources server which task to seed;
``agent_ref`` names the NeMo-Gym agent that plays it.
"""

from typing import Any

from nemo_tau2.tau2_env import domains, prompts

DEFAULT_AGENT_NAME = "tau2_agent"


def task_row(domain: str, task_id: str, agent_name: str = DEFAULT_AGENT_NAME, split: str | None = None) -> dict:
    task = domains.get_task(domain, task_id)
    if task.initial_state is not None and task.initial_state.message_history:
        raise ValueError(
            f"{domain} task {task_id!r} starts from a pre-written message history, which nemo-tau2 rows do not "
            "support yet (only tau2's mock domain has such tasks)"
        )
    row: dict[str, Any] = {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": prompts.agent_system_prompt(domain)},
                {"role": "assistant", "content": prompts.greeting()},
            ],
            "tools": domains.responses_tool_schemas(domain),
            "parallel_tool_calls": True,
        },
        "agent_ref": {"type": "responses_api_agents", "name": agent_name},
        "domain": domain,
        "task_id": task.id,
    }
    if split is not None:
        row["split"] = split
    return row


def split_rows(domains_: list[str], split: str, agent_name: str = DEFAULT_AGENT_NAME) -> list[dict]:
    """Rows for every task of ``split`` in each domain, domain by domain, in tau2's split order."""
    rows = []
    for domain in domains_:
        for task in domains.get_tasks(domain, split):
            rows.append(task_row(domain, task.id, agent_name, split))
    return rows
