"""How episodes ended, per domain: the share of each failure kind, and the shares NeMo-Gym's tau2 agent reports.

Each episode record carries its :class:`~nemo_tau2.gym.agent.episode_record.FailureKind` (written by the agent; an
infrastructure failure the rollout side saw is ``infrastructure``). Per scope (a domain, or ``overall``):

- ``failure_kind/<kind>/pct``: the share of the scope's episodes, infrastructure failures included, that ended
  that way (every kind, 0 included, so that the shares of a scope sum to 1);
- under the names NeMo-Gym's tau2 agent gives them in its ``compute_metrics`` (``responses_api_agents/tau2``),
  over the episodes that were played (an infrastructure failure has no trajectory):
  ``trajectory_termination_reason/<reason>/pct``, ``trajectory_transfer_to_human_agents/pct``,
  ``trajectory_missing_tool_call/pct`` (the policy called no tool at all) and ``tool_call_hallucination/count/total``
  (calls of tools that do not exist); beside them, without a NeMo-Gym name, ``tool_call_malformed/count/total``.

Records written before the kind was recorded have none: they are left out of the shares and counted in
``failure_kind/not_recorded/count``, so an old run's summary says the shares do not cover it.
"""

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from nemo_tau2.gym.agent.episode_record import EpisodeStatus, FailureKind

KINDS: tuple[str, ...] = tuple(FailureKind)


def kind_key(kind: str) -> str:
    return f"failure_kind/{kind}/pct"


def ending_metrics(prefix: str, records: Sequence[Any]) -> dict[str, float]:
    """The shares above for ``records`` (objects with ``status``, ``termination_reason``, ``tau2_failure_kind`` and
    ``agent_tool_calls``), each key under ``prefix``; empty when no record carries a kind (a single-turn eval)."""
    known = [r for r in records if r.tau2_failure_kind is not None]
    if not known:
        return {}
    out: dict[str, float] = {}
    kinds = Counter(str(r.tau2_failure_kind) for r in known)
    for kind in KINDS:
        out[f"{prefix}/{kind_key(kind)}"] = kinds[kind] / len(known)
    if len(known) < len(records):
        out[f"{prefix}/failure_kind/not_recorded/count"] = len(records) - len(known)
    played = [r for r in known if r.status == EpisodeStatus.OK]
    for reason, count in sorted(Counter(r.termination_reason or "unknown" for r in played).items()):
        out[f"{prefix}/trajectory_termination_reason/{reason}/pct"] = count / len(played)
    calls = [r.agent_tool_calls for r in played if r.agent_tool_calls is not None]
    if calls:
        out[f"{prefix}/trajectory_transfer_to_human_agents/pct"] = sum(
            bool(c["transfer_to_human_agents"]) for c in calls
        ) / len(calls)
        out[f"{prefix}/trajectory_missing_tool_call/pct"] = sum(c["total"] == 0 for c in calls) / len(calls)
        out[f"{prefix}/tool_call_hallucination/count/total"] = sum(c["hallucinated"] for c in calls)
        out[f"{prefix}/tool_call_malformed/count/total"] = sum(c["malformed"] for c in calls)
    return out


def kinds_seen(metrics: Mapping[str, float], scopes: Sequence[str]) -> list[str]:
    """The kinds with a share above 0 in some scope, in :data:`KINDS` order (what a table shows)."""
    return [kind for kind in KINDS if any(metrics.get(f"eval/{s}/{kind_key(kind)}") for s in scopes)]


def kind_label(kind: str) -> str:
    return kind.replace("_", " ")
