"""Hermes tool-call parsing, as vLLM's hermes parser behaves."""

import json

from nemo_tau2.generation.tool_calls import ParsedOutput, parse_hermes_tool_calls


def test_text_without_tool_calls_is_content():
    parsed = parse_hermes_tool_calls("Hello there.")
    assert parsed.content == "Hello there." and parsed.tool_calls == []


def test_empty_text_is_null_content():
    assert parse_hermes_tool_calls("").content is None


def test_one_call_is_structured_and_removed_from_content():
    parsed = parse_hermes_tool_calls(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    assert parsed.content is None
    (call,) = parsed.tool_calls
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_text_around_calls_stays_content_and_several_calls_keep_their_order():
    text = (
        'Checking.\n<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>'
    )
    parsed = parse_hermes_tool_calls(text)
    assert parsed.content == "Checking."
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["a", "b"]
    assert len({c["id"] for c in parsed.tool_calls}) == 2


def test_unclosed_final_call_is_parsed_when_its_json_is_complete():
    parsed = parse_hermes_tool_calls('<tool_call>{"name": "a", "arguments": {"k": "v"}}')
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["a"]


def test_malformed_json_leaves_everything_as_content():
    text = '<tool_call>{"name": "a", "arguments": {</tool_call>'
    parsed = parse_hermes_tool_calls(text)
    assert parsed.tool_calls == [] and parsed.content == text


def test_a_call_without_a_name_is_not_a_call():
    text = '<tool_call>{"arguments": {}}</tool_call>'
    assert parse_hermes_tool_calls(text).tool_calls == []


def test_arguments_are_always_valid_json_so_the_next_turn_renders():
    # a string that is not JSON (a small model's slip) would make llama.cpp's /apply-template refuse the history
    slip = parse_hermes_tool_calls('<tool_call>{"name": "a", "arguments": "{task_id: 1"}</tool_call>')
    assert json.loads(slip.tool_calls[0]["function"]["arguments"]) == "{task_id: 1"
    encoded = parse_hermes_tool_calls('<tool_call>{"name": "a", "arguments": "{\\"k\\": 1}"}</tool_call>')
    assert json.loads(encoded.tool_calls[0]["function"]["arguments"]) == {"k": 1}


def test_non_standard_json_is_not_a_call_and_never_reaches_the_arguments():
    # Python reads these, llama.cpp's /apply-template refuses them on the next turn (seen with SmolLM2 on mock)
    for block in ('{"name": "a", "arguments": {"x": NaN}}', '{"name": "a", "arguments": {"x": "\\ud800"}}'):
        text = f"<tool_call>{block}</tool_call>"
        assert parse_hermes_tool_calls(text) == ParsedOutput(content=text, tool_calls=[])
    encoded_nan = parse_hermes_tool_calls('<tool_call>{"name": "a", "arguments": "{\\"x\\": Infinity}"}</tool_call>')
    assert json.loads(encoded_nan.tool_calls[0]["function"]["arguments"]) == '{"x": Infinity}'
