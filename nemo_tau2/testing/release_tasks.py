"""Tasks of a later tau2 release for the fake server's scripts (the oracle's gold actions, the scripted user's
scenario): its own serialisation of them, read from a file, for domains v0.2.1 does not have (banking_knowledge,
telecom-workflow) or whose gold the release changed.

The file is what a release's worker lists (``Tau2Worker.request("tasks", domain=..., split=None)``), as
``{domain: [task, ...]}``: ``write_release_tasks`` writes it. The tasks are read with v0.2.1's ``Task`` model (the
fields the scripts use are the same; the release's additions are ignored). Tasks read here replace v0.2.1's of the
same domain and id, for the rest of the process.
"""

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tau2.data_model.tasks import Task

_tasks: dict[tuple[str, str], "Task"] = {}
_required_documents: dict[tuple[str, str], list[str]] = {}  # a knowledge task's (v0.2.1's Task has no such field)
_loaded: set[str] = set()


def load_release_tasks(path: str | Path) -> bool:
    """Read ``path`` (once per path) and serve its tasks from now on; True when it was new (scripts built from the
    tasks it replaces must be built again)."""
    path = str(Path(path).resolve())
    if path in _loaded:
        return False
    from tau2.data_model.tasks import Task

    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not all(isinstance(tasks, list) for tasks in data.values()):
        raise ValueError(f"{path}: expected {{domain: [task, ...]}} as a tau2 release's worker lists its tasks")
    for domain, tasks in data.items():
        for task in tasks:
            _tasks[(domain, str(task["id"]))] = Task.model_validate(task)
            _required_documents[(domain, str(task["id"]))] = list(task.get("required_documents") or [])
    _loaded.add(path)
    return True


def release_task(domain: str, task_id: str) -> "Task | None":
    return _tasks.get((domain, str(task_id)))


def required_documents(domain: str, task_id: str) -> list[str]:
    """The release task's ``required_documents`` (banking_knowledge's; empty for others)."""
    return _required_documents.get((domain, str(task_id)), [])


def write_release_tasks(path: str | Path, tasks_by_domain: dict[str, list[dict[str, Any]]]) -> Path:
    Path(path).write_text(json.dumps(tasks_by_domain))
    return Path(path)


def release_task_ids(domain: str) -> list[str]:
    """The ids of the release tasks read for ``domain``, in the file's order."""
    return [task_id for task_domain, task_id in _tasks if task_domain == domain]
