"""Pivot candidates: every assistant turn of a stored trajectory as a row of NeMo-Gym's pivot contract.

A trajectory is tau2's message list (what our rollouts keep as ``tau2_messages``, what tau2's results files keep as
each simulation's ``messages``, what an SFT conversation becomes once its chat messages are read back as tau2's).
Each assistant turn after the greeting becomes one row:

- ``responses_create_params``: the task's row (system prompt, greeting, the policy's tools) with the conversation
  before the turn as the policy saw it: user texts, its own texts and calls, its calls' answers (the simulated
  user's own device calls are not the policy's to see);
- ``expected_action``: the turn, as NeMo-Gym's verifier reads it (:mod:`.actions`);
- what rebuilds its state: ``tau2_version``, ``domain``, ``retrieval_variant``, ``task_id`` and ``tau2_messages``,
  the trajectory before the turn (its calls are replayed, and their answers checked, by ``/verify_pivot``);
- ``pivot_id`` (stable: the source's identity and the turn), ``turn`` (0-based among the trajectory's assistant
  messages, the greeting being 0, as ``/fork`` counts), and provenance (``source``, ``source_reward``).

A turn whose calls the agent answered itself (a call it could not parse, one the server refused) demonstrates
nothing that runs, and is skipped with that reason.
"""

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from nemo_tau2.gym.resources_server.rescoring import answered_unrun
from nemo_tau2.pivots.actions import action_of_tau2_message

SKIPPED_UNRUN = "a demonstrated call the agent answered itself (never run)"
SKIPPED_EMPTY = "an empty assistant turn (no text, no call)"


@dataclass
class StoredTrajectory:
    """One trajectory and what says where its state comes from."""

    domain: str
    task_id: str
    tau2_messages: list[dict[str, Any]]
    source: str  # where it was read: file and line or simulation, for provenance and the pivot ids
    tau2_version: str = "v0.2.1"
    retrieval_variant: str | None = None
    reward: float | None = None


def policy_items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """tau2 messages as the policy's Responses input items (the user's own tool calls and answers left out)."""
    items: list[dict[str, Any]] = []
    for message in messages:
        role, requestor = message.get("role"), message.get("requestor", "assistant")
        if role == "tool":
            if requestor == "assistant":
                items.append({"type": "function_call_output", "call_id": message.get("id") or "",
                              "output": message.get("content") or ""})  # fmt: skip
            continue
        if role == "user" and message.get("tool_calls"):
            continue
        if isinstance(message.get("content"), str) and message["content"]:
            items.append({"role": role, "content": message["content"]})
        for call in message.get("tool_calls") or []:
            items.append({"type": "function_call", "call_id": call.get("id") or "", "name": call["name"],
                          "arguments": json.dumps(call.get("arguments") or {}, ensure_ascii=False)})  # fmt: skip
    return items


def _unrun_turns(messages: list[dict[str, Any]]) -> set[int]:
    """Indices of assistant messages one of whose calls the agent answered itself."""
    unrun, pending = set(), []
    for index, message in enumerate(messages):
        if message.get("role") == "tool" and pending:
            owner = pending.pop(0)
            if answered_unrun(message):
                unrun.add(owner)
        elif message.get("role") in ("assistant", "user"):
            pending = [index] * len(message.get("tool_calls") or [])
    return unrun


def _greeting(row: dict[str, Any]) -> str | None:
    items = row["responses_create_params"]["input"]
    texts = [item.get("content") for item in items if item.get("role") == "assistant"]
    return texts[-1] if texts and isinstance(texts[-1], str) else None


def pivot_id(trajectory: StoredTrajectory, turn: int) -> str:
    named = [trajectory.source, trajectory.tau2_version, trajectory.domain, trajectory.task_id, turn]
    return hashlib.sha256(json.dumps(named).encode()).hexdigest()[:16]


def pivot_rows(trajectory: StoredTrajectory, row: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The trajectory's candidates, given its task's Gym row; and the turns skipped, counted by reason."""
    messages, skipped = trajectory.tau2_messages, {}
    params = {key: value for key, value in row["responses_create_params"].items() if key != "input"}
    base_input = list(row["responses_create_params"]["input"])
    starts = [index for index, message in enumerate(messages) if message.get("role") == "assistant"]
    greeting = _greeting(row)
    opens = (
        bool(starts)
        and starts[0] == 0
        and messages[0].get("content") == greeting
        and not messages[0].get("tool_calls")
    )  # the row's input already holds the greeting
    unrun, rows = _unrun_turns(messages), []
    for turn, index in enumerate(starts):
        if turn == 0 and opens:
            continue
        action = action_of_tau2_message(messages[index])
        empty = action is None or (action.type == "message" and not action.content.strip())
        reason = SKIPPED_UNRUN if index in unrun else SKIPPED_EMPTY if empty else None
        if reason is not None:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        prefix = messages[:index]
        rows.append({
            "responses_create_params": params | {"input": base_input + policy_items(prefix[int(opens):]),
                                                 "tool_choice": "auto"},
            "expected_action": action.model_dump(),
            "pivot_id": pivot_id(trajectory, turn),
            "domain": trajectory.domain,
            "task_id": trajectory.task_id,
            "tau2_version": trajectory.tau2_version,
            "retrieval_variant": trajectory.retrieval_variant,
            "turn": turn,
            "tau2_messages": prefix,
            "source": trajectory.source,
            "source_reward": trajectory.reward,
        } | ({"agent_ref": row["agent_ref"]} if row.get("agent_ref") else {}))  # fmt: skip
    return rows, skipped
