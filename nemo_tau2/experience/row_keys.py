"""What a Gym row plays, as results key it: a task, or one turn of a task (a pivot row, PivotRL's: docs/pivot-rl.md).

A pivot row carries its task's ``domain`` and ``task_id`` (what rebuilds its state) and its own ``pivot_id``: a task
has several pivots, so everything that keys results by task (resume, the curriculum, reports) keys a pivot row by
:func:`episode_task`.
"""

from typing import Any


def episode_task(task_id: Any, pivot_id: str | None = None) -> str:
    """What a row plays: its task, or for a pivot row (one turn of a task, PivotRL) the task and the pivot. Results
    are keyed, resumed, counted and reported by it: a task's pivots are distinct rows."""
    return f"{task_id}@{pivot_id}" if pivot_id else str(task_id)


def pivot_tool(action: Any) -> str | None:
    """What a pivot's demonstrated action is, for reports: the tool it calls (a batch's first) or ``message``."""
    if not isinstance(action, dict):
        return None
    calls = action.get("calls") or [action]
    return "message" if action.get("type") == "message" else str(calls[0].get("name"))
