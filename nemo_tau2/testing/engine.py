"""The fake model itself, without HTTP: validates requests, finds the script and builds vLLM-shaped answers.

Answers follow the "vLLM surface" (``/work/helper_briefs/vllm_surface.md``): one choice, tool calls with ``call_<hex>``
ids and JSON-string arguments, ``finish_reason`` ``stop``/``tool_calls``/``length``, logprobs per generated token
(``token`` = ``"token_id:<id>"`` with ``return_tokens_as_token_ids``), ``prompt_token_ids`` at the top level and
``choices[0].token_ids`` always. ``/tokenize`` returns exactly the prompt ids a completion would use.

Answers are dicts ready for ``orjson.dumps``: prompt id arrays are pre-serialised ``orjson.Fragment`` objects.
"""

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

import orjson

import nemo_tau2.testing.chat_tokens as chat_tokens
from nemo_tau2.testing.config import ControlRequest, FakeServerConfig, seed_task
from nemo_tau2.testing.embeddings import EmbeddingRequestError, embeddings_answer
from nemo_tau2.testing.faults import FaultInjector
from nemo_tau2.testing.scripts import (
    RegisteredScripts,
    Script,
    ScriptError,
    ScriptProvider,
    ScriptRequest,
    Turn,
    TurnTracker,
)
from nemo_tau2.testing.tau2_inferred_keys import Tau2KeyInference
from nemo_tau2.testing.tau2_provider import Tau2ScriptProvider


class RequestError(ValueError):
    """A request the fake (like vLLM) refuses; answered with HTTP 400 and this message."""


@dataclass
class FakeStats:
    """Request counts since start (or the last reset): tests use them to see retries and faults happen."""

    requests_by_route: Counter = field(default_factory=Counter)  # "chat", "tokenize", "models", "control", ...
    requests_by_key: Counter = field(default_factory=Counter)  # chat completions per conversation key
    faults_by_kind: Counter = field(default_factory=Counter)
    responses_by_status: Counter = field(default_factory=Counter)
    texts_embedded_by_model: Counter = field(default_factory=Counter)  # /v1/embeddings inputs answered

    def copy(self) -> "FakeStats":
        return FakeStats(*(Counter(counter) for counter in self._counters()))

    def _counters(self) -> tuple[Counter, ...]:
        return (
            self.requests_by_route,
            self.requests_by_key,
            self.faults_by_kind,
            self.responses_by_status,
            self.texts_embedded_by_model,
        )

    def to_json(self) -> dict[str, dict[str, int]]:
        return {
            "requests_by_route": dict(self.requests_by_route),
            "requests_by_key": dict(self.requests_by_key),
            "faults_by_kind": dict(self.faults_by_kind),
            "responses_by_status": {str(status): n for status, n in self.responses_by_status.items()},
            "texts_embedded_by_model": dict(self.texts_embedded_by_model),
        }

    @classmethod
    def from_json(cls, data: dict[str, dict[str, int]]) -> "FakeStats":
        statuses = Counter({int(status): n for status, n in data["responses_by_status"].items()})
        counters = (Counter(data[name]) for name in ("requests_by_route", "requests_by_key", "faults_by_kind"))
        return cls(*counters, statuses, Counter(data.get("texts_embedded_by_model", {})))


class FakeEngine:
    """Scripts, turn tracking, faults, latency and stats of one fake server; used from its event loop only."""

    def __init__(self, config: FakeServerConfig, providers: Sequence[ScriptProvider] = ()) -> None:
        self.config = config
        self.latency_s = config.latency_ms / 1000
        self.prefix_correction = config.prefix_correction
        self.registered = RegisteredScripts()
        for key, spec in config.scripts.items():
            self.registered.register(key, spec.to_script())
        self.tau2 = Tau2ScriptProvider(config.tau2) if config.tau2 is not None else None
        self.providers: list[ScriptProvider] = [self.registered, *providers]
        if self.tau2 is not None:
            self.providers.append(self.tau2)
            if config.preload_domains:
                self.tau2.preload(config.preload_domains)
        self.default_script = config.default_script.to_script() if config.default_script else None
        self.inferred_keys = (
            Tau2KeyInference(config.inferred_key_domains, _seed_tasks(config.inferred_key_seeds))
            if config.missing_key == "tau2"
            else None
        )
        self.tracker = TurnTracker()
        self.faults = FaultInjector()
        for spec in config.faults:  # a fake started by a config (a run's fake_cfg) fails from its first request
            self.faults.add(spec)
        self.stats = FakeStats()
        self.weight_version = 0

    # ----------------------------------------------------------------------------------------------- control

    def apply(self, control: ControlRequest) -> None:
        if control.clear_faults:
            self.faults.clear()
        for spec in control.faults:
            self.faults.add(spec)
        if control.latency_ms is not None:
            self.latency_s = control.latency_ms / 1000
        if control.prefix_correction is not None:
            self.prefix_correction = control.prefix_correction
        if control.clear_scripts:
            self.registered.clear()
        for key, spec in control.scripts.items():
            self.registered.register(key, spec.to_script())
        if control.tau2 is not None:
            if self.tau2 is None:
                raise RequestError("tau2 scripts are disabled in this server's config (tau2: null)")
            self.tau2.config = control.tau2
        if control.inferred_key_seeds:
            if self.inferred_keys is None:
                raise RequestError("inferred_key_seeds needs missing_key 'tau2' in this server's config")
            self.inferred_keys.seeds |= _seed_tasks(control.inferred_key_seeds)
        if control.reset_stats:
            self.stats = FakeStats()
        if control.reset_conversations:
            self.tracker.clear()
        if control.weight_version is not None:
            self.weight_version = control.weight_version

    # ------------------------------------------------------------------------------------------------- keys

    def key_of(self, body: dict[str, Any]) -> str | None:
        """The conversation key of a chat request (None if it has none)."""
        field_name = self.config.key_field
        if field_name.startswith("metadata."):
            metadata = body.get("metadata")
            value = metadata.get(field_name.removeprefix("metadata.")) if isinstance(metadata, dict) else None
        else:
            value = body.get(field_name)
        if value is None or value == "":
            if self.inferred_keys is not None:
                return self.inferred_keys.key_of(body)
            return None
        if not isinstance(value, str):
            raise RequestError(f"the conversation key field {field_name!r} must be a string, got {value!r}")
        return value

    def script_for(self, key: str | None) -> Script:
        if key is None:
            if self.default_script is None:
                raise RequestError(
                    f"the request has no conversation key in {self.config.key_field!r} and this fake server has no "
                    "default script; set the field (e.g. 'tau2|<domain>|<task_id>|<episode_id>|<role>')"
                )
            return self.default_script
        for provider in self.providers:
            script = provider.script_for(key)
            if script is not None:
                return script
        raise ScriptError(f"no script for conversation key {key!r} (no registered script or provider matches it)")

    # ------------------------------------------------------------------------------------------------ routes

    def complete(self, body: Any) -> dict[str, Any]:
        """A chat completion for ``body``. Raises RequestError, ScriptError or chat_tokens.TemplateError (400)."""
        messages, tools = _validate_chat_request(body)
        key = self.key_of(body)
        script = self.script_for(key)
        turn = script.respond(ScriptRequest(key, messages, tools, self.tracker.turn_index(key, messages)))
        _check_tool_choice(body.get("tool_choice"), turn, key)
        prompt = chat_tokens.render_prompt(messages, tools, prefix_correction=self.prefix_correction)
        prompt_tokens = len(prompt)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        self._check_context(prompt_tokens, max_tokens)
        choice, generated = _generate(turn, script.token_consistent, max_tokens)
        if body.get("logprobs"):
            choice["logprobs"] = {"content": _logprobs(generated, body)}
        when = self.config.token_ids_in_completions
        with_token_ids = when == "always" or (when == "when_requested" and body.get("return_token_ids") is True)
        if with_token_ids:
            choice["token_ids"] = generated
        completion = {
            "id": f"chatcmpl-{uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.config.model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(generated),
                "total_tokens": prompt_tokens + len(generated),
            },
            "weight_version": self.weight_version,  # read when the answer is made: after the latency, as generated
        }
        if with_token_ids:
            completion["prompt_token_ids"] = orjson.Fragment(prompt.json())
        return completion

    def tokenize(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise RequestError("the /tokenize body must be a JSON object")
        if "messages" in body:
            messages, tools = _validate_messages(body)
            add_generation_prompt = body.get("add_generation_prompt", True)
            if not isinstance(add_generation_prompt, bool):
                raise RequestError(f"add_generation_prompt must be a boolean, got {add_generation_prompt!r}")
            prompt = chat_tokens.render_prompt(
                messages, tools, add_generation_prompt, prefix_correction=self.prefix_correction
            )
            count, tokens = len(prompt), orjson.Fragment(prompt.json())
        elif isinstance(body.get("prompt"), str):
            tokens = chat_tokens.encode(body["prompt"])
            count = len(tokens)
        else:
            raise RequestError("a /tokenize body needs 'messages' (a list) or 'prompt' (a string)")
        return {"count": count, "max_model_len": self.config.max_model_len, "tokens": tokens, "token_strs": None}

    def embed(self, body: Any) -> dict[str, Any]:
        """``/v1/embeddings``: deterministic hashed bag-of-words vectors (:mod:`nemo_tau2.testing.embeddings`)."""
        try:
            answer = embeddings_answer(body)
        except EmbeddingRequestError as e:
            raise RequestError(str(e)) from e
        self.stats.texts_embedded_by_model[answer["model"]] += len(answer["data"])
        return answer

    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": self.config.model, "object": "model", "created": 0, "owned_by": "nemo-tau2"}],
        }

    def _check_context(self, prompt_tokens: int, max_tokens: int | None) -> None:
        limit = self.config.max_model_len
        requested = prompt_tokens + (max_tokens or 0)
        if prompt_tokens >= limit or requested > limit:
            raise RequestError(
                f"This model's maximum context length is {limit} tokens. However, you requested {requested} tokens "
                f"({prompt_tokens} in the messages, {max_tokens or 0} in the completion). Please reduce the length "
                "of the messages or completion."
            )


def _seed_tasks(seeds: dict[int, str]) -> dict[int, tuple[str, str]]:
    return {seed: seed_task(seed, task) for seed, task in seeds.items()}  # checked by the config models


def _generate(turn: Turn, token_consistent: bool, max_tokens: int | None) -> tuple[dict[str, Any], list[int]]:
    """The choice (without logprobs) and the generated ids for a scripted turn, cut at ``max_tokens``."""
    calls = [(call.name, call.arguments_json()) for call in turn.tool_calls]
    generated = chat_tokens.generation_ids(chat_tokens.assistant_text(turn.text, calls), token_consistent)
    if max_tokens is not None and len(generated) > max_tokens:
        generated = generated[:max_tokens]  # a cut turn is plain text: its tool calls never closed
        message = {"role": "assistant", "content": chat_tokens.decode(generated), "tool_calls": None}
        finish_reason = "length"
    else:
        tool_calls = [
            {"id": f"call_{uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": args}}
            for name, args in calls
        ]
        message = {"role": "assistant", "content": turn.text or None, "tool_calls": tool_calls or None}
        finish_reason = "tool_calls" if tool_calls else "stop"
    return {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}, generated


def _validate_messages(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise RequestError("'messages' must be a non-empty list of message objects")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise RequestError(f"'tools' must be a list, got {type(tools).__name__}")
    return messages, tools or None


def _validate_chat_request(body: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    if not isinstance(body, dict):
        raise RequestError("the chat completion body must be a JSON object")
    if body.get("stream"):
        raise RequestError("stream=true is not supported: this server answers non-streaming requests only")
    if body.get("top_k") not in (None, -1):
        raise RequestError(f"top_k={body['top_k']!r} is not supported (OpenAI has no top_k; use null or -1)")
    if body.get("stop"):
        raise RequestError(f"stop={body['stop']!r} is not supported: stop strings would cut the scripted turns")
    if body.get("n") not in (None, 1):
        raise RequestError(f"n={body['n']!r} is not supported; one choice per request")
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (type(value) is not int or value < 1):
            raise RequestError(f"{name} must be a positive integer, got {value!r}")
    top_logprobs = body.get("top_logprobs")
    if top_logprobs is not None and (type(top_logprobs) is not int or not 0 <= top_logprobs <= 20):
        raise RequestError(f"top_logprobs must be an integer from 0 to 20, got {top_logprobs!r}")
    return _validate_messages(body)


def _check_tool_choice(tool_choice: Any, turn: Turn, key: str | None) -> None:
    names = [call.name for call in turn.tool_calls]
    if tool_choice in (None, "auto"):
        return
    if tool_choice == "none" and names:
        raise ScriptError(f"the scripted turn for key {key!r} calls {names} but the request has tool_choice='none'")
    if tool_choice == "required" and not names:
        raise ScriptError(f"the scripted turn for key {key!r} calls no tool but tool_choice='required'")
    if isinstance(tool_choice, dict):
        forced = (tool_choice.get("function") or {}).get("name")
        if names != [forced]:
            raise ScriptError(f"the scripted turn for key {key!r} calls {names} but tool_choice forces {forced!r}")
    elif tool_choice not in ("none", "required"):
        raise RequestError(f"tool_choice={tool_choice!r}; expected 'auto', 'none', 'required' or a function")


# Per token id, the "token" strings of both modes and the "bytes" list: logprobs are built once per generated token.
_TOKEN_AS_ID = [f"token_id:{token_id}" for token_id in range(chat_tokens.VOCAB_SIZE)]
_TOKEN_AS_TEXT = [chat_tokens.token_text(token_id) for token_id in range(chat_tokens.VOCAB_SIZE)]
_TOKEN_BYTES = [chat_tokens.token_bytes(token_id) for token_id in range(chat_tokens.VOCAB_SIZE)]


def _logprobs(generated: list[int], body: dict[str, Any]) -> list[dict[str, Any]]:
    tokens = _TOKEN_AS_ID if body.get("return_tokens_as_token_ids") else _TOKEN_AS_TEXT
    top_n = body.get("top_logprobs") or 0
    logprob = chat_tokens.token_logprob
    if not top_n:  # the training path (vllm_model asks for top_logprobs=0): keep it lean
        return [
            {"token": tokens[t], "logprob": logprob(t, p), "bytes": _TOKEN_BYTES[t], "top_logprobs": []}
            for p, t in enumerate(generated)
        ]
    entries = []
    for position, token_id in enumerate(generated):
        value = logprob(token_id, position)
        # The chosen token first, then made-up alternatives, each one nat less likely than the one before.
        ranked = [(token_id, value)] + [
            ((token_id + rank) % chat_tokens.VOCAB_SIZE, value - rank) for rank in range(1, top_n)
        ]
        alternatives = [{"token": tokens[t], "logprob": v, "bytes": _TOKEN_BYTES[t]} for t, v in ranked]
        entries.append({**alternatives[0], "top_logprobs": alternatives})
    return entries
