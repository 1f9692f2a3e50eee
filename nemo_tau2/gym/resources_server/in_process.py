"""tau2 v0.2.1's episodes in the server's own process (the project's environment): seed, tool call, verdict.

The resources server (:mod:`.app`) and the env API's local session (:mod:`nemo_tau2.env_api.parties`) run this
same code; a release in its own environment (v1.0.1) goes through :mod:`.release` instead.
"""

from typing import Any

from tau2.data_model.message import ToolMessage

from nemo_tau2.json_arguments import find_lone_surrogate
from nemo_tau2.tau2_env import domains, prompts
from nemo_tau2.tau2_env.episode import Episode, Requestor
from nemo_tau2.tau2_env.reward import evaluate_episode

ASSUMED_TERMINATION = "agent_stop"


def message_text(content: Any) -> str:
    """A Responses message's text (a string, or its parts' texts joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    return ""


def assistant_texts(items: list[Any]) -> list[str]:
    """The text of every assistant message among Responses input/output items (what tau2's COMMUNICATE reads)."""
    texts = []
    for item in items:
        if isinstance(item, dict) and item.get("role") == "assistant" and item.get("type", "message") == "message":
            text = message_text(item.get("content"))
            if text.strip():
                texts.append(text)
    return texts


def start_episode(domain: str, task_id: str) -> tuple[Episode, dict[str, Any]]:
    """A fresh episode of the task and what ``/seed_session`` answers about it (the user's prompt and tools).

    Raises:
        domains.UnknownDomainError, domains.UnknownTaskError: no such domain or task.
    """
    episode = Episode.start(domain, task_id)
    criteria = episode.task.evaluation_criteria
    return episode, {
        "domain": domain,
        "task_id": task_id,
        "user_system_prompt": prompts.user_system_prompt(domain, task_id),
        "user_tools": domains.responses_tool_schemas(domain, side="user"),
        "reward_basis": [basis.value for basis in criteria.reward_basis] if criteria else [],
    }


def score_episode(episode: Episode, items: list[Any], termination_reason: str | None) -> dict[str, Any]:
    """What ``/verify`` answers about a finished episode: tau2's reward, its components and tool counts.

    ``items`` is the whole transcript (Responses input and output items); ``termination_reason`` None is treated
    as agent_stop, and the reward info says so.

    Raises:
        NLAssertionsNotEvaluatedError, ValueError: the task needs an LLM judge, or the termination is unknown.
    """
    return score_texts(episode, assistant_texts(items), termination_reason)


def score_texts(episode: Episode, texts: list[str], termination_reason: str | None) -> dict[str, Any]:
    """:func:`score_episode` given the agent's texts (a stored trajectory's, when re-scored without a session)."""
    termination = termination_reason or ASSUMED_TERMINATION
    result = evaluate_episode(episode, texts, termination)
    reward_info = result.reward_info.model_dump(mode="json")
    if termination_reason is None:
        reward_info["termination_reason_note"] = (
            f"no termination_reason in the verify request; assumed {ASSUMED_TERMINATION}"
        )
    return result.components() | {
        "reward": result.reward,
        "domain": episode.domain,
        "task_id": episode.task.id,
        "success": result.success,
        "termination_reason": termination,
        "num_tool_calls": len(episode.tool_log),
        "num_tool_errors": episode.num_tool_errors,
        "reward_info": reward_info,
    }


def call_tool(
    episode: Episode, tool_name: str, arguments: Any, requestor: Requestor, call_id: str = ""
) -> ToolMessage:
    """Run one tool call the way tau2 answers it: arguments that are not a JSON object, or text that is not valid
    Unicode (a lone UTF-16 surrogate, which Python's ``json`` reads from ``"\\ud800"``), are the model's mistake and
    get a tool error; anything else goes to the episode (tau2's own tool, or tau2's error message)."""
    bad_text = find_lone_surrogate({"tool name": tool_name, "arguments": arguments})
    if bad_text is not None:
        return episode.record_failed_call(
            tool_name.encode(errors="backslashreplace").decode(),
            requestor,
            f"Tool call {bad_text} holds a lone UTF-16 surrogate, which is not valid Unicode text.",
        )
    if not isinstance(arguments, dict):
        return episode.record_failed_call(
            tool_name, requestor, f"Tool arguments must be a JSON object, got {type(arguments).__name__}."
        )
    return episode.call_tool(tool_name, arguments, requestor=requestor, call_id=call_id)
