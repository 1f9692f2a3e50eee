"""One model turn read from a Responses API answer: its output items, its text and its tool calls.

Shared by the agent server (policy and user-model answers) and ``Tau2Env`` (the caller's action, converted to
output items), so a turn means the same thing whoever plays it: structured ``function_call`` items first, else
(``lenient``) calls the model wrote as text, each malformed call kept as a call that gets a tool error.
"""

import uuid
from dataclasses import dataclass

from nemo_tau2.gym.agent.tool_calls import ParsedCall, calls_from_text, parse_arguments
from nemo_tau2.json_arguments import json_arguments

TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
TOKEN_METADATA_FIELDS = (*TOKEN_FIELDS, "routed_experts")
"""What NeMo-Gym treats as one unit (0.7.0 refuses an item with ``routed_experts`` but not the three token fields,
even ``routed_experts: null``): kept together, stripped together."""
GENERATION_FIELDS = (*TOKEN_METADATA_FIELDS, "weight_version")
"""What a policy turn's last output item says about its generation: the token fields and which weights sampled them."""


@dataclass
class Turn:
    """What one model call said: its output items, text and calls."""

    items: list[dict]
    text: str
    calls: list[tuple[str, ParsedCall]]  # (call_id, call)
    truncated: bool = False


def item_text(item: dict) -> str:
    """The text of a message item (string content or content parts)."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text") or "" for part in content or [] if isinstance(part, dict))


def message_item(role: str, text: str) -> dict:
    return {"type": "message", "role": role, "content": text}


def without_token_ids(item: dict) -> dict:
    return {key: value for key, value in item.items() if key not in TOKEN_METADATA_FIELDS}


def with_last_token_ids_only(items: list[dict]) -> list[dict]:
    """History for the next model call: only the last policy turn keeps its token ids. The prefix correction
    (NeMo-RL's vLLM server, our hf server) needs only that turn's prompt + generation ids, and sending every turn's
    ids would make each request grow with the square of the episode length."""
    last = max((i for i, item in enumerate(items) if "prompt_token_ids" in item), default=-1)
    return [
        item if i == last or "prompt_token_ids" not in item else without_token_ids(item)
        for i, item in enumerate(items)
    ]


def read_turn(body: dict, lenient: bool) -> Turn:
    """The turn in a Responses object; ``lenient`` also reads tool calls written as text."""
    items = [dict(item) for item in body.get("output") or []]
    truncated = (body.get("incomplete_details") or {}).get("reason") == "max_output_tokens"
    calls = [
        (item.get("call_id") or f"call_{uuid.uuid4().hex[:12]}", parse_arguments(item["name"], item["arguments"]))
        for item in items
        if item.get("type") == "function_call"
    ]
    text = "".join(item_text(item) for item in items if item.get("type") == "message")
    if calls or not lenient or not text.strip():
        return Turn(items, text, calls, truncated)
    parsed, leftover = calls_from_text(text)
    if not parsed:
        return Turn(items, text, [], truncated)
    return _text_calls_as_items(items, parsed, leftover, truncated)


def _text_calls_as_items(items: list[dict], parsed: list[ParsedCall], leftover: str, truncated: bool) -> Turn:
    """Calls the policy wrote as text become function_call items, so history shows them as calls; the turn's
    token ids move to the new last item (they describe the whole generation either way)."""
    token_fields = {key: items[-1][key] for key in GENERATION_FIELDS if key in items[-1]} if items else {}
    kept = [item for item in items if item.get("type") not in ("message",)]
    if leftover:
        kept.append(
            {
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "id": f"msg_{uuid.uuid4().hex[:12]}",
                "content": [{"type": "output_text", "text": leftover, "annotations": []}],
            }
        )
    calls = []
    for call in parsed:
        call_id = f"call_{uuid.uuid4().hex[:12]}"
        kept.append(
            {
                "type": "function_call",
                "call_id": call_id,
                "name": call.name or "unknown",
                "arguments": json_arguments(call.raw_arguments),  # rendered again in the next turn's prompt
                "status": "completed",
                "id": f"fc_{call_id}",
            }
        )
        calls.append((call_id, call))
    for item in kept:
        for key in GENERATION_FIELDS:
            item.pop(key, None)
    kept[-1].update(token_fields)
    return Turn(kept, leftover, calls, truncated)
