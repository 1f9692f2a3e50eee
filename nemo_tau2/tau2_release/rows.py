"""Gym rows of a tau2 release that runs in its own environment: every part from that release, through its worker.

The same row shape as :func:`nemo_tau2.tau2_env.gym_rows.task_row` (the v0.2.1 rows): the policy's system prompt
(the release's agent instruction and domain policy), its tools, its greeting, and ``domain``/``task_id``; plus
``tau2_version``, so a row says which release's task it is. Tasks and splits are the release's own, or a split of
ours where the release has none (``ours_seed<N>_train``/``_test``, :mod:`~nemo_tau2.tau2_env.own_splits`).
"""

from typing import Any

from nemo_tau2.tau2_env.domains import as_responses_tools
from nemo_tau2.tau2_env.gym_rows import DEFAULT_AGENT_NAME, compact_row
from nemo_tau2.tau2_env.own_splits import is_own_split, own_split_ids
from nemo_tau2.tau2_release.client import KNOWLEDGE_DOMAINS, Tau2RequestError, Tau2Worker, worker_for
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig


def _domain_rows(
    worker: Tau2Worker, domain: str, split: str | None, agent_name: str, compact: bool, wanted: set[str] | None
) -> list[dict]:
    knowledge = domain in KNOWLEDGE_DOMAINS
    per_task = knowledge and worker.retrieval["task_specific"]  # golden_retrieval: the task's documents in the prompt
    system_prompt = None if per_task else worker.request("agent_system_prompt", domain=domain)
    tools = as_responses_tools(worker.request("tool_schemas", domain=domain))
    greeting = worker.request("greeting")
    rows = []
    for task in _split_tasks(worker, domain, split):
        if wanted is not None and str(task["id"]) not in wanted:
            continue
        if per_task:
            system_prompt = worker.request("agent_system_prompt", domain=domain, task_id=str(task["id"]))
        if (task.get("initial_state") or {}).get("message_history"):
            raise ValueError(f"{domain} task {task['id']!r} starts from a pre-written message history (unsupported)")
        row: dict[str, Any] = {
            "responses_create_params": {
                "input": [{"role": "system", "content": system_prompt}, {"role": "assistant", "content": greeting}],
                "tools": tools,
                "parallel_tool_calls": True,
            },
            "agent_ref": {"type": "responses_api_agents", "name": agent_name},
            "domain": domain,
            "task_id": str(task["id"]),
            "split": split,
            "tau2_version": worker.config.version,
        }
        if knowledge:  # the prompt and tools are the variant's: the server refuses the row under another
            row["retrieval_variant"] = worker.retrieval["variant"]
        if compact:
            row = compact_row(row, {action["name"] for action in _gold_actions(task)})
        rows.append(row)
    return rows


def _split_tasks(worker: Tau2Worker, domain: str, split: str | None) -> list[dict]:
    """The release's tasks of ``split``: one of its own, or one of ours (:mod:`~nemo_tau2.tau2_env.own_splits`)."""
    if not is_own_split(split):
        return worker.request("tasks", domain=domain, split=split)
    every = worker.request("tasks", domain=domain, split=None)
    kept = set(own_split_ids(domain, [str(task["id"]) for task in every], split))
    return [task for task in every if str(task["id"]) in kept]


def _gold_actions(task: dict) -> list[dict]:
    return list((task.get("evaluation_criteria") or {}).get("actions") or [])


def check_release(rows: list[dict], version: str, what: str = "data", retrieval_variant: str | None = None) -> None:
    """Refuse rows of another tau2 release than the run's (a rows file says which in ``tau2_version``; rows
    without it are v0.2.1's, as ``prepare_data.py`` wrote them before there was a choice), and knowledge rows written
    for another retrieval variant than ``retrieval_variant`` (their prompt and tools are that variant's)."""
    other = sorted({str(row.get("tau2_version", "v0.2.1")) for row in rows} - {version})
    if other:
        raise ValueError(f"{what}: the rows are of tau2 {other}, not tau2.version {version}")
    variants = {str(row.get("retrieval_variant")) for row in rows if row.get("domain") in KNOWLEDGE_DOMAINS}
    if retrieval_variant is not None and variants - {retrieval_variant}:
        raise ValueError(
            f"{what}: the rows were written for retrieval variant {sorted(variants)}, not tau2.retrieval_variant "
            f"{retrieval_variant}: write them again (prepare_data.py ... tau2.retrieval_variant={retrieval_variant})"
        )


def release_rows(
    config: Tau2ReleaseConfig,
    domains_: list[str],
    split: str | None,
    task_ids: list[str] | None = None,
    num_tasks: int | None = None,
    agent_name: str = DEFAULT_AGENT_NAME,
    what: str = "data",
    compact: bool = False,
    worker: Tau2Worker | None = None,
) -> list[dict]:
    """Rows of ``split`` in each domain (``task_ids`` only those, ``num_tasks`` the first N of each), in the
    release's split order (``compact``: :func:`~nemo_tau2.tau2_env.gym_rows.compact_row`); ``split`` None: every
    task. Raises ``ValueError`` naming the setting to fix (unknown split or task). ``worker``: one already running
    (else one is started for this call)."""
    wanted = None if task_ids is None else {str(task_id) for task_id in task_ids}
    rows = []
    with worker_for(config, worker) as worker:
        for domain in domains_:
            try:
                found = _domain_rows(worker, domain, split, agent_name, compact, wanted)
            except Tau2RequestError as e:
                raise ValueError(f"{what}.split: {e}") from e
            rows += found[:num_tasks]
    if wanted is not None and (missing := wanted - {row["task_id"] for row in rows}):
        where = f"{split} split" if split is not None else "tasks"
        raise ValueError(f"{what}.task_ids: not in tau2 {config.version}'s {where}: {sorted(missing)}")
    return rows


def release_split_ids(config: Tau2ReleaseConfig, domains_: list[str], split: str) -> dict[str, frozenset[str]]:
    """Per domain, the ids of the release's ``split`` (empty where the domain has none), from one worker."""
    with Tau2Worker(config) as worker:
        if is_own_split(split):
            ids = {domain: [str(task["id"]) for task in _split_tasks(worker, domain, split)] for domain in domains_}
            return {domain: frozenset(domain_ids) for domain, domain_ids in ids.items()}
        return {domain: frozenset(worker.request("splits", domain=domain).get(split, ())) for domain in domains_}
