"""What a model backend must provide for :mod:`nemo_tau2.generation.openai_app` to serve the vLLM surface.

The app owns everything the surface specifies (request checks, the prefix-correction splice, Hermes tool-call
parsing, response shape); an engine only renders prompts to token ids and generates from token ids. That keeps
one implementation of the surface for the transformers engine and for the llama.cpp adapter.
"""

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol


@dataclass
class TokenLogprob:
    """One token with its log-probability under the raw model distribution (no temperature / top_p applied)."""

    token_id: int
    text: str
    logprob: float


@dataclass
class GeneratedToken(TokenLogprob):
    """A sampled token, with the ``top`` most likely alternatives when they were asked for."""

    top: list[TokenLogprob] = field(default_factory=list)


@dataclass
class GenerationRequest:
    """Sampling for one completion; ``prompt_ids`` are exactly the ids the model must condition on."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    top_logprobs: int
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none", "required"] = "auto"


@dataclass
class GenerationResult:
    """Generated tokens (stop token included, as vLLM does), their text without special tokens, and why it ended;
    ``weight_version``: the label of the weights that generated every one of them (an engine never switches
    weights within a completion), 0 for an engine whose weights never change."""

    tokens: list[GeneratedToken]
    text: str
    finish_reason: Literal["stop", "length"]
    weight_version: int = 0


class Engine(Protocol):
    """A model that renders chats to token ids and generates from token ids (see module docstring)."""

    model_name: str
    max_model_len: int
    end_of_turn_ids: frozenset[int]
    """Token ids that end a turn (the template's end-of-message token and the model's EOS tokens)."""
    supports_forced_tool_choice: bool
    """Whether ``tool_choice`` ``required`` / a named function is enforced (constrained decoding)."""

    async def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        chat_template_kwargs: dict[str, Any],
        add_generation_prompt: bool,
    ) -> list[int]:
        """Token ids of the chat template's rendering of ``messages`` (special tokens parsed, none added)."""
        ...

    async def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        """Token ids of plain text."""
        ...

    async def detokenize(self, token_ids: list[int]) -> str:
        """Text of token ids, special tokens included."""
        ...

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Sample one completion of ``request.prompt_ids``."""
        ...

    async def aclose(self) -> None:
        """Release what the engine holds (called when the app shuts down)."""
        ...
