"""llama.cpp's native server as an :class:`~nemo_tau2.generation.engine.Engine` (the adapter's back end).

llama.cpp does not speak the vLLM surface (no ``return_tokens_as_token_ids``, its ``/tokenize`` takes text), so
the adapter renders prompts itself (``/apply-template`` then ``/tokenize`` with special tokens parsed) and
generates with the native ``/completion`` route from those *token ids*: the ids we report as the prompt are the
ones llama.cpp conditioned on, and the generated ids are its own ``tokens`` with their
``completion_probabilities`` (raw model distribution; ``post_sampling_probs`` off).

Sampling is set to plain temperature / top_p: llama.cpp's default top_k 40 and min_p 0.05 are switched off.
Tool calls can be constrained with an llguidance grammar built from the tools' JSON schemas: ``tool_choice``
``required`` (or a named function) forces one schema-valid ``<tool_call>`` block; ``auto`` applies the grammar
lazily once the model writes ``<tool_call>``. Constrained tokens are sampled from the masked distribution while
the reported logprobs stay those of the raw model, as for vLLM's structured outputs.
"""

import json
import logging
import urllib.request
from typing import Any

import aiohttp

from nemo_tau2.generation.engine import GeneratedToken, GenerationRequest, GenerationResult, TokenLogprob
from nemo_tau2.generation.errors import BadRequestError, EngineError

logger = logging.getLogger(__name__)

_WORD_TRIGGER = 1  # llama.cpp common_grammar_trigger_type: WORD
_END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "</s>")


def _inline_local_refs(schema: Any, definitions: dict[str, Any], depth: int = 0) -> Any:
    """``schema`` with every ``{"$ref": "#/$defs/X"}`` replaced by ``X`` from ``definitions`` (and ``$defs`` dropped).

    A tool's parameters carry their own ``$defs`` (pydantic's nested models: tau2's ``FlightInfo``...). Nested under
    the grammar's ``anyOf``, ``#/$defs/...`` would point at the grammar's root, where llguidance finds nothing and
    drops the constraint ("Pointer '/$defs/FlightInfo' does not exist").
    """
    if depth > 32:
        raise ValueError("tool schema: $ref nesting deeper than 32 (a recursive model?)")
    if isinstance(schema, list):
        return [_inline_local_refs(item, definitions, depth) for item in schema]
    if not isinstance(schema, dict):
        return schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        name = ref.removeprefix("#/$defs/")
        if name not in definitions:
            raise ValueError(f"tool schema: $ref {ref!r} has no definition")
        siblings = {key: value for key, value in schema.items() if key != "$ref"}
        return _inline_local_refs(definitions[name], definitions, depth + 1) | siblings
    return {key: _inline_local_refs(value, definitions, depth) for key, value in schema.items() if key != "$defs"}


def tool_call_grammar(tools: list[dict[str, Any]]) -> str:
    """An llguidance grammar for one ``<tool_call>`` block whose JSON matches one of ``tools`` (then end of turn)."""
    variants = []
    for tool in tools:
        function = tool.get("function") or {}
        parameters = function.get("parameters") or {"type": "object"}
        variants.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": function.get("name")},
                    "arguments": _inline_local_refs(parameters, parameters.get("$defs") or {}),
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    schema = json.dumps({"anyOf": variants})
    return f'%llguidance {{}}\nstart: "<tool_call>\\n" body "\\n</tool_call>"\nbody: %json {schema}\n'


def _post_sync(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


class LlamaCppEngine:
    """Talks to a llama.cpp server at ``upstream`` (e.g. ``http://127.0.0.1:PORT``)."""

    def __init__(
        self,
        upstream: str,
        *,
        model_name: str,
        max_model_len: int,
        end_of_turn_ids: frozenset[int],
        constrain_tool_calls: bool = True,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.end_of_turn_ids = end_of_turn_ids
        self.constrain_tool_calls = constrain_tool_calls
        self.supports_forced_tool_choice = constrain_tool_calls
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_server(
        cls, upstream: str, *, model_name: str, max_model_len: int, constrain_tool_calls: bool = True
    ) -> "LlamaCppEngine":
        """Read the end-of-turn token ids from a running llama.cpp server (its EOS plus common end markers)."""
        upstream = upstream.rstrip("/")
        with urllib.request.urlopen(f"{upstream}/props", timeout=30) as response:
            props = json.loads(response.read())
        ids: set[int] = set()
        for marker in {props.get("eos_token") or "", *_END_MARKERS} - {""}:
            tokens = _post_sync(
                f"{upstream}/tokenize", {"content": marker, "add_special": False, "parse_special": True}
            )
            if len(tokens["tokens"]) == 1:
                ids.add(tokens["tokens"][0])
        if not ids:
            raise ValueError(f"cannot find an end-of-turn token of the llama.cpp model at {upstream}")
        return cls(
            upstream,
            model_name=model_name,
            max_model_len=max_model_len,
            end_of_turn_ids=frozenset(ids),
            constrain_tool_calls=constrain_tool_calls,
        )

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        try:
            async with self._session.post(f"{self.upstream}{path}", json=body) as response:
                payload = await response.json(content_type=None)
                status = response.status
        except aiohttp.ClientError as e:
            raise EngineError(f"cannot reach llama.cpp at {self.upstream}{path}: {e!r}") from e
        if status >= 500:
            raise EngineError(f"llama.cpp {path} failed with HTTP {status}: {payload}")
        if status >= 400:
            message = (payload.get("error") or {}).get("message") if isinstance(payload, dict) else payload
            raise BadRequestError(f"llama.cpp rejected the request: {message}")
        return payload

    async def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        chat_template_kwargs: dict[str, Any],
        add_generation_prompt: bool,
    ) -> list[int]:
        body: dict[str, Any] = {"messages": messages, "add_generation_prompt": add_generation_prompt}
        if tools:
            body["tools"] = tools
        if chat_template_kwargs:
            body["chat_template_kwargs"] = chat_template_kwargs
        prompt = (await self._post("/apply-template", body))["prompt"]
        return await self.tokenize(prompt, add_special_tokens=False)

    async def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        body = {"content": text, "add_special": add_special_tokens, "parse_special": True}
        return (await self._post("/tokenize", body))["tokens"]

    async def detokenize(self, token_ids: list[int]) -> str:
        return (await self._post("/detokenize", {"tokens": token_ids}))["content"]

    def _completion_body(self, request: GenerationRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": request.prompt_ids,
            "n_predict": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "top_k": 0,
            "min_p": 0.0,
            "repeat_penalty": 1.0,
            "n_probs": max(request.top_logprobs, 1),
            "post_sampling_probs": False,
            "return_tokens": True,
            "cache_prompt": True,
        }
        if request.seed is not None:
            body["seed"] = request.seed
        if self.constrain_tool_calls and request.tools and request.tool_choice != "none":
            body["grammar"] = tool_call_grammar(request.tools)
            if request.tool_choice == "auto":
                body["grammar_lazy"] = True
                body["grammar_triggers"] = [{"type": _WORD_TRIGGER, "value": "<tool_call>"}]
        return body

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        out = await self._post("/completion", self._completion_body(request))
        probabilities = out.get("completion_probabilities") or []
        if [p["id"] for p in probabilities] != out.get("tokens"):
            raise EngineError("llama.cpp returned token ids that do not match its per-token probabilities")
        tokens = [
            GeneratedToken(
                token_id=p["id"],
                text=p["token"],
                logprob=p["logprob"],
                top=[TokenLogprob(t["id"], t["token"], t["logprob"]) for t in p.get("top_logprobs", [])],
            )
            for p in probabilities
        ]
        finish_reason = "stop" if out.get("stop_type") == "eos" else "length"
        return GenerationResult(tokens=tokens, text=out.get("content", ""), finish_reason=finish_reason)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
