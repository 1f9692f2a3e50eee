"""The fake server's ``/v1/embeddings``: deterministic vectors that still retrieve by meaning, roughly.

Each text is a bag of its lower-cased words hashed into ``DIMENSIONS`` signed buckets (the hashing trick), then
L2-normalised: the same text always gets the same vector on any machine, and texts sharing words get close vectors,
so a dense retriever built on it ranks a document that shares a query's words above one that does not (enough for
tests of the pipeline around it, not a model). Answers in OpenAI's shape (``data[i].embedding``, ``usage``).
"""

import hashlib
import re
from functools import lru_cache
from typing import Any

import numpy as np

DIMENSIONS = 256
_WORD = re.compile(r"[a-z0-9]+")


class EmbeddingRequestError(ValueError):
    """An embeddings request the fake refuses (as OpenAI's API would): answered with HTTP 400."""


@lru_cache(maxsize=1 << 16)
def _bucket(word: str) -> tuple[int, float]:
    digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
    value = int.from_bytes(digest, "little")
    return value % DIMENSIONS, 1.0 if (value >> 32) & 1 else -1.0


def embed_text(text: str) -> list[float]:
    vector = np.zeros(DIMENSIONS)
    for word in _WORD.findall(text.lower()):
        index, sign = _bucket(word)
        vector[index] += sign
    norm = np.linalg.norm(vector)
    return (vector / norm if norm else vector).round(6).tolist()


def embeddings_answer(body: Any) -> dict[str, Any]:
    """OpenAI's ``/v1/embeddings`` answer for ``body`` (``input``: a string or a list of strings; ``model``)."""
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        raise EmbeddingRequestError("an embeddings request is a JSON object with a string 'model'")
    texts = body.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(text, str) for text in texts):
        raise EmbeddingRequestError("'input' must be a non-empty string or list of strings")
    data = [{"object": "embedding", "index": i, "embedding": embed_text(text)} for i, text in enumerate(texts)]
    tokens = sum(len(_WORD.findall(text.lower())) for text in texts)
    return {
        "object": "list",
        "model": body["model"],
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
