"""Forks of a live episode in the worker: N independent episodes in its state, each of its own.

A fork is a new episode of the parent's task, built as ``seed`` builds any episode (tau2's constructor on a fork of
the domain's DB snapshot, its own sandbox in the shell variants), with the parent's calls run in it again through
tau2's boundary, in their order. Everything the episode holds then follows from tau2's own code, as it did in the
parent: the DB's writes (copy-on-write over the snapshot), banking_knowledge's unlocked tools (in-memory toolkit
state), the files a shell command wrote in its sandbox. No object is shared with the parent or a sibling. Each
replayed answer must equal the one the parent got; one that differs (a tool whose answer is not a function of the
state) refuses the whole fork, naming the call, and ends the forks made so far: never a fork in another state.
"""

import json


class ForkRefused(ValueError):
    """A replayed call answered otherwise than in the parent: the forks would not be in its state."""


def fork(parent: dict, n: int, seed, call_tool, end) -> list[str]:
    """``n`` new episode ids in ``parent``'s state (``parent``: the worker's episode record; its ``calls``, each
    ``((name, arguments, requestor, call_id), answer)``, in the order they ran)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ForkRefused(f"n must be a positive int, got {n!r}")
    forks: list[str] = []
    try:
        for _ in range(n):
            forks.append(seed(parent["domain"], parent["task"].id)["episode_id"])
            for number, (call, answer) in enumerate(parent["calls"], 1):
                again = call_tool(forks[-1], *call)
                if again != answer:
                    raise ForkRefused(
                        f"call {number} ({call[0]}) answers {again['content']!r:.120} in a fork where the "
                        f"episode got {answer['content']!r:.120}: its state cannot be forked"
                    )
    except BaseException:
        for fork_id in forks:
            end(fork_id)
        raise
    return forks


def digest(episode: dict) -> str:
    """The episode's state as tau2 compares states: its agent and user DB hashes (tau2's own ``get_db_hash``), and
    the tools it unlocked (banking_knowledge's in-memory toolkit state, which no DB holds)."""
    env = episode["env"]
    unlocked = [
        sorted(getattr(tools, name, None) or {})
        for tools in (env.tools, env.user_tools)
        for name in ("_agent_discoverable_tools_state", "_user_discoverable_tools_state")
    ]
    return json.dumps([env.get_db_hash(), env.get_user_db_hash(), unlocked])
