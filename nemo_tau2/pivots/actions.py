"""One assistant turn as an action: NeMo-Gym's pivot row contract (``expected_action``), on both sides of a verdict.

NeMo-Gym 0.7.0's pivot verifier (``single_step_tool_use_with_argument_comparison``) reads rows whose
``expected_action`` is a ``function_call`` (``name``, ``arguments`` as a JSON string), a ``function_call_batch``
(``calls``: several of those) or a ``message`` (``content``). The same field names here, so a pivot file of ours is
a pivot file of theirs. A model's answer becomes an action by the same rule as theirs: its tool calls win over its
text, several calls are a batch, and no call and no text is no action.
"""

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class FunctionCallAction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function_call"] = "function_call"
    name: str
    arguments: str = Field(description="The call's arguments as a JSON string (NeMo-Gym's contract).")


class FunctionCallBatchAction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function_call_batch"] = "function_call_batch"
    calls: list[FunctionCallAction] = Field(min_length=1)


class MessageAction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["message"] = "message"
    content: str


Action = Annotated[FunctionCallAction | FunctionCallBatchAction | MessageAction, Field(discriminator="type")]


def calls_of(action: Action | None) -> list[FunctionCallAction]:
    """The action's tool calls, in order (none for a message or no action)."""
    if isinstance(action, FunctionCallBatchAction):
        return list(action.calls)
    return [action] if isinstance(action, FunctionCallAction) else []


def decoded_arguments(call: FunctionCallAction) -> dict[str, Any] | None:
    """The call's arguments object, or None when they are not a JSON object (a malformed call)."""
    try:
        arguments = json.loads(call.arguments)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return arguments if isinstance(arguments, dict) else None


def _action(calls: list[FunctionCallAction], text: str | None) -> Action | None:
    if len(calls) == 1:
        return calls[0]
    if calls:
        return FunctionCallBatchAction(calls=calls)
    return MessageAction(content=text) if text is not None else None


def action_of_tau2_message(message: dict[str, Any]) -> Action | None:
    """A tau2 assistant message (``content``, ``tool_calls`` with ``arguments`` objects) as its action."""
    calls = [
        FunctionCallAction(name=call["name"], arguments=json.dumps(call.get("arguments") or {}, ensure_ascii=False))
        for call in message.get("tool_calls") or []
    ]
    content = message.get("content")
    return _action(calls, content if isinstance(content, str) else None)


def _output_text(item: dict[str, Any]) -> str | None:
    content = item.get("content")
    if isinstance(content, str):
        return content
    for part in content or []:
        if isinstance(part, dict) and part.get("type") == "output_text" and isinstance(part.get("text"), str):
            return part["text"]
    return None


def action_of_output(output: list[Any]) -> Action | None:
    """A Responses answer's ``output`` items as the action (its first assistant text; reasoning is not an action)."""
    calls, text = [], None
    for item in output:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call":
            arguments = item.get("arguments")
            calls.append(FunctionCallAction(name=str(item.get("name")), arguments=str(arguments or "")))
        elif item.get("type", "message") == "message" and item.get("role") == "assistant" and text is None:
            text = _output_text(item)
    return _action(calls, text)
