"""The fake server's tokenizer and chat template: byte-level, deterministic and prefix-consistent by design.

Vocabulary: ids 0-255 are the UTF-8 bytes; :data:`SPECIAL_TOKENS` adds one id per role marker, ``<|tools|>`` and
``<|end|>``, and :data:`ALT_SPACE_ID`, a second token for ``" "`` that only token-inconsistent scripts emit.

Template: the tools (if any, as sorted compact JSON) then every message, each rendered as
``<|role|> + bytes(text) + <|end|>``; ``add_generation_prompt`` appends ``<|assistant|>``. An assistant message's text
is its content followed by one ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` block per call, with the
arguments string copied verbatim (:func:`assistant_text`). A generation is ``bytes(text) + <|end|>``, so the
rendering of turn *t* in the history is exactly ``<|assistant|>`` + the ids generated at turn *t*, and the prompt of
turn *t + 1* starts with prompt(*t*) + generation(*t*).

Prefix correction (NeMo-RL's vLLM server, see ``vllm_surface.md``): when the last assistant message that carries
``prompt_token_ids`` and ``generation_token_ids`` is found, the prompt is those ids followed by the rendering of the
messages after it, instead of a re-rendering of the whole history.

Speed: a prompt is kept as rendered pieces (:class:`PromptTokens`), one per message, and the JSON text of long
pieces is cached, so the system prompt and tool schemas that every request repeats are serialised once, not once
per request (a 20 KB prompt is ~20k ids).
"""

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

SPECIAL_TOKENS = {
    "<|system|>": 256,
    "<|developer|>": 257,
    "<|user|>": 258,
    "<|assistant|>": 259,
    "<|tool|>": 260,
    "<|tools|>": 261,
    "<|end|>": 262,
}
#: Decodes to ``" "`` but the template never produces it: a token-inconsistent script's generations use it for
#: every space, so re-rendering its turns in the history gives different ids (as a BPE merge can in real models).
ALT_SPACE_ID = 263
VOCAB_SIZE = 264
END_ID = SPECIAL_TOKENS["<|end|>"]
ASSISTANT_ID = SPECIAL_TOKENS["<|assistant|>"]
TOOLS_ID = SPECIAL_TOKENS["<|tools|>"]
_ROLE_IDS = {role: SPECIAL_TOKENS[f"<|{role}|>"] for role in ("system", "developer", "user", "assistant", "tool")}
_ID_TO_SPECIAL = {token_id: text for text, token_id in SPECIAL_TOKENS.items()} | {ALT_SPACE_ID: " "}
_SPACE = ord(" ")


class TemplateError(ValueError):
    """Messages or tools the template cannot render (the server answers HTTP 400 with this message)."""


def encode(text: str) -> list[int]:
    """Plain text to ids: one id per UTF-8 byte, no special tokens (``/tokenize`` with ``prompt``)."""
    return list(text.encode())


def decode(token_ids: Iterable[int]) -> str:
    """Ids back to text; role markers and ``<|end|>`` are dropped, partial UTF-8 sequences replaced."""
    data = bytearray()
    for token_id in token_ids:
        if token_id < 256:
            data.append(token_id)
        elif token_id == ALT_SPACE_ID:
            data.append(_SPACE)
    return data.decode(errors="replace")


def token_text(token_id: int) -> str:
    """One token's text as a logprobs entry shows it: the ASCII character, ``<0xHH>`` for other bytes, or the
    special token's name."""
    if token_id < 128:
        return chr(token_id)
    if token_id < 256:
        return f"<0x{token_id:02X}>"
    return _ID_TO_SPECIAL[token_id]


def token_bytes(token_id: int) -> list[int]:
    if token_id < 256:
        return [token_id]
    return list(_ID_TO_SPECIAL[token_id].encode())


def token_logprob(token_id: int, position: int) -> float:
    """The deterministic log-probability of generating ``token_id`` at ``position`` of a generation, in [-0.97,
    -0.01]: ``-(1 + (31 * token_id + 17 * position) % 97) / 100``."""
    return -(1 + (31 * token_id + 17 * position) % 97) / 100


def tool_call_block(name: str, arguments: str) -> str:
    """One Hermes-style tool call as the model writes it; ``arguments`` (a JSON string) is copied verbatim."""
    return f'<tool_call>{{"name": {orjson.dumps(name).decode()}, "arguments": {arguments}}}</tool_call>'


def assistant_text(content: str | None, tool_calls: Sequence[tuple[str, str]] = ()) -> str:
    """The full text of an assistant turn: content, a newline if both are present, then the tool call blocks."""
    blocks = "".join(tool_call_block(name, arguments) for name, arguments in tool_calls)
    if content and blocks:
        return f"{content}\n{blocks}"
    return (content or "") + blocks


def generation_ids(text: str, token_consistent: bool = True) -> list[int]:
    """The ids a turn generates: its text's bytes then ``<|end|>`` (spaces as :data:`ALT_SPACE_ID` if
    ``token_consistent`` is false)."""
    ids = encode(text)
    if not token_consistent:
        ids = [ALT_SPACE_ID if token_id == _SPACE else token_id for token_id in ids]
    ids.append(END_ID)
    return ids


def content_text(message: dict[str, Any], index: int = 0) -> str:
    """A message's content as one string: a string as is, text parts joined, null as ""."""
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise TemplateError(f"messages[{index}].content has a part of type {kind!r}; only text parts render")
            texts.append(part["text"])
        return "".join(texts)
    raise TemplateError(f"messages[{index}].content must be a string, a list of text parts or null")


def _tool_call_pairs(message: dict[str, Any], index: int) -> list[tuple[str, str]]:
    pairs = []
    for call_index, call in enumerate(message.get("tool_calls") or ()):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if not isinstance(name, str) or not isinstance(arguments, str):
            raise TemplateError(
                f"messages[{index}].tool_calls[{call_index}] needs function.name and function.arguments as strings "
                f"(arguments is the JSON text the model generated), got {call!r}"
            )
        pairs.append((name, arguments))
    return pairs


def message_text(message: dict[str, Any], index: int = 0) -> str:
    """The text a message renders to between its role marker and ``<|end|>``."""
    if message.get("role") == "assistant":
        return assistant_text(content_text(message, index), _tool_call_pairs(message, index))
    return content_text(message, index)


@dataclass(frozen=True)
class _Piece:
    """A run of prompt ids with their JSON text (no brackets): ``marker + bytes(data) + <|end|>`` for a rendered
    message, or ``ids`` given by the client (the splice)."""

    json: bytes
    count: int
    marker_id: int = 0
    data: bytes = b""
    ids: Sequence[int] | None = None

    def extend(self, out: list[int]) -> None:
        if self.ids is not None:
            out.extend(self.ids)
        else:
            out.append(self.marker_id)
            out.extend(self.data)
            out.append(END_ID)


_CACHED_PIECE_MIN_BYTES = 256  # shorter texts are cheaper to serialise than to look up


def _marked_piece(marker_id: int, data: bytes) -> _Piece:
    """One rendered message or tool block; long ones (system prompts, tool schemas) come from a cache."""
    if len(data) >= _CACHED_PIECE_MIN_BYTES:
        return _cached_marked_piece(marker_id, data)
    return _Piece(orjson.dumps([marker_id, *data, END_ID])[1:-1], len(data) + 2, marker_id, data)


@functools.lru_cache(maxsize=1024)
def _cached_marked_piece(marker_id: int, data: bytes) -> _Piece:
    return _Piece(orjson.dumps([marker_id, *data, END_ID])[1:-1], len(data) + 2, marker_id, data)


_GENERATION_PROMPT = _Piece(str(ASSISTANT_ID).encode(), 1, ids=(ASSISTANT_ID,))


class PromptTokens:
    """A prompt's ids as rendered pieces: ``len()`` and :meth:`json` without building one big list."""

    def __init__(self, pieces: list[_Piece]) -> None:
        self._pieces = pieces

    def __len__(self) -> int:
        return sum(piece.count for piece in self._pieces)

    def ids(self) -> list[int]:
        ids: list[int] = []
        for piece in self._pieces:
            piece.extend(ids)
        return ids

    def json(self) -> bytes:
        """The ids as a JSON array."""
        return b"[" + b",".join(piece.json for piece in self._pieces if piece.count) + b"]"


def _message_piece(message: dict[str, Any], index: int) -> _Piece:
    role = message.get("role") if isinstance(message, dict) else None
    if role not in _ROLE_IDS:
        raise TemplateError(f"messages[{index}].role is {role!r}; expected one of {', '.join(_ROLE_IDS)}")
    return _marked_piece(_ROLE_IDS[role], message_text(message, index).encode())


def _carried_ids_piece(message: dict[str, Any], field: str, index: int) -> _Piece:
    value = message[field]
    json_text = orjson.dumps(value) if isinstance(value, list) else b""
    # Checked on the JSON text (in C) rather than per element: prompts carry tens of thousands of ids.
    if not json_text or json_text.translate(None, b"0123456789,[]"):
        raise TemplateError(f"messages[{index}].{field} must be a list of non-negative integer token ids")
    return _Piece(json_text[1:-1], len(value), ids=value)


def _last_token_carrier(messages: Sequence[dict[str, Any]]) -> int | None:
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") == "assistant" and "prompt_token_ids" in message and "generation_token_ids" in message:
            return index
    return None


def render_prompt(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    prefix_correction: bool = True,
) -> PromptTokens:
    """The prompt for a chat request, with the prefix-correction splice (see the module docstring) unless
    ``prefix_correction`` is off.

    Raises:
        TemplateError: a message the template cannot render, named by its index.
    """
    carrier = _last_token_carrier(messages) if prefix_correction else None
    pieces: list[_Piece] = []
    if carrier is None:
        if tools:
            pieces.append(_marked_piece(TOOLS_ID, orjson.dumps(list(tools), option=orjson.OPT_SORT_KEYS)))
        start = 0
    else:
        message = messages[carrier]
        pieces.append(_carried_ids_piece(message, "prompt_token_ids", carrier))
        pieces.append(_carried_ids_piece(message, "generation_token_ids", carrier))
        start = carrier + 1
    pieces.extend(_message_piece(messages[index], index) for index in range(start, len(messages)))
    if add_generation_prompt:
        pieces.append(_GENERATION_PROMPT)
    return PromptTokens(pieces)


def prompt_ids(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """:func:`render_prompt` as a plain list of ids."""
    return render_prompt(messages, tools, add_generation_prompt).ids()
