"""The prefix splice: a multi-turn prompt starts with exactly the tokens the model saw and produced before.

Re-rendering a conversation and tokenizing the text again need not give back the tokens the model saw and
produced: a template drops ``<think>`` blocks of earlier turns (Qwen3 does, and its generation prompt carries an
empty think block that the history then loses), tool-call JSON is re-serialised with other spacing, a BPE merge
crosses a turn boundary. Training needs each turn's prompt to extend the previous prompt + generation token for
token, so the new prompt is spliced together from the recorded ids and the re-rendered tail.

The recorded ids come either from the last assistant message that carries ``prompt_token_ids`` +
``generation_token_ids`` (the ids our model servers attach), or from NeMo-RL's request field
``required_prefix_token_ids`` (prompt + generation already joined), which wins when both are present.

Where the tail starts is found by counting end-of-turn tokens, which every template emits once per message
whatever it does to the text: if the recorded ids hold ``m`` of them and end with one (the generation closed its
turn), the tail is what the new rendering has after its ``m``-th; if they do not end with one (the generation was
cut off by ``max_tokens``), the tail starts at the rendering's ``m+1``-th, so the template's closing token follows.
This is NeMo-RL's "N-th EOS" rule (its ``replace_prefix_tokens``), stated on the joined ids.

One implementation, two importers: the project (``nemo_tau2.generation.prefix``, for the servers that run in its
environment) and our vLLM server (``nemo_tau2_vllm_server``, in vLLM's own environment, Python 3.11, where this
folder alone is on ``PYTHONPATH``). So this file imports the standard library only.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
"""Per-turn token data a model server attaches to an assistant message (NeMo-Gym ``vllm_model``'s names)."""
REQUIRED_PREFIX_FIELD = "required_prefix_token_ids"
"""NeMo-RL's request field: the ids the prompt must start with (prompt + generation of the last turn)."""


class SpliceError(ValueError):
    """Recorded ids that cannot be honoured; ``field`` names the request field at fault (an HTTP 400)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def token_id_list(value: Any, field: str, vocab_size: int | None = None) -> list[int]:
    """``value`` if it is a list of token ids of this model (``0 <= id < vocab_size``), else :class:`SpliceError`.

    Checked with C-level passes (types, min, max): a 32k-token prompt is read on every turn of a long episode."""
    if not isinstance(value, list):
        raise SpliceError(f"{field} must be a list of integer token ids, got {type(value).__name__}", field)
    if not value:
        return value
    if set(map(type, value)) != {int}:
        position, token = next((i, t) for i, t in enumerate(value) if type(t) is not int)
        raise SpliceError(
            f"{field} must be a list of integer token ids; item {position} is {str(token)[:40]!r}", field
        )
    low, high = min(value), max(value)
    if low < 0 or (vocab_size is not None and high >= vocab_size):
        position, token = next(
            (i, t) for i, t in enumerate(value) if t < 0 or (vocab_size is not None and t >= vocab_size)
        )
        bound = f"below the vocabulary size {vocab_size}" if vocab_size is not None else "non-negative"
        raise SpliceError(
            f"{field}[{position}] is {token}, not a token id of this model (ids are {bound}): the ids were "
            "recorded with another tokenizer",
            field,
        )
    return value


def recorded_prefix(
    messages: Sequence[Mapping[str, Any]],
    required_prefix: Any = None,
    vocab_size: int | None = None,
) -> list[int] | None:
    """The ids the new prompt must start with, or None when the request carries none.

    Args:
        messages: the chat messages as sent (dicts; extra keys such as ``prompt_token_ids`` kept).
        required_prefix: the request's ``required_prefix_token_ids`` (None when absent).
        vocab_size: ids at or above it are refused; None skips that check.

    Raises:
        SpliceError: A field holds something other than token ids of this model, or a message carries
            ``prompt_token_ids`` without ``generation_token_ids``.
    """
    if required_prefix is not None:
        return token_id_list(required_prefix, REQUIRED_PREFIX_FIELD, vocab_size)
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if not isinstance(message, Mapping) or message.get("role") != "assistant":
            continue
        if message.get("prompt_token_ids") is None:
            continue
        where = f"messages[{index}]"
        prompt = token_id_list(message["prompt_token_ids"], f"{where}.prompt_token_ids", vocab_size)
        if message.get("generation_token_ids") is None:
            raise SpliceError(
                f"{where}.generation_token_ids is missing: send it beside {where}.prompt_token_ids (that turn's ids)",
                f"{where}.generation_token_ids",
            )
        generation = token_id_list(message["generation_token_ids"], f"{where}.generation_token_ids", vocab_size)
        return prompt + generation
    return None


def splice_token_ids(
    prefix: Sequence[int],
    rendered: Sequence[int],
    end_of_turn_ids: Collection[int],
    prefix_field: str = "messages",
) -> list[int]:
    """``prefix`` followed by the part of ``rendered`` (the full new prompt) that comes after the recorded turns.

    ``prefix_field`` names where the recorded ids came from, for the error.

    Raises:
        SpliceError: The new rendering closes fewer turns than the recorded ids imply (messages before the
            recorded turn were changed or dropped), so no tail can be found.
    """
    if not prefix:
        return list(rendered)
    closed = sum(prefix.count(token) for token in end_of_turn_ids)
    turn_closed = prefix[-1] in end_of_turn_ids
    wanted = closed if turn_closed else closed + 1  # the end-of-turn token that closes the recorded turn
    positions = sorted(_positions(rendered, end_of_turn_ids))
    if len(positions) >= wanted:
        position = positions[wanted - 1]
        tail = rendered[position + 1 :] if turn_closed else rendered[position:]
        return [*prefix, *tail]
    raise SpliceError(
        f"cannot splice the recorded token ids into the new prompt: they close {closed} turns"
        f"{'' if turn_closed else ' and leave one open'}, but the re-rendered conversation closes only "
        f"{len(positions)}; send the messages that produced them unchanged",
        prefix_field,
    )


def _positions(ids: Sequence[int], wanted: Collection[int]) -> list[int]:
    """Every index of any id in ``wanted`` (``list.index`` scans in C: a turn has hundreds of tokens)."""
    found = []
    for token in wanted:
        start = 0
        while True:
            try:
                start = ids.index(token, start)
            except ValueError:
                break
            found.append(start)
            start += 1
    return found
