"""tau2 tasks as NeMo-Gym dataset rows: what ``examples/prepare_data.py`` writes and every rollout starts from.

A row holds what the policy sees at the start of the episode, exactly as tau2's ``LLMAgent`` would: its system
prompt (tau2's agent instruction + the domain policy), the agent tools, and the conversation start (tau2's fixed
greeting; the simulated user speaks next). ``domain`` and ``task_id`` tell the resources server which task to seed;
``agent_ref`` names the NeMo-Gym agent that plays it.
"""

import json
from pathlib import Path
from typing import Any

from nemo_tau2.tau2_env import domains, prompts

DEFAULT_AGENT_NAME = "tau2_agent"
COMPACT_SYSTEM_PROMPT = (
    "You are a customer service agent. Do what the user asks with the tools, then ask if there is anything else."
)


class UnsupportedTaskError(ValueError):
    """A task that a Gym row cannot express (the reason is the message)."""


def unsupported_reason(task: Any) -> str | None:
    """Why a tau2 task cannot be written as a row, or None when it can."""
    if task.initial_state is not None and task.initial_state.message_history:
        return "starts from a pre-written message history, which nemo-tau2 rows do not support yet"
    return None


def task_row(domain: str, task_id: str, agent_name: str = DEFAULT_AGENT_NAME, split: str | None = None) -> dict:
    task = domains.get_task(domain, task_id)
    reason = unsupported_reason(task)
    if reason is not None:
        raise UnsupportedTaskError(f"{domain} task {task_id!r} {reason} (only tau2's mock domain has such tasks)")
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


def split_rows(
    domains_: list[str],
    split: str,
    agent_name: str = DEFAULT_AGENT_NAME,
    skipped: list[tuple[str, str, str]] | None = None,
) -> list[dict]:
    """Rows for every task of ``split`` in each domain, domain by domain, in tau2's split order.

    A task no row can express raises :class:`UnsupportedTaskError`; with a ``skipped`` list it is left out and
    recorded there as ``(domain, task_id, reason)`` instead."""
    rows = []
    for domain in domains_:
        for task in domains.get_tasks(domain, split):
            reason = unsupported_reason(task)
            if reason is not None and skipped is not None:
                skipped.append((domain, task.id, reason))
                continue
            rows.append(task_row(domain, task.id, agent_name, split))
    return rows


def compact_rows(domain: str, task_ids: list[str], agent_name: str = DEFAULT_AGENT_NAME) -> list[dict]:
    """Rows with a short system prompt and only the tools of each task's gold actions (toy models with small
    contexts, e.g. a GRPO config's ``tiny_policy``); scores are then not comparable with tau2's prompts."""
    rows = []
    for task_id in task_ids:
        task = domains.get_task(domain, task_id)
        used = {action.name for action in task.evaluation_criteria.actions or []}
        rows.append(compact_row(task_row(domain, task_id, agent_name), used))
    return rows


def compact_row(row: dict, used_tools: set[str]) -> dict:
    """``row`` with the short system prompt and only the tools in ``used_tools`` (those of the task's gold actions):
    one way for every tau2 release's rows."""
    params = row["responses_create_params"]
    params["input"][0]["content"] = COMPACT_SYSTEM_PROMPT
    params["tools"] = [tool for tool in params["tools"] if tool["name"] in used_tools]
    return row


def load_rows(
    *,
    data_path: str | Path | None = None,
    domains_: list[str] | None = None,
    split: str | None = None,
    task_ids: list[str] | None = None,
    num_tasks: int | None = None,
    compact: bool = False,
    what: str = "data",
    split_key: str = "split",
    path_key: str = "data_path",
) -> list[dict]:
    """The Gym rows a run plays, for evaluation and GRPO alike: a JSONL file of rows (as ``prepare_data.py``
    writes them), or the tasks of ``split`` in each domain (``compact``: :func:`compact_rows`). ``task_ids`` keeps
    only those tasks (each must exist), ``num_tasks`` the first N of each domain. ``what`` names the config block
    in messages, ``split_key`` and ``path_key`` its keys for the split and the file. No file and no split: no rows."""
    wanted = None if task_ids is None else {str(task_id) for task_id in task_ids}
    if data_path:
        rows = [
            row
            for row in _read_rows(Path(data_path), f"{what}.{path_key}")
            if wanted is None or str(row["task_id"]) in wanted
        ]
        if num_tasks is not None:
            taken: dict[str, int] = {}
            for row in rows:
                taken[str(row["domain"])] = taken.get(str(row["domain"]), 0) + 1
                row["_keep"] = taken[str(row["domain"])] <= num_tasks
            rows = [row for row in rows if row.pop("_keep")]
    elif split is not None:
        rows = []
        for domain in domains_ or []:
            try:
                tasks = domains.get_tasks(domain, split)
            except domains.UnknownTaskError as e:
                raise ValueError(f"{what}.{split_key}: {e}; set {what}.{split_key} to one of them") from e
            ids = [task.id for task in tasks if wanted is None or task.id in wanted][:num_tasks]
            try:
                rows += compact_rows(domain, ids) if compact else [task_row(domain, i, split=split) for i in ids]
            except ValueError as e:
                raise ValueError(f"{what}: {e}; choose other tasks ({what}.task_ids, {what}.num_tasks)") from e
    else:
        return []
    if wanted is not None:
        missing = wanted - {str(row["task_id"]) for row in rows}
        if missing:
            raise ValueError(
                f"{what}.task_ids: not found in the selected data: {sorted(missing)}; fix them or add the override "
                f"{what}.task_ids=null"
            )
    return rows


def _read_rows(path: Path, key: str) -> list[dict]:
    """Gym rows from a JSONL file, each checked to be a tau2 row; a problem names the line and the fix."""
    if not path.is_file():
        raise ValueError(f"{key}: no such file {path}; write Gym rows with examples/prepare_data.py --output {path}")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{key}: {path} line {number} is not JSON ({e.msg}); rewrite the file") from e
        missing = [key for key in ("responses_create_params", "domain", "task_id") if key not in row] if isinstance(
            row, dict) else ["a JSON object"]  # fmt: skip
        if missing:
            raise ValueError(
                f"{key}: {path} line {number} is not a tau2 Gym row (missing {missing}); write rows with "
                "examples/prepare_data.py"
            )
        rows.append(row)
    return rows
