"""Multi-turn prefix correction for the servers that run in the project's environment (hf, llama.cpp, fake).

The rule itself lives in ``vllm_extension/nemo_tau2_token_splice.py`` (stdlib only), which our vLLM server imports
too, so every backend splices the same way; this module turns its errors into the surface's HTTP 400.
"""

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from nemo_tau2.generation.errors import BadRequestError
from nemo_tau2.generation.vllm_extension.nemo_tau2_token_splice import (
    REQUIRED_PREFIX_FIELD,
    TOKEN_FIELDS,
    SpliceError,
    recorded_prefix,
    splice_token_ids,
)

__all__ = ["REQUIRED_PREFIX_FIELD", "TOKEN_FIELDS", "find_token_prefix", "splice_prompt"]


def find_token_prefix(
    messages: Sequence[Mapping[str, Any]], required_prefix: Any = None, vocab_size: int | None = None
) -> list[int] | None:
    """The ids the prompt must start with (see ``nemo_tau2_token_splice.recorded_prefix``); 400 on bad ids."""
    try:
        return recorded_prefix(messages, required_prefix, vocab_size)
    except SpliceError as e:
        raise BadRequestError(str(e)) from e


def splice_prompt(
    prefix: Sequence[int], rendered: Sequence[int], end_of_turn_ids: Collection[int], prefix_field: str = "messages"
) -> list[int]:
    """``prefix`` + the re-rendered tail (see ``nemo_tau2_token_splice.splice_token_ids``); 400 if it cannot apply."""
    try:
        return splice_token_ids(prefix, rendered, end_of_turn_ids, prefix_field)
    except SpliceError as e:
        raise BadRequestError(str(e)) from e
