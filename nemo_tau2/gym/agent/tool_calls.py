"""Tool calls from a policy turn: structured ``function_call`` items first, else leniently parsed from the text.

Small models often write their calls as text instead of using the server's tool-call parser: Hermes
``<tool_call>{...}</tool_call>`` tags (possibly unclosed when generation stopped), a fenced ```json block, or a
bare JSON object. A call whose JSON or arguments cannot be read is still a call, marked malformed: the agent
answers it with a tool error (counted toward tau2's error limit) instead of sending the text to the user.
"""

import json
import re
from dataclasses import dataclass
from typing import Any

import orjson

# The agent's own answers to a call it never sent to the environment, as they stand in the trajectory: a call it
# could not read, and one the resources server refused unrun. A replay of the trajectory leaves such calls unrun too.
MALFORMED_CALL_ANSWER = "Error: malformed tool call"
REFUSED_CALL_ANSWER = "Error: the tool call was refused"
_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FENCED = re.compile(r"```(?:json|tool_call)?\s*(.*?)\s*```", re.DOTALL)


@dataclass
class ParsedCall:
    """One tool call; ``error`` is set (and ``arguments`` is None) when it is malformed."""

    name: str
    arguments: dict | None
    raw_arguments: str
    error: str | None = None


def parse_arguments(name: str, raw_arguments: str) -> ParsedCall:
    """Arguments of a structured call: a JSON object (or a JSON string holding one)."""
    try:
        arguments = json.loads(raw_arguments) if raw_arguments.strip() else {}
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
    except (json.JSONDecodeError, RecursionError) as e:
        return ParsedCall(name, None, raw_arguments, f"arguments are not valid JSON ({e})")
    if not isinstance(arguments, dict):
        return ParsedCall(
            name, None, raw_arguments, f"arguments must be a JSON object, got {type(arguments).__name__}"
        )
    try:  # what Python's json reads but cannot go on the wire: lone surrogates, integers beyond 64 bits
        orjson.dumps(arguments)
    except orjson.JSONEncodeError as e:
        return ParsedCall(name, None, raw_arguments, f"arguments cannot be sent as JSON ({e})")
    return ParsedCall(name, arguments, raw_arguments)


def _call_from_object(obj: Any, source: str) -> ParsedCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return parse_arguments(obj["name"], raw)


def _calls_from_json(text: str) -> list[ParsedCall] | None:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    objects = value if isinstance(value, list) else [value]
    calls = [_call_from_object(obj, text) for obj in objects]
    return calls if calls and all(calls) else None


def calls_from_text(text: str) -> tuple[list[ParsedCall], str]:
    """Tool calls written in ``text`` and the text left around them; ``([], text)`` when it is a plain message."""
    tagged = _TAGGED.findall(text)
    if tagged:
        calls = []
        for body in tagged:
            parsed = _calls_from_json(body)
            calls.extend(parsed or [ParsedCall("", None, body, f"cannot read a tool call from {body[:200]!r}")])
        return calls, _TAGGED.sub("", text).strip()
    for match in _FENCED.finditer(text):
        parsed = _calls_from_json(match.group(1))
        if parsed:
            return parsed, (text[: match.start()] + text[match.end() :]).strip()
    parsed = _calls_from_json(text.strip())
    if parsed:
        return parsed, ""
    return [], text
