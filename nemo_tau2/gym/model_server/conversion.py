"""Responses API <-> Chat Completions on plain dicts, with vLLM's token ids: NeMo-Gym ``vllm_model``'s mapping.

The mapping is the one ``nemo_gym.responses_converter`` and ``vllm_model`` apply (``test_conversion_parity.py``
checks it request by request against them), without their pydantic round trips: in a training episode every policy
request carries the previous turn's prompt token ids, and validating and re-dumping those lists (then the
``/tokenize`` answer, then the response) was most of the model server's CPU time.

Input items become chat messages in order: assistant text, reasoning summaries (in ``<think>`` tags) and function
calls accumulate into one assistant message, flushed by the next user/system/developer message or tool output;
once an item carries ``prompt_token_ids``, the assistant message it closes carries that item's token ids (on NeMo-Gym
0.4.0 every later assistant message does too, as its vllm_model sends them), which NeMo-RL's vLLM server and our
splice use to keep the prompt's token ids identical to what was generated. Where the two releases map differently,
:data:`~nemo_tau2.gym.nemo_gym_compat.CHAT_MAPPING` says how.
"""

import uuid
from typing import Any

from nemo_gym.openai_utils import (
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
)

from nemo_tau2.gym.nemo_gym_compat import CHAT_MAPPING, FUNCTION_TOOL_NULLS, OUTPUT_ITEM_NULLS

TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
RESPONSES_KEYS = frozenset(NeMoGymResponseCreateParamsNonStreaming.model_fields)
# Responses parameters with no Chat Completions counterpart are dropped, as vllm_model drops them.
CHAT_KEYS = frozenset(NeMoGymChatCompletionCreateParamsNonStreaming.model_fields)
RESPONSE_FIELDS = tuple(NeMoGymResponse.model_fields)
# Fields of the Responses object that echo the request.
_ECHOED = (
    "background",
    "instructions",
    "max_output_tokens",
    "max_tool_calls",
    "metadata",
    "previous_response_id",
    "prompt",
    "reasoning",
    "service_tier",
    "temperature",
    "text",
    "top_logprobs",
    "top_p",
    "truncation",
    "user",
)
_AUDIO_KEYS = ("audio_data", "audio_path", "audio_paths")
_NO_CHAT_PARAMETER = (
    *("background", "context_management", "conversation", "include", "max_tool_calls", "previous_response_id"),
    *("prompt", "truncation"),
)
"""Responses parameters a chat request cannot express: refused when set where vllm_model refuses them (0.7.0)."""
_NO_CHAT_COUNTERPART = {"message": "phase", "function_call": "namespace"}
"""Item fields (NeMo-Gym 0.7.0) a chat message cannot carry: replayed as null, refused when set (as vllm_model)."""


class BadRequest(ValueError):
    """The request cannot be converted; the message names the offending field."""


# ------------------------------------------------------------------ Responses request -> chat messages
def chat_messages(items: list[dict], with_token_ids: bool) -> list[dict]:
    """The chat messages for Responses input ``items``."""
    messages: list[dict] = []
    pending_text, pending_calls, pending_turn = "", [], False
    token_fields: dict[str, Any] | None = None

    def flush_assistant() -> None:
        nonlocal pending_text, pending_calls, pending_turn, token_fields
        if not (pending_text or pending_calls or (pending_turn and CHAT_MAPPING.empty_assistant_turns_sent)):
            if not CHAT_MAPPING.token_ids_on_later_assistant_messages:
                token_fields = None
            return
        message = {"content": pending_text or None, "role": "assistant"}
        if pending_calls or CHAT_MAPPING.empty_tool_calls_sent:
            message["tool_calls"] = pending_calls
        messages.append(message | (token_fields or {}))
        pending_text, pending_calls, pending_turn = "", [], False
        if not CHAT_MAPPING.token_ids_on_later_assistant_messages:
            token_fields = None

    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadRequest(f"input[{index}] must be an object, got {type(item).__name__}")
        kind = item.get("type") or ("message" if item.get("role") else None)
        if CHAT_MAPPING.refuses_what_chat_cannot_express and item.get(_NO_CHAT_COUNTERPART.get(kind, "")) is not None:
            field = _NO_CHAT_COUNTERPART[kind]
            raise BadRequest(f"input[{index}].{field} {item[field]!r} has no Chat Completions counterpart (send null)")
        if kind == "message":
            role, content = item.get("role"), item.get("content")
            if role == "assistant":
                pending_text += _assistant_text(content, index)
                pending_turn = True
            elif role in ("user", "system", "developer"):
                flush_assistant()
                messages.append({"content": _input_content(content, index), "role": role})
            else:
                raise BadRequest(f"input[{index}].role {role!r} is not user, system, developer or assistant")
        elif kind == "reasoning":
            pending_text += think_tags([part["text"] for part in item.get("summary") or []])
            pending_turn = True
        elif kind == "function_call":
            _require(item, index, "call_id", "name", "arguments")
            function = {"arguments": item["arguments"], "name": item["name"]}
            pending_calls.append({"id": item["call_id"], "function": function, "type": "function"})
            pending_turn = True
        elif kind == "function_call_output":
            _require(item, index, "call_id", "output")
            flush_assistant()
            messages.append({"content": item["output"], "role": "tool", "tool_call_id": item["call_id"]})
        else:
            raise BadRequest(
                f"input[{index}].type {kind!r} is not supported (message, reasoning, function_call, "
                "function_call_output)"
            )
        if with_token_ids and item.get("prompt_token_ids"):
            _require(item, index, *TOKEN_FIELDS)
            token_fields = {key: item[key] for key in TOKEN_FIELDS}
            if item.get("routed_experts") is not None:
                token_fields["routed_experts"] = item["routed_experts"]
    flush_assistant()
    return messages


def think_tags(texts: list[str]) -> str:
    return "".join(f"<think>{text}</think>" for text in texts if text)


def _require(item: dict, index: int, *keys: str) -> None:
    missing = [key for key in keys if key not in item]
    if missing:
        raise BadRequest(f"input[{index}] ({item.get('type')}) lacks {', '.join(missing)}")


def _assistant_text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    raise BadRequest(f"input[{index}].content must be a string or a list of parts, got {type(content).__name__}")


def _input_content(content: Any, index: int) -> Any:
    if not isinstance(content, list):
        return content
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_text":
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image":
            url = {"url": part.get("image_url", ""), "detail": part.get("detail", "auto")}
            parts.append({"type": "image_url", "image_url": url})
        else:
            raise BadRequest(f"input[{index}].content: part type {kind!r} is not supported (input_text, input_image)")
    return parts


def chat_tools(tools: list[dict]) -> list[dict]:
    """Responses function tools as Chat Completions tools."""
    converted = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or "name" not in tool:
            raise BadRequest(f"tools[{index}] must be a function tool with a name")
        function = {key: value for key, value in tool.items() if key not in ("type", "strict")}
        converted.append({"type": "function", "function": function})
    return converted


def chat_request(body: dict, with_token_ids: bool) -> dict:
    """The Chat Completions request for a Responses request (before the server's own settings are applied)."""
    unknown = sorted(set(body) - RESPONSES_KEYS)
    if unknown:
        raise BadRequest(f"unknown Responses API parameter(s) {unknown}")
    refuse_streaming(body)
    items = body.get("input", [])
    if isinstance(items, str):
        items = [{"content": [{"text": items, "type": "input_text"}], "role": "user", "type": "message"}]
    elif not isinstance(items, list):
        raise BadRequest(f"input must be a string or a list of items, got {type(items).__name__}")
    unrepresentable = sorted(key for key in _NO_CHAT_PARAMETER if body.get(key) is not None)
    if unrepresentable and CHAT_MAPPING.refuses_what_chat_cannot_express:
        raise BadRequest(f"Responses parameter(s) {unrepresentable} have no Chat Completions counterpart")
    request = {key: value for key, value in body.items() if key in CHAT_KEYS and key not in ("tools", "model")}
    request["messages"] = chat_messages(items, with_token_ids)
    if CHAT_MAPPING.instructions_as_system_message:
        request["messages"] = _with_instructions(request["messages"], body.get("instructions"))
    if body.get("max_output_tokens") is not None:
        request["max_tokens"] = body["max_output_tokens"]
    if body.get("tools"):
        request["tools"] = chat_tools(body["tools"])
    elif CHAT_MAPPING.tool_settings_only_with_tools:
        request.pop("parallel_tool_calls", None)
        if request.get("tool_choice") not in (None, "auto", "none"):
            raise BadRequest(f"tool_choice {request['tool_choice']!r} needs at least one tool")
        request.pop("tool_choice", None)
    return request


def _with_instructions(messages: list[dict], instructions: str | None) -> list[dict]:
    """``instructions`` open the context as the Responses API places them: one system message, with the leading
    system/developer messages folded in after them (chat templates often take one system message, first)."""
    if not instructions:
        return messages
    leading = [instructions]
    while messages and messages[0]["role"] in ("system", "developer"):
        content = messages.pop(0)["content"]
        leading.append(content if isinstance(content, str) else "".join(part.get("text", "") for part in content))
    return [{"content": "\n\n".join(leading), "role": "system"}, *messages]


def refuse_streaming(body: dict) -> None:
    if body.get("stream"):
        raise BadRequest("stream: true is not supported (answers are whole, not streamed)")


def audio_keys(metadata: dict | None) -> list[str]:
    return [key for key in _AUDIO_KEYS if (metadata or {}).get(key)]


# ------------------------------------------------------------------ chat completion -> Responses output
def output_items(message: dict, token_fields: dict | None) -> list[dict]:
    """The Responses output items of an assistant chat message; ``token_fields`` go on the last item."""
    content = message.get("content") or ""
    calls = message.get("tool_calls") or []
    items = []
    if content or not calls:
        text = {"annotations": [], "text": content, "type": "output_text", "logprobs": None}
        items.append(
            {
                "id": f"msg_{uuid.uuid4().hex}",
                "content": [text],
                "role": message.get("role"),
                "status": "completed",
                "type": "message",
            }
            | OUTPUT_ITEM_NULLS["message"]
        )
    for call in calls:
        function = call["function"]
        items.append(
            {
                "arguments": function["arguments"],
                "call_id": call["id"],
                "name": function["name"],
                "type": "function_call",
                "id": call["id"],
                "status": "completed",
            }
            | OUTPUT_ITEM_NULLS["function_call"]
        )
    if token_fields is not None:
        items[-1] = token_fields | {"routed_experts": message.get("routed_experts")} | items[-1]
    return items


def responses_usage(usage: dict | None) -> dict | None:
    if not usage:
        return None
    prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def response_object(
    body: dict, model: str, output: list[dict], finish_reason: str | None, usage: dict | None, created_at: float
) -> dict:
    """The Responses object vllm_model answers with (every field of NeMo-Gym's ``NeMoGymResponse``)."""
    incomplete = {"length": "max_output_tokens", "content_filter": "content_filter"}.get(finish_reason or "")
    response = dict.fromkeys(RESPONSE_FIELDS)
    response.update({key: body.get(key) for key in _ECHOED})
    response.update(
        id=f"resp_{uuid.uuid4().hex}",
        created_at=created_at,
        model=model,
        object="response",
        output=output,
        parallel_tool_calls=body.get("parallel_tool_calls", True),
        tool_choice=body.get("tool_choice") or "auto",
        tools=[FUNCTION_TOOL_NULLS | tool if isinstance(tool, dict) else tool for tool in body.get("tools") or []],
        incomplete_details={"reason": incomplete} if incomplete else None,
        usage=responses_usage(usage),
    )
    return response
