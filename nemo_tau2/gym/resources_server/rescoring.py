"""``/verify`` without a live session: a stored episode re-scored from its own trajectory (``tau2_messages``).

tau2's evaluator scores a trajectory by rebuilding the task's start state and replaying the trajectory's tool calls
(what ``tau2 evaluate-trajs`` does); every rollout of ours keeps that trajectory, so a stored episode can be scored
again with no session: after a judge outage, or to check a run. The release is the server's: v0.2.1 replays the calls
in process, in a fresh episode of the task (the same code as a live episode, so the verdict is the live one), and
scores it with the same rule; v1.0.1 sends the trajectory to the release's scoring worker, which replays it with
v1.0.1's own evaluator and asks its NL judge, exactly as a live ``/verify`` does.

A stored episode that cannot be re-scored is refused with its reason (:class:`TrajectoryError`, a 400): a trajectory
that is not tau2's message list, a call without its answer, or a replay whose answer differs from the one recorded
(the trajectory was played against another state: another release's data, or an edited line).
"""

import asyncio
from typing import Any

from fastapi import HTTPException
from pydantic import BaseModel, ValidationError

from nemo_tau2.gym.agent.tool_calls import MALFORMED_CALL_ANSWER, REFUSED_CALL_ANSWER
from nemo_tau2.gym.resources_server.in_process import call_tool, score_texts
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.episode import Episode
from nemo_tau2.tau2_env.reward import NLAssertionsNotEvaluatedError
from nemo_tau2.tau2_release.client import Tau2JudgeError, Tau2WorkerError

_ROLES = frozenset({"assistant", "user", "tool"})


class TrajectoryError(ValueError):
    """The stored trajectory cannot be replayed (the message says why and where)."""


def answered_unrun(answer: dict[str, Any]) -> bool:
    """Whether the agent answered this call itself, never sending it to the environment (a call it could not read,
    or one the resources server refused): a replay leaves it unrun too."""
    content = answer.get("content")
    return (
        bool(answer.get("error"))
        and isinstance(content, str)
        and content.startswith((MALFORMED_CALL_ANSWER, REFUSED_CALL_ANSWER))
    )


def calls_and_answers(messages: Any) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each tool call of the trajectory with its answer, in the order they ran (a message's calls are answered by
    the tool messages that follow it, in order). Raises :class:`TrajectoryError` for anything else."""
    if not isinstance(messages, list) or not messages:
        raise TrajectoryError("tau2_messages must be a non-empty list of tau2 messages")
    pairs, pending = [], []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise TrajectoryError(f"tau2_messages[{index}] is not a tau2 message (role assistant, user or tool)")
        if message["role"] == "tool":
            if not pending:
                raise TrajectoryError(f"tau2_messages[{index}] answers no tool call")
            pairs.append((pending.pop(0), message))
            continue
        if pending:
            raise TrajectoryError(f"tau2_messages[{index}]: {len(pending)} tool call(s) before it have no answer")
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list) or not all(_is_call(call) for call in calls):
            raise TrajectoryError(f"tau2_messages[{index}] has a tool call without a name and an arguments object")
        pending = list(calls)
    if pending:
        raise TrajectoryError(f"the trajectory ends with {len(pending)} tool call(s) without an answer")
    return pairs


def _is_call(call: Any) -> bool:
    return isinstance(call, dict) and isinstance(call.get("name"), str) and isinstance(call.get("arguments"), dict)


def assistant_texts(messages: list[dict[str, Any]]) -> list[str]:
    """The agent's texts (what tau2's COMMUNICATE check reads), the greeting included."""
    texts = []
    for message in messages:
        content = message.get("content")
        if message.get("role") == "assistant" and isinstance(content, str) and content.strip():
            texts.append(content)
    return texts


def replay(domain: str, task_id: str, messages: Any) -> Episode:
    """A fresh episode of the task with the trajectory's calls run again, each answer checked against the recorded
    one. Raises :class:`TrajectoryError`, and ``domains.UnknownDomainError``/``UnknownTaskError``."""
    return replay_into(Episode.start(domain, task_id), domain, messages)


def replay_into[E](episode: E, domain: str, messages: Any) -> E:
    """``episode`` (fresh, of the trajectory's task: in process or a release's worker) with the trajectory's calls
    run in it, each answer checked against the recorded one; a refusal names the call, its message and the assistant
    turn (0-based, among the trajectory's assistant messages) where the answer differs."""
    pairs = calls_and_answers(messages)
    for number, ((call, answer), (index, turn)) in enumerate(zip(pairs, _call_positions(messages), strict=True), 1):
        if answered_unrun(answer):
            continue
        requestor = "user" if call.get("requestor") == "user" else "assistant"
        result = call_tool(episode, call["name"], call["arguments"], requestor, str(call.get("id") or ""))
        if (result.content or "") != (answer.get("content") or ""):
            raise TrajectoryError(
                f"call {number} ({call['name']}, tau2_messages[{index}], assistant turn {turn}) answers "
                f"{_short(result.content)} on replay where the trajectory recorded {_short(answer.get('content'))}: "
                f"it was not played on this release's {domain} data"
            )
    return episode


def _call_positions(messages: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """For each tool call, in order: the index of its message and the assistant turn it was made at."""
    positions, turn = [], -1
    for index, message in enumerate(messages):
        turn += message["role"] == "assistant"
        positions.extend((index, max(turn, 0)) for _ in message.get("tool_calls") or [])
    return positions


def _short(text: Any, limit: int = 120) -> str:
    text = str(text or "")
    return repr(text if len(text) <= limit else text[:limit] + "...")


def rescore_in_process(domain: str, task_id: str, messages: Any, termination_reason: str | None) -> dict[str, Any]:
    """v0.2.1's verdict for a stored trajectory (what the live ``/verify`` answered for it)."""
    episode = replay(domain, task_id, messages)
    return score_texts(episode, assistant_texts(messages), termination_reason)


def worker_counts(messages: Any) -> dict[str, int]:
    """``num_tool_calls`` and ``num_tool_errors`` as a live episode counts them (the calls the environment ran)."""
    ran = [answer for _, answer in calls_and_answers(messages) if not answered_unrun(answer)]
    return {"num_tool_calls": len(ran), "num_tool_errors": sum(bool(answer.get("error")) for answer in ran)}


async def rescore(release: Any, domain: str, task_id: str, messages: Any, termination_reason: str | None) -> dict:
    """The server's verdict for a stored episode: v0.2.1 in process (``release`` None), a later release on its
    scoring thread (``release``: the server's :class:`~.release.WorkerRelease`). Raises the HTTP error: 404 (no
    such domain or task), 400 (a trajectory the release cannot replay, its reason), 502 (the judge or the worker
    failed: infrastructure, never a score)."""
    try:
        if release is None:
            return rescore_in_process(domain, task_id, messages, termination_reason)
        scoring = release.rescore, domain, task_id, messages, termination_reason, worker_counts(messages)
        return await asyncio.get_running_loop().run_in_executor(release.scoring, *scoring)
    except (domains.UnknownDomainError, domains.UnknownTaskError) as e:
        raise HTTPException(status_code=404, detail=str(e)) from e
    except (Tau2JudgeError, Tau2WorkerError) as e:
        version = release.version if release is not None else "v0.2.1"
        raise HTTPException(status_code=502, detail=f"tau2 {version}: {e}") from e
    except (NLAssertionsNotEvaluatedError, ValueError) as e:  # TrajectoryError and the release's refusals
        raise HTTPException(status_code=400, detail=f"this stored episode cannot be re-scored: {e}") from e


def stored_row[Row: BaseModel](
    model: type[Row],
    fields: dict[str, Any] | None,
    what: str = "a /verify without a live session re-scores a stored episode: its body",
) -> Row:
    """The stored episode's row (its domain and task_id, and what says which release and variant it was played on),
    read from a ``/verify`` body; a 400 naming what is missing."""
    try:
        return model.model_validate(fields or {})
    except ValidationError as e:
        where, why = e.errors()[0]["loc"], e.errors()[0]["msg"]
        raise HTTPException(
            status_code=400,
            detail=f"{what} needs the row's domain and task_id ({'.'.join(map(str, where))}: {why})",
        ) from e
