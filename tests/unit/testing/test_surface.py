"""The fake speaks the vLLM surface: response shape, tool calls, token ids, logprobs, /tokenize and refusals."""

import asyncio
import json

import aiohttp
import openai
import pytest
from conftest import assistant_message, chat, post_json

from nemo_tau2.testing import Turn, start_fake_server

MESSAGES = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Hello"}]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_user", "description": "Look up a user.", "parameters": {"type": "object"}},
    }
]
TOKEN_FIELDS = {"logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True}


async def test_tool_call_turn_has_vllm_shape(fake, http):
    fake.register_script("k", [Turn.call("get_user", {"user_id": "u1"}), Turn.call("get_user", {"user_id": "u2"})])
    data = await chat(http, fake, messages=MESSAGES, tools=TOOLS, user="k", **TOKEN_FIELDS)
    assert data["object"] == "chat.completion" and data["id"].startswith("chatcmpl-")
    (choice,) = data["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["role"] == "assistant" and message["content"] is None
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_user" and json.loads(call["function"]["arguments"]) == {"user_id": "u1"}
    assert data["usage"]["prompt_tokens"] == len(data["prompt_token_ids"])
    assert data["usage"]["completion_tokens"] == len(choice["token_ids"]) == len(choice["logprobs"]["content"])


async def test_logprobs_carry_token_ids_when_asked(fake, http):
    fake.register_script("k", [Turn.say("Hi there!")])
    data = await chat(http, fake, messages=MESSAGES, user="k", **TOKEN_FIELDS)
    choice = data["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == "Hi there!"
    entries = choice["logprobs"]["content"]
    assert [int(entry["token"].removeprefix("token_id:")) for entry in entries] == choice["token_ids"]
    assert all(entry["top_logprobs"] == [] and entry["logprob"] < 0 for entry in entries)
    assert bytes(b for entry in entries[:-1] for b in entry["bytes"]).decode() == "Hi there!"


async def test_logprobs_show_token_text_and_top_alternatives_without_token_id_mode(fake, http):
    fake.register_script("k", [Turn.say("ok")])
    data = await chat(http, fake, messages=MESSAGES, user="k", logprobs=True, top_logprobs=3)
    entries = data["choices"][0]["logprobs"]["content"]
    assert [entry["token"] for entry in entries] == ["o", "k", "<|end|>"]
    assert all(len(entry["top_logprobs"]) == 3 for entry in entries)
    assert entries[0]["top_logprobs"][0]["token"] == "o"
    assert entries[0]["top_logprobs"][1]["logprob"] < entries[0]["logprob"]


async def test_no_logprobs_unless_asked_but_token_ids_always(fake, http):
    fake.register_script("k", [Turn.say("ok")])
    data = await chat(http, fake, messages=MESSAGES, user="k")
    assert data["choices"][0]["logprobs"] is None
    assert data["choices"][0]["token_ids"] and data["prompt_token_ids"]


async def test_text_and_calls_in_one_turn(fake, http):
    fake.register_script("k", [Turn(text="Let me look.", tool_calls=(Turn.call("a").tool_calls[0],) * 2)])
    data = await chat(http, fake, messages=MESSAGES, tools=TOOLS, user="k")
    message = data["choices"][0]["message"]
    assert message["content"] == "Let me look." and len(message["tool_calls"]) == 2
    assert message["tool_calls"][0]["id"] != message["tool_calls"][1]["id"]


async def test_tokenize_equals_completion_prompt_and_extends_across_turns(fake, http):
    fake.register_script("k", [Turn.call("get_user", {"user_id": "u1"}), Turn.say("Found you."), Turn.say("Bye.")])
    history = list(MESSAGES)
    previous = None
    for _ in range(3):
        data = await chat(http, fake, messages=history, tools=TOOLS, user="k", **TOKEN_FIELDS)
        status, tokenized = await post_json(http, f"{fake.root_url}/tokenize", {"messages": history, "tools": TOOLS})
        assert status == 200 and tokenized["tokens"] == data["prompt_token_ids"]
        assert tokenized["count"] == len(tokenized["tokens"]) and tokenized["max_model_len"] == 131072
        if previous is not None:
            prefix = previous["prompt_token_ids"] + previous["choices"][0]["token_ids"]
            assert tokenized["tokens"][: len(prefix)] == prefix
        history.append(assistant_message(data))
        for call in data["choices"][0]["message"]["tool_calls"] or []:
            history.append({"role": "tool", "tool_call_id": call["id"], "content": '{"name": "Ann"}'})
        history.append({"role": "user", "content": "thanks"})
        previous = data


async def test_tokenize_applies_the_splice_like_completions(fake, http):
    fake.register_script("k", [Turn.say("first answer"), Turn.say("second")])
    data = await chat(http, fake, messages=MESSAGES, user="k", **TOKEN_FIELDS)
    history = [*MESSAGES, assistant_message(data, carry_tokens=True), {"role": "user", "content": "more"}]
    history[-2]["content"] = "text the model never generated"  # the splice must ignore it
    second = await chat(http, fake, messages=history, user="k", **TOKEN_FIELDS)
    status, tokenized = await post_json(http, f"{fake.root_url}/tokenize", {"messages": history})
    assert tokenized["tokens"] == second["prompt_token_ids"]
    prefix = data["prompt_token_ids"] + data["choices"][0]["token_ids"]
    assert second["prompt_token_ids"][: len(prefix)] == prefix


async def test_tokenize_plain_prompt_and_generation_prompt_switch(fake, http):
    status, data = await post_json(http, f"{fake.root_url}/tokenize", {"prompt": "abc"})
    assert status == 200 and data["tokens"] == [97, 98, 99]
    with_prompt = (await post_json(http, f"{fake.root_url}/tokenize", {"messages": MESSAGES}))[1]["tokens"]
    body = {"messages": MESSAGES, "add_generation_prompt": False}
    without = (await post_json(http, f"{fake.root_url}/tokenize", body))[1]["tokens"]
    assert with_prompt[:-1] == without


async def test_models_and_health(fake, http):
    async with http.get(f"{fake.base_url}/models") as response:
        data = await response.json()
    assert data["object"] == "list" and data["data"][0]["id"] == "fake-model"
    async with http.get(f"{fake.root_url}/health") as response:
        assert response.status == 200


async def test_token_ids_only_on_request_when_configured_like_vllm(http):
    with start_fake_server(token_ids_in_completions="when_requested") as fake:
        fake.register_script("k", [Turn.say("ok")])
        plain = await chat(http, fake, messages=MESSAGES, user="k")
        assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]
        asked = await chat(http, fake, messages=MESSAGES, user="k", return_token_ids=True)
        assert asked["prompt_token_ids"] and asked["choices"][0]["token_ids"]


async def test_max_tokens_truncates_with_length_finish(fake, http):
    fake.register_script("k", [Turn.call("get_user", {"user_id": "u1"})])
    data = await chat(http, fake, messages=MESSAGES, user="k", max_tokens=5, **TOKEN_FIELDS)
    choice = data["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["tool_calls"] is None
    assert choice["message"]["content"] == "<tool" and len(choice["token_ids"]) == 5


@pytest.mark.parametrize(
    "extra, problem",
    [
        ({"stream": True}, "stream=true is not supported"),
        ({"top_k": 40}, "top_k=40 is not supported"),
        ({"stop": ["\n"]}, "stop=['\\n'] is not supported"),
        ({"n": 2}, "n=2 is not supported"),
        ({"max_tokens": 0}, "max_tokens must be a positive integer"),
        ({"top_logprobs": 99}, "top_logprobs must be an integer from 0 to 20"),
        ({"messages": []}, "'messages' must be a non-empty list"),
        ({"user": None}, "has no conversation key in 'user'"),
        ({"user": "nobody"}, "no script for conversation key 'nobody'"),
        ({"tool_choice": "none"}, "calls ['get_user'] but the request has tool_choice='none'"),
        ({"tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice forces 'other'"),
    ],
)
async def test_bad_requests_get_400_naming_the_problem(fake, http, extra, problem):
    fake.register_script("k", [Turn.call("get_user", {"user_id": "u1"})])
    body = {"model": "m", "messages": MESSAGES, "user": "k", "top_k": -1, "stop": None} | extra
    status, data = await post_json(http, f"{fake.base_url}/chat/completions", body)
    assert status == 400 and data["type"] == "BadRequestError" and data["code"] == 400
    assert problem in data["message"]


async def test_invalid_json_body_is_400(fake, http):
    async with http.post(f"{fake.base_url}/chat/completions", data=b"{not json") as response:
        assert response.status == 400
        assert "not valid JSON" in (await response.json())["message"]


async def test_context_overflow_is_vllm_400():
    with start_fake_server(max_model_len=50) as fake:
        fake.register_script("k", [Turn.say("ok")])
        client = openai.OpenAI(base_url=fake.base_url, api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="maximum context length is 50 tokens"):
            client.chat.completions.create(model="m", messages=MESSAGES * 5, user="k")


def test_openai_sdk_parses_the_response(fake):
    fake.register_script("k", [Turn.call("get_user", {"user_id": "u1"})])
    client = openai.OpenAI(base_url=fake.base_url, api_key="unused", max_retries=0)
    completion = client.chat.completions.create(
        model="m", messages=MESSAGES, tools=TOOLS, user="k", logprobs=True, top_logprobs=0
    )
    call = completion.choices[0].message.tool_calls[0]
    assert call.function.name == "get_user" and completion.choices[0].finish_reason == "tool_calls"
    assert completion.choices[0].logprobs.content[0].token == "<"


async def test_hundreds_of_concurrent_connections_are_all_answered(fake):
    for index in range(300):
        fake.register_script(f"c{index}", [Turn.say(f"answer {index}")])
    connector = aiohttp.TCPConnector(limit=0, force_close=True)  # one connection per request, all at once
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        answers = await asyncio.gather(
            *(chat(session, fake, messages=MESSAGES, user=f"c{index}") for index in range(300))
        )
    assert [data["choices"][0]["message"]["content"] for data in answers] == [f"answer {i}" for i in range(300)]
    assert fake.stats().requests_by_route["chat"] == 300
