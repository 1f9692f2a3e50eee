"""Forks in tau2 v1.0.1's worker where a resources server's HTTP tests cannot look: a shell variant's fork has a
sandbox of its own, holding what the parent's commands wrote before the fork and nothing a sibling writes after it
(the package's terminal_use_write worker); a fork whose replayed call answers otherwise is refused whole."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from nemo_tau2.gym.resources_server.release import WorkerEpisode
from nemo_tau2.tau2_release.client import WORKER_DIR

DOMAIN = "banking_knowledge"


def _shell(episode: WorkerEpisode, command: str) -> str:
    return episode.call_tool("shell", {"command": command}).content


def _seeded(worker, task_id: str) -> WorkerEpisode:
    return WorkerEpisode(worker, DOMAIN, task_id, worker.request("seed", domain=DOMAIN, task_id=task_id)["episode_id"])


def test_a_shell_fork_has_a_sandbox_of_its_own(writable):
    parent = _seeded(writable, "task_002")
    assert _shell(parent, "echo parent > notes.md && cat notes.md") == "parent\n"
    first, second = parent.fork(2)
    assert first.num_tool_calls == second.num_tool_calls == 1
    assert _shell(first, "cat notes.md") == _shell(second, "cat notes.md") == "parent\n"  # the parent's write
    assert _shell(first, "echo first > notes.md && cat notes.md") == "first\n"
    assert _shell(second, "cat notes.md") == _shell(parent, "cat notes.md") == "parent\n"
    root = Path(writable.retrieval["shell"]["sandboxes"])
    assert len(list(root.glob("*/knowledge_base/notes.md"))) == 3  # one folder each
    for episode in (parent, first, second):
        episode.close()
    assert list(root.glob("*/knowledge_base/notes.md")) == []  # each fork's sandbox goes with it


def test_a_fork_whose_replayed_call_answers_otherwise_is_refused_and_leaves_no_episode():
    sys.path.insert(0, str(WORKER_DIR))
    try:
        import nemo_tau2_tau2_forks as forks  # the worker's module: standard library only
    finally:
        sys.path.remove(str(WORKER_DIR))
    live, answers = set(), iter(["same", "same", "same", "other"])

    def seed(domain, task_id):
        live.add(episode_id := f"e{len(live)}-{domain}-{task_id}")
        return {"episode_id": episode_id}

    def call_tool(episode_id, name, arguments, requestor, call_id):
        return {"content": next(answers), "error": False}

    call = (("get", {}, "assistant", "c"), {"content": "same", "error": False})
    parent = {"domain": "retail", "task": SimpleNamespace(id="0"), "calls": [call, call]}
    with pytest.raises(forks.ForkRefused, match=r"call 2 \(get\) answers 'other' in a fork where the episode got"):
        forks.fork(parent, 2, seed, call_tool, live.discard)
    assert live == set()  # the first fork, made, ended with the refusal
    with pytest.raises(forks.ForkRefused, match="n must be a positive int"):
        forks.fork(parent, 0, seed, call_tool, live.discard)
