"""Trajectories to cut pivots from, read from the three places they are kept.

- **Our rollouts** (``rollouts.jsonl`` of ``run_eval.py``, GRPO's): each played line's ``tau2_messages``, with its
  release, retrieval variant and reward as recorded.
- **tau2's results files** (``tau2 run``'s ``results.json``, both releases; v1.0.1's directory layout too, a
  ``results.json`` beside ``simulations/``): each simulation's ``messages``; the domain is the file's
  (``info.environment_info.domain_name``), the release and variant are the caller's (tau2 does not record them).
- **SFT conversations** (``{"messages", "tools"?, "domain", "task_id"}``, OpenAI chat format, what
  ``prepare_sft_data.py --conversations`` reads): the chat messages read back as tau2's (calls' arguments decoded,
  each answer tied to its call by ``tool_call_id``). A conversation carries no simulated user's device calls, so a
  telecom one whose state needs them is refused when its pivot is verified, with the call that differs.

What cannot be read is counted by reason, never a crash: a torn line, an episode not played to its end, a
trajectory not kept, a conversation without its task.
"""

import json
from collections import Counter
from pathlib import Path
from typing import Any

from nemo_tau2.pivots.candidates import StoredTrajectory

TORN = "torn line (not a JSON object)"
NOT_PLAYED = "not played to its end (status not ok)"
NO_TRAJECTORY = "no trajectory (tau2_messages not stored: run with eval.keep_transcripts)"
NO_TASK = "no domain and task_id (a conversation must name its task)"
NOT_CHAT = "not a chat conversation (messages with roles)"
BAD_ARGUMENTS = "a tool call whose arguments are not a JSON object"


def _variant(domain: str, retrieval_variant: str | None) -> str | None:
    """The retrieval variant applies to banking_knowledge alone (other domains' rows carry none)."""
    return retrieval_variant if domain == "banking_knowledge" else None


class SourceError(ValueError):
    """A file that is not of the kind named (the message says what it is and what was expected)."""


def _lines(path: Path) -> list[tuple[int, Any]]:
    records = []
    with path.open(encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            if line.strip():
                try:
                    records.append((number, json.loads(line)))
                except json.JSONDecodeError:
                    records.append((number, None))
    return records


def from_rollouts(path: Path) -> tuple[list[StoredTrajectory], Counter]:
    """Played episodes of a ``rollouts.jsonl`` (or its results folder)."""
    path = path / "rollouts.jsonl" if path.is_dir() else path
    found, skipped = [], Counter()
    for number, record in _lines(path):
        if not isinstance(record, dict):
            skipped[TORN] += 1
        elif record.get("status") != "ok":
            skipped[NOT_PLAYED] += 1
        elif not record.get("tau2_messages"):
            skipped[NO_TRAJECTORY] += 1
        else:
            found.append(StoredTrajectory(
                domain=str(record["domain"]), task_id=str(record["task_id"]), tau2_messages=record["tau2_messages"],
                source=f"{path.name}:{number}", tau2_version=record.get("tau2_version") or "v0.2.1",
                retrieval_variant=record.get("retrieval_variant"), reward=record.get("reward"),
            ))  # fmt: skip
    return found, skipped


def _tau2_message(message: dict[str, Any]) -> dict[str, Any]:
    """A tau2 message dump as the trajectory shape the server replays (role, content, calls, answer fields)."""
    kept = {"role": message.get("role"), "content": message.get("content")}
    if message.get("tool_calls"):
        kept["tool_calls"] = [{key: call.get(key) for key in ("id", "name", "arguments", "requestor")}
                              for call in message["tool_calls"]]  # fmt: skip
    if message.get("role") == "tool":
        kept |= {key: message.get(key) for key in ("id", "requestor", "error")}
    return kept


def from_tau2_results(
    path: Path, version: str, retrieval_variant: str | None
) -> tuple[list[StoredTrajectory], Counter]:
    """Every simulation of a tau2 results file (or a v1.0.1 results folder)."""
    meta = path / "results.json" if path.is_dir() else path
    try:
        results = json.loads(meta.read_text(encoding="utf-8"))
        domain = results["info"]["environment_info"]["domain_name"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise SourceError(
            f"{path}: not a tau2 results file (info.environment_info.domain_name, simulations): {e}"
        ) from None
    simulations = results.get("simulations") or []
    if not simulations and (meta.parent / "simulations").is_dir():
        simulations = [json.loads(file.read_text(encoding="utf-8"))
                       for file in sorted((meta.parent / "simulations").glob("*.json"))]  # fmt: skip
    found, skipped = [], Counter()
    for index, simulation in enumerate(simulations):
        if not simulation.get("messages"):
            skipped[NO_TRAJECTORY] += 1
            continue
        reward = (simulation.get("reward_info") or {}).get("reward")
        found.append(StoredTrajectory(
            domain=domain, task_id=str(simulation["task_id"]),
            tau2_messages=[_tau2_message(message) for message in simulation["messages"]],
            source=f"{meta.name}:{simulation.get('id') or index}", tau2_version=version,
            retrieval_variant=_variant(domain, retrieval_variant), reward=reward,
        ))  # fmt: skip
    return found, skipped


def tau2_messages_of_chat(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI chat messages as tau2's (system messages dropped: the task's row holds the prompt)."""
    converted = []
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            calls = []
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                arguments = function.get("arguments")
                decoded = json.loads(arguments) if isinstance(arguments, str) and arguments.strip() else {}
                calls.append({"id": call.get("id") or "", "name": function.get("name"), "arguments": decoded,
                              "requestor": "assistant"})  # fmt: skip
            converted.append({"role": "assistant", "content": message.get("content") or None}
                             | ({"tool_calls": calls} if calls else {}))  # fmt: skip
        elif role == "tool":
            content = message.get("content")
            converted.append({"role": "tool", "id": message.get("tool_call_id") or "", "requestor": "assistant",
                              "content": content, "error": str(content or "").startswith("Error:")})  # fmt: skip
        elif role == "user":
            converted.append({"role": "user", "content": message.get("content")})
    return converted


def _chat_as_tau2(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    try:
        converted = tau2_messages_of_chat(messages)
    except (json.JSONDecodeError, TypeError, AttributeError):
        return None
    calls = [call for message in converted for call in message.get("tool_calls") or []]
    return converted if all(isinstance(call["arguments"], dict) for call in calls) else None


def from_conversations(path: Path, version: str, retrieval_variant: str | None) -> tuple[list, Counter]:
    """SFT conversations of a JSONL file (each must name its ``domain`` and ``task_id``)."""
    found, skipped = [], Counter()
    for number, record in _lines(path):
        if not isinstance(record, dict):
            skipped[TORN] += 1
        elif not record.get("domain") or record.get("task_id") is None:
            skipped[NO_TASK] += 1
        elif not isinstance(record.get("messages"), list) or not all(
            isinstance(message, dict) and "role" in message for message in record["messages"]
        ):
            skipped[NOT_CHAT] += 1
        elif (messages := _chat_as_tau2(record["messages"])) is None:
            skipped[BAD_ARGUMENTS] += 1
        else:
            found.append(StoredTrajectory(
                domain=str(record["domain"]), task_id=str(record["task_id"]),
                tau2_messages=messages, source=f"{path.name}:{number}",
                tau2_version=record.get("tau2_version") or version,
                retrieval_variant=_variant(str(record["domain"]), retrieval_variant),
                reward=record.get("reward"),
            ))  # fmt: skip
    return found, skipped
