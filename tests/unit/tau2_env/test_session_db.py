"""Episode DBs share one snapshot safely, and their comparison decides what tau2's DB hash decides."""

import copy

import pytest
from tau2.utils import get_dict_hash

from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.episode import Episode
from nemo_tau2.tau2_env.session_db import CopyOnAccessDict, SnapshotJsonCache, databases_equal, fork_database


def _tau2_hash(db) -> str:
    return get_dict_hash(db.model_dump())


def test_keyed_access_copies_and_iteration_sees_the_episode_view():
    snapshot = {"a": {"n": 1}, "b": {"n": 2}}
    view = CopyOnAccessDict(snapshot)
    view["a"]["n"] = 10
    view.setdefault("c", {"n": 3})
    del view["b"]
    assert snapshot == {"a": {"n": 1}, "b": {"n": 2}}
    assert dict(view) == {"a": {"n": 10}, "c": {"n": 3}}
    assert view.owned == {"a", "b", "c"}
    assert view.get("a") is view["a"] and view.get("zz", 7) == 7
    assert view.pop("c") == {"n": 3} and "c" not in view


def test_deepcopy_of_a_view_is_independent():
    view = CopyOnAccessDict({"a": {"n": 1}})
    view["a"]["n"] = 5
    clone = copy.deepcopy(view)
    clone["a"]["n"] = 6
    assert view["a"]["n"] == 5 and clone["a"]["n"] == 6


@pytest.mark.parametrize("domain", ["airline", "retail", "telecom"])
def test_snapshot_is_never_mutated_by_any_base_task(domain):
    db, user_db = domains.snapshot_databases(domain)
    before = (_tau2_hash(db), _tau2_hash(user_db) if user_db else None)
    for task in domains.get_tasks(domain, "base"):
        episode = Episode.start(domain, task.id)
        for action in task.evaluation_criteria.actions or []:
            episode.call_tool(action.name, action.arguments, action.requestor)
            wrong = {
                key: (value + "x" if isinstance(value, str) else value) for key, value in action.arguments.items()
            }
            episode.call_tool(action.name, wrong, action.requestor)
    assert (_tau2_hash(db), _tau2_hash(user_db) if user_db else None) == before


@pytest.mark.parametrize("domain", ["airline", "retail", "telecom"])
def test_databases_equal_agrees_with_tau2_hash(domain):
    cache = SnapshotJsonCache()
    tasks = [task for task in domains.get_tasks(domain, "base") if task.evaluation_criteria.actions][:25]
    episodes = []
    for task in tasks:
        episode = Episode.start(domain, task.id)
        for action in task.evaluation_criteria.actions:
            episode.call_tool(action.name, action.arguments, action.requestor)
        episodes.append(episode)
    untouched = Episode.start(domain, tasks[0].id)
    episodes.append(untouched)
    hashes = [_tau2_hash(episode.env.tools.db) for episode in episodes]
    agreements = set()
    for left, left_hash in zip(episodes, hashes, strict=True):
        for right, right_hash in list(zip(episodes, hashes, strict=True))[::5]:
            same_hash = left_hash == right_hash
            assert databases_equal(left.env.tools.db, right.env.tools.db, cache) == same_hash
            agreements.add(same_hash)
    assert agreements == {True, False}  # both outcomes were exercised


def test_fork_of_a_db_serialises_like_the_snapshot():
    db, _ = domains.snapshot_databases("retail")
    fork = fork_database(db)
    assert _tau2_hash(fork) == _tau2_hash(db)
    next(iter(fork.orders.values()))  # iteration does not claim entries
    assert fork.orders.owned == set()
