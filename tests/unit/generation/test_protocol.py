"""Request checks and message normalisation of the vLLM surface (no model needed)."""

import pytest

from nemo_tau2.generation.errors import BadRequestError
from nemo_tau2.generation.protocol import ChatCompletionRequest, normalize_messages, normalize_tools

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"stream": True}, "stream"),
        ({"n": 2}, "n:"),
        ({"top_k": 40}, "top_k"),
        ({"stop": "</s>"}, "stop"),
        ({"stop_token_ids": [2]}, "stop_token_ids"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"repetition_penalty": 1.1}, "repetition_penalty"),
        ({"min_p": 0.1}, "min_p"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
def test_settings_that_would_change_sampling_silently_are_rejected_by_name(fields, named):
    with pytest.raises(BadRequestError, match=named):
        ChatCompletionRequest(messages=MESSAGES, **fields).check_supported()


def test_neutral_values_and_unknown_fields_are_accepted():
    request = ChatCompletionRequest(
        messages=MESSAGES, top_k=-1, presence_penalty=0.0, user="u1", metadata={"a": "b"}, parallel_tool_calls=True
    )
    request.check_supported()


def test_named_tool_choice_narrows_tools_and_unknown_names_fail():
    tools = [{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "b"}}]
    named = ChatCompletionRequest(
        messages=MESSAGES, tools=tools, tool_choice={"type": "function", "function": {"name": "b"}}
    )
    assert named.tool_choice_mode() == ("required", [tools[1]])
    missing = ChatCompletionRequest(messages=MESSAGES, tools=tools, tool_choice={"function": {"name": "c"}})
    with pytest.raises(BadRequestError, match="'c'"):
        missing.tool_choice_mode()


def test_messages_are_normalised_for_chat_templates():
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}],
            "prompt_token_ids": [1],
            "generation_token_ids": [2],
            "generation_log_probs": [-0.1],
        },
        {"role": "tool", "tool_call_id": "c1", "content": None},
    ]
    system, _, assistant, tool = normalize_messages(messages)
    assert system == {"role": "system", "content": "Be brief."}
    assert assistant["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert "prompt_token_ids" not in assistant and assistant["content"] is None
    assert tool["content"] == ""
    assert messages[2]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'  # input untouched


def test_unknown_roles_and_non_text_parts_are_bad_requests():
    with pytest.raises(BadRequestError, match=r"messages\[0\].role"):
        normalize_messages([{"role": "narrator", "content": "x"}])
    with pytest.raises(BadRequestError, match="only text parts"):
        normalize_messages([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])


def test_tools_get_one_key_order_so_the_prompt_does_not_depend_on_the_client():
    as_gym_sends = {"function": {"parameters": {"type": "object"}, "name": "f", "strict": True}, "type": "function"}
    (tool,) = normalize_tools([as_gym_sends])
    assert list(tool) == ["type", "function"] and list(tool["function"]) == ["name", "parameters"]
    with pytest.raises(BadRequestError, match=r"tools\[0\]"):
        normalize_tools([{"type": "function"}])
