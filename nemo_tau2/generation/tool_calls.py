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

from nemo_tau2.json_arguments import json_arguments, loads_standard

_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


@dataclass
class ParsedOutput:
    """Assistant text split into content and OpenAI-shaped tool calls."""

    content: str | None
    tool_calls: list[dict[str, Any]]


def new_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _parse_block(raw: str) -> dict[str, Any] | None:
    try:
        call = loads_standard(raw.strip())
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    # a string is kept when it already encodes JSON (as some models write it); anything else is encoded as vLLM's
    # hermes parser does, so that the arguments are always valid JSON
    arguments_json = (
        json_arguments(arguments) if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    )
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
