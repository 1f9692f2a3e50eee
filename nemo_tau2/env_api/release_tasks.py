"""What ``Tau2Env`` needs of a tau2 release that runs in its own environment (v1.0.1): its tasks, as that release
gives them through its worker (the same rows ``run_eval.py`` plays: system prompt, greeting, tools), the policy's
tools in Chat Completions format, and each task's reward basis. Nothing of the release is read in this process."""

from dataclasses import dataclass

from nemo_tau2.env_api.config import Tau2EnvConfig
from nemo_tau2.tau2_release.client import Tau2Worker, worker_for
from nemo_tau2.tau2_release.rows import release_rows


@dataclass
class ReleaseTasks:
    task_ids: list[str]
    rows: dict[str, dict]  # task id -> its Gym row
    tools: list[dict]  # the policy's tools, Chat Completions format (as ``Tool.openai_schema`` of that release)
    reward_basis: dict[str, list[str]]  # task id -> the release's reward basis

    @classmethod
    def load(cls, config: Tau2EnvConfig, running: Tau2Worker | None = None) -> "ReleaseTasks":
        """From a ``running`` worker of the release, else one started for this call."""
        with worker_for(config.tau2, running) as worker:
            rows = release_rows(
                config.tau2, [config.domain], config.split, config.task_ids, what="Tau2Env", worker=worker
            )
            tools = worker.request("tool_schemas", domain=config.domain)
            tasks = worker.request("tasks", domain=config.domain, split=None)
        if not rows:
            raise ValueError(f"{config.domain} split {config.split!r} has no task Tau2Env can play")
        basis = {
            str(task["id"]): list((task.get("evaluation_criteria") or {}).get("reward_basis") or []) for task in tasks
        }
        by_id = {row["task_id"]: row for row in rows}
        return cls(list(by_id), by_id, [dict(schema) for schema in tools], basis)
