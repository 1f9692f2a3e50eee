"""Hermes-style tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks in model text.

Parsing follows vLLM's ``hermes`` tool parser in behaviour: every block must hold a JSON object with a string
``name``; if any block is malformed the whole text is returned as content with no tool calls (the model's mistake
stays visible to the agent rather than being half-applied). Text outside the blocks is the message content.
"""

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


@dataclass
class ParsedOutput:
    """Assistant text split into content and OpenAI-shaped tool calls."""

    content: str | None
    tool_calls: list[dict[str, Any]]


def new_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _loads_standard(text: str) -> Any:
    """``json.loads`` held to standard JSON (what llama.cpp and other servers parse again on the next turn).

    Python also reads ``NaN`` / ``Infinity`` and lone UTF-16 surrogates (``"\\ud800"``); llama.cpp's
    ``/apply-template`` refuses a history holding them, which would fail every later turn of the episode.

    Raises:
        ValueError: ``text`` is not standard JSON.
    """
    value = json.loads(text, parse_constant=_reject_constant)
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError("a string holds a lone surrogate") from e
    return value


def _is_standard_json(text: str) -> bool:
    try:
        _loads_standard(text)
    except ValueError:  # json.JSONDecodeError is a ValueError
        return False
    return True


def _parse_block(raw: str) -> dict[str, Any] | None:
    try:
        call = _loads_standard(raw.strip())
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str) and _is_standard_json(arguments):
        arguments_json = arguments  # already encoded, as some models write it
    else:  # anything else is encoded as vLLM's hermes parser does, so that the arguments are always valid JSON
        arguments_json = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": new_tool_call_id(),
        "type": "function",
        "function": {"name": call["name"], "arguments": arguments_json},
    }


def parse_hermes_tool_calls(text: str) -> ParsedOutput:
    """Split ``text`` into content and tool calls (see module docstring); content is None when nothing remains."""
    if "<tool_call>" not in text:
        return ParsedOutput(content=text or None, tool_calls=[])
    calls = []
    for match in _BLOCK.finditer(text):
        call = _parse_block(match.group(1))
        if call is None:
            return ParsedOutput(content=text, tool_calls=[])
        calls.append(call)
    content = _BLOCK.sub("", text).strip()
    return ParsedOutput(content=content or None, tool_calls=calls)
