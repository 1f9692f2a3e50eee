"""Request and response bodies of the vLLM surface (see the module docstring of ``openai_app``).

Requests are read leniently (unknown fields ignored, as vLLM does) but every field that would silently change
sampling is checked: a value we cannot honour is an HTTP 400 naming the field, never a quiet default.
"""

import json
import math
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from nemo_tau2.generation.engine import GeneratedToken, GenerationResult, TokenLogprob
from nemo_tau2.generation.errors import BadRequestError
from nemo_tau2.generation.prefix import TOKEN_FIELDS
from nemo_tau2.generation.tool_calls import ParsedOutput

LOGPROB_FLOOR = -9999.0
"""-inf is not JSON; NeMo-RL floors logprobs at the same value (VLLM_LOGPROB_FLOOR)."""
MAX_TOP_LOGPROBS = 20
_ROLES = ("system", "user", "assistant", "tool")
_TEXT_PART_TYPES = ("text", "input_text", "output_text")
_NEUTRAL = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "min_p": 0.0}


class ChatCompletionRequest(BaseModel):
    """POST /v1/chat/completions; fields not listed here (``user``, ``metadata``, ...) are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    seed: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    return_tokens_as_token_ids: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    stream: bool | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None
    logit_bias: dict[str, float] | None = None
    required_prefix_token_ids: Any = None
    """NeMo-RL's field: the ids the prompt must start with (checked, and spliced, by ``prefix.py``)."""

    def check_supported(self) -> None:
        """Reject what this surface cannot honour, naming the field (HTTP 400)."""
        if self.stream:
            raise BadRequestError("stream: streaming is not supported by this endpoint; send stream=false")
        if self.n not in (None, 1):
            raise BadRequestError(f"n: exactly one choice is generated per request, got n={self.n}")
        if self.top_k not in (None, -1):
            raise BadRequestError(
                f"top_k: OpenAI-compatible requests take no top_k; send null or -1, got {self.top_k}"
            )
        if self.stop:
            raise BadRequestError(
                f"stop: stop strings are not supported (generation ends at end of turn), got {self.stop!r}"
            )
        if self.stop_token_ids:
            raise BadRequestError(
                f"stop_token_ids: not supported (generation ends at end of turn), got {self.stop_token_ids}"
            )
        for name, neutral in _NEUTRAL.items():
            value = getattr(self, name)
            if value is not None and value != neutral:
                raise BadRequestError(f"{name}: only the neutral value {neutral} is supported, got {value}")
        if self.logit_bias:
            raise BadRequestError("logit_bias: not supported")
        if self.temperature is not None and self.temperature < 0:
            raise BadRequestError(f"temperature: must be >= 0, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise BadRequestError(f"top_p: must be in (0, 1], got {self.top_p}")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise BadRequestError(f"top_logprobs: must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}")
        for name in ("max_tokens", "max_completion_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise BadRequestError(f"{name}: must be >= 1, got {value}")
        if not self.messages:
            raise BadRequestError("messages: at least one message is required")

    def tool_choice_mode(self) -> tuple[Literal["auto", "none", "required"], list[dict[str, Any]] | None]:
        """``tool_choice`` as a mode plus the tools it allows (a named function narrows them to one)."""
        choice = self.tool_choice if self.tool_choice is not None else "auto"
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            chosen = [t for t in self.tools or [] if (t.get("function") or {}).get("name") == name]
            if not chosen:
                raise BadRequestError(f"tool_choice: names function {name!r}, which is not in tools")
            return "required", chosen
        if choice not in ("auto", "none", "required"):
            raise BadRequestError(f"tool_choice: must be auto, none, required or a named function, got {choice!r}")
        if choice == "required" and not self.tools:
            raise BadRequestError("tool_choice: 'required' needs tools")
        return choice, self.tools


class TokenizeRequest(BaseModel):
    """POST /tokenize: either ``messages`` (rendered with the chat template) or a plain ``prompt``."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[dict[str, Any]] | None = Field(default=None, min_length=1)
    prompt: str | None = None
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = None
    required_prefix_token_ids: Any = None


class DetokenizeRequest(BaseModel):
    """POST /detokenize (vLLM has it too): token ids back to text."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    tokens: list[int]


def _content_text(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in _TEXT_PART_TYPES:
                raise BadRequestError(f"{where}.content: only text parts are supported, got {str(part)[:80]!r}")
            texts.append(part.get("text") or "")
        return "".join(texts)
    raise BadRequestError(f"{where}.content: must be a string, a list of text parts or null")


def _template_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    call = json.loads(json.dumps(call))
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            function["arguments"] = parsed  # templates render objects (as vLLM passes them)
    return call


def normalize_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: text content, tool-call arguments as objects, token fields dropped."""
    normalized = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        role = message.get("role")
        if role == "developer":
            role = "system"
        if role not in _ROLES:
            raise BadRequestError(f"{where}.role: must be one of {', '.join(_ROLES)}, got {role!r}")
        out = {k: v for k, v in message.items() if k not in TOKEN_FIELDS and k != "routed_experts"}
        out["role"] = role
        content = _content_text(message.get("content"), where)
        out["content"] = content if content is not None or role == "assistant" else ""
        if message.get("tool_calls"):
            out["tool_calls"] = [_template_tool_call(call) for call in message["tool_calls"]]
        normalized.append(out)
    return normalized


def normalize_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Tools in one key order (type, function: name, description, parameters, rest), whatever order the client
    used: templates render them with ``tojson``, so the same tools always give the same prompt."""
    if not tools:
        return None
    normalized = []
    for index, tool in enumerate(tools):
        function = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(function, dict) or "name" not in function:
            raise BadRequestError(f"tools[{index}]: must be {{type: function, function: {{name, ...}}}}")
        ordered = {key: function[key] for key in ("name", "description", "parameters") if key in function}
        ordered |= {key: value for key, value in function.items() if key not in ordered and key != "strict"}
        normalized.append({"type": "function", "function": ordered})
    return normalized


def _token_label(token: TokenLogprob, as_ids: bool) -> str:
    return f"token_id:{token.token_id}" if as_ids else token.text


def _logprob_entry(token: TokenLogprob, as_ids: bool) -> dict[str, Any]:
    logprob = token.logprob if math.isfinite(token.logprob) else LOGPROB_FLOOR
    return {
        "token": _token_label(token, as_ids),
        "logprob": max(logprob, LOGPROB_FLOOR),
        "bytes": list(token.text.encode("utf-8")),
    }


def logprobs_content(tokens: list[GeneratedToken], top_logprobs: int, as_ids: bool) -> list[dict[str, Any]]:
    """`choices[0].logprobs.content`: one entry per generated token, in order."""
    content = []
    for token in tokens:
        entry = _logprob_entry(token, as_ids)
        entry["top_logprobs"] = [_logprob_entry(alt, as_ids) for alt in token.top[:top_logprobs]]
        content.append(entry)
    return content


def chat_completion_response(
    *,
    model: str,
    prompt_ids: list[int],
    result: GenerationResult,
    parsed: ParsedOutput,
    logprobs: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """The `chat.completion` body: one choice, token ids at the top level and on the choice (vLLM >= 0.10.2), and
    the label of the weights that generated it (``weight_version``, as our vLLM server reports it)."""
    finish_reason = "tool_calls" if parsed.tool_calls else result.finish_reason
    completion_ids = [token.token_id for token in result.tokens]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": parsed.content, "tool_calls": parsed.tool_calls or None},
                "finish_reason": finish_reason,
                "logprobs": {"content": logprobs} if logprobs is not None else None,
                "token_ids": completion_ids,
            }
        ],
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(completion_ids),
            "total_tokens": len(prompt_ids) + len(completion_ids),
        },
        "prompt_token_ids": prompt_ids,
        "weight_version": result.weight_version,
    }


def error_body(message: str, status: int) -> dict[str, Any]:
    """vLLM's error shape."""
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}
