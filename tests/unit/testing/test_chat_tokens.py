"""The fake's byte tokenizer and chat template: prefix consistency, the splice, and the inconsistency switch."""

import json

import pytest

from nemo_tau2.testing import chat_tokens
from nemo_tau2.testing.chat_tokens import ALT_SPACE_ID, END_ID, SPECIAL_TOKENS, TemplateError, prompt_ids

TOOLS = [{"type": "function", "function": {"name": "get_user", "description": "d", "parameters": {"type": "object"}}}]


def _assistant_message(text: str | None, calls: list[tuple[str, str]]) -> dict:
    tool_calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}
        for i, (name, args) in enumerate(calls)
    ]
    return {"role": "assistant", "content": text, "tool_calls": tool_calls or None}


def test_encode_decode_round_trip_utf8():
    text = "Grüße, 東京 ✓"
    assert chat_tokens.decode(chat_tokens.encode(text)) == text
    assert max(chat_tokens.encode(text)) < 256


def test_prompt_is_tools_then_role_marked_messages_then_generation_prompt():
    ids = prompt_ids([{"role": "user", "content": "hi"}], TOOLS)
    tools_json = json.dumps(TOOLS, sort_keys=True, separators=(",", ":")).encode()
    expected = [SPECIAL_TOKENS["<|tools|>"], *tools_json, END_ID, SPECIAL_TOKENS["<|user|>"], *b"hi", END_ID]
    assert ids == [*expected, SPECIAL_TOKENS["<|assistant|>"]]
    assert prompt_ids([{"role": "user", "content": "hi"}], TOOLS, add_generation_prompt=False) == expected


@pytest.mark.parametrize("text, calls", [("Hello there.", []), (None, [("get_user", '{"id": "u1"}')]),
                                          ("Checking.", [("a", "{}"), ("b", '{"x":  [1, 2]}')])])  # fmt: skip
def test_next_prompt_extends_prompt_plus_generation(text, calls):
    history = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    first = prompt_ids(history, TOOLS)
    generated = chat_tokens.generation_ids(chat_tokens.assistant_text(text, calls))
    history += [_assistant_message(text, calls), {"role": "user", "content": "next"}]
    second = prompt_ids(history, TOOLS)
    assert second[: len(first) + len(generated)] == first + generated


def test_tool_call_arguments_are_rendered_verbatim():
    odd_arguments = '{"b":1,   "a": "x"}'  # not what json.dumps would produce: must survive as is
    ids = prompt_ids([_assistant_message(None, [("f", odd_arguments)])], add_generation_prompt=False)
    assert odd_arguments in chat_tokens.decode(ids)


def test_content_parts_render_like_a_string():
    as_parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert prompt_ids(as_parts) == prompt_ids([{"role": "user", "content": "ab"}])


def test_splice_uses_the_carried_token_ids_instead_of_re_rendering():
    carried_prompt, carried_generation = [1, 2, 3], [4, 5, END_ID]
    assistant = _assistant_message("anything", []) | {
        "prompt_token_ids": carried_prompt,
        "generation_token_ids": carried_generation,
        "generation_log_probs": [-0.1, -0.1, -0.1],
    }
    before = {"role": "user", "content": "ignored: before the carrier"}
    messages = [before, assistant, {"role": "user", "content": "u"}]
    ids = prompt_ids(messages, TOOLS)
    assert ids == [1, 2, 3, 4, 5, END_ID, SPECIAL_TOKENS["<|user|>"], *b"u", END_ID, SPECIAL_TOKENS["<|assistant|>"]]


def test_inconsistent_generation_differs_from_its_re_rendering():
    text = "two words"
    consistent = chat_tokens.generation_ids(text)
    inconsistent = chat_tokens.generation_ids(text, token_consistent=False)
    assert ALT_SPACE_ID in inconsistent and ALT_SPACE_ID not in consistent
    assert chat_tokens.decode(inconsistent) == chat_tokens.decode(consistent) == text


def test_logprobs_are_deterministic_and_negative():
    values = [chat_tokens.token_logprob(token_id, position) for position, token_id in enumerate(range(300))]
    assert values == [chat_tokens.token_logprob(token_id, position) for position, token_id in enumerate(range(300))]
    assert all(-0.98 < value < 0 for value in values)


@pytest.mark.parametrize(
    "message, problem",
    [
        ({"role": "robot", "content": "x"}, "messages[0].role is 'robot'"),
        ({"role": "user", "content": [{"type": "image_url"}]}, "part of type 'image_url'"),
        ({"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
         "tool_calls[0] needs function.name and function.arguments as strings"),
        ({"role": "assistant", "content": "x", "prompt_token_ids": ["1"], "generation_token_ids": []},
         "prompt_token_ids must be a list of non-negative integer token ids"),
    ],
)  # fmt: skip
def test_unrenderable_messages_are_named(message, problem):
    with pytest.raises(TemplateError, match=problem.replace("[", r"\[").replace("]", r"\]").replace("|", r"\|")):
        prompt_ids([message])
