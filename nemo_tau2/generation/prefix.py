"""Multi-turn prefix correction: the next prompt starts with exactly the tokens of the previous turn.

Re-rendering a conversation and tokenizing the text again need not give back the tokens the model saw and
produced (tool-call JSON re-serialised with other spacing, ``<think>`` stripped from history, a different merge at
a boundary). Training needs each turn's prompt to extend the previous prompt + generation token for token, so
(as NeMo-RL's vLLM server does) an assistant message may carry ``prompt_token_ids`` and ``generation_token_ids``,
and the prompt is spliced together from those ids and the re-rendered tail.

Where the tail starts is found by counting end-of-turn tokens, which every template emits once per message
whatever it does to their text: if the earlier prompt holds ``k`` of them, the assistant message it produced ends
at the ``k+1``-th end-of-turn token of the new rendering. A generation that ended with an end-of-turn token
continues right after that token; one cut off by ``max_tokens`` gets the template's closing token appended.
"""

from dataclasses import dataclass
from typing import Any

from nemo_tau2.generation.errors import BadRequestError

TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


@dataclass
class TokenPrefix:
    """Token ids recorded on an earlier assistant message: the prompt it answered and what was generated."""

    prompt_token_ids: list[int]
    generation_token_ids: list[int]


def _int_list(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise BadRequestError(f"{where} must be a list of integer token ids, got {str(value)[:80]!r}")
    return value


def find_token_prefix(messages: list[dict[str, Any]]) -> TokenPrefix | None:
    """The ids carried by the last assistant message that has ``prompt_token_ids``, if any message does."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") == "assistant" and message.get("prompt_token_ids") is not None:
            where = f"messages[{index}]"
            prompt = _int_list(message["prompt_token_ids"], f"{where}.prompt_token_ids")
            generation = _int_list(message.get("generation_token_ids"), f"{where}.generation_token_ids")
            return TokenPrefix(prompt_token_ids=prompt, generation_token_ids=generation)
    return None


def splice_prompt(prefix: TokenPrefix, rendered: list[int], end_of_turn_ids: frozenset[int]) -> list[int]:
    """``prefix`` ids followed by the part of ``rendered`` (the full new prompt) that comes after that turn.

    Raises:
        BadRequestError: When the new rendering has fewer turns than the recorded prefix implies (the messages
            before the carrying assistant message were changed or dropped).
    """
    turns_before = sum(1 for token in prefix.prompt_token_ids if token in end_of_turn_ids)
    seen = 0
    close_at = -1
    for position, token in enumerate(rendered):
        if token in end_of_turn_ids:
            seen += 1
            if seen == turns_before + 1:
                close_at = position
                break
    if close_at < 0:
        raise BadRequestError(
            "prompt_token_ids: cannot splice the recorded tokens into the new prompt: the recorded prompt has "
            f"{turns_before} end-of-turn tokens but the re-rendered conversation closes only {seen} turns"
        )
    generation = prefix.generation_token_ids
    ended_turn = bool(generation) and generation[-1] in end_of_turn_ids
    tail = rendered[close_at + 1 :] if ended_turn else rendered[close_at:]
    return prefix.prompt_token_ids + generation + tail
