"""Script keying and turn selection: per-key scripts, retry-stable turns, history offsets, exhaustion, defaults."""

import pytest
from conftest import assistant_message, chat, post_json

from nemo_tau2.testing import (
    ScriptRequest,
    ScriptSpec,
    Turn,
    TurnListScript,
    TurnSpec,
    serve_fake_server,
    start_fake_server,
)

MESSAGES = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]


def _text(data: dict) -> str:
    return data["choices"][0]["message"]["content"]


async def test_each_key_gets_its_own_script(fake, http):
    fake.register_script("a", [Turn.say("I am A")])
    fake.register_script("b", [Turn.say("I am B")])
    assert _text(await chat(http, fake, messages=MESSAGES, user="b")) == "I am B"
    assert _text(await chat(http, fake, messages=MESSAGES, user="a")) == "I am A"


async def test_retried_request_gets_the_same_turn(fake, http):
    fake.register_script("k", [Turn.say("one"), Turn.say("two"), Turn.say("three")])
    first = await chat(http, fake, messages=MESSAGES, user="k")
    assert _text(first) == "one"
    history = [*MESSAGES, assistant_message(first), {"role": "user", "content": "go on"}]
    answers = [_text(await chat(http, fake, messages=history, user="k")) for _ in range(3)]
    assert answers == ["two", "two", "two"]  # three tries of the same request: no counter advanced
    assert fake.stats().requests_by_key["k"] == 4


async def test_turns_count_from_the_first_request_of_the_key(fake, http):
    fake.register_script("k", [Turn.say("first"), Turn.say("second")])
    prewritten = [*MESSAGES, {"role": "assistant", "content": "old"}, {"role": "user", "content": "again"}]
    first = await chat(http, fake, messages=prewritten, user="k")
    assert _text(first) == "first"
    history = [*prewritten, assistant_message(first), {"role": "user", "content": "and?"}]
    assert _text(await chat(http, fake, messages=history, user="k")) == "second"


async def test_conversation_going_backwards_is_400(fake, http):
    fake.register_script("k", [Turn.say("x")])
    await chat(http, fake, messages=[*MESSAGES, {"role": "assistant", "content": "old"}], user="k")
    status, data = await post_json(http, f"{fake.base_url}/chat/completions", {"messages": MESSAGES, "user": "k"})
    assert status == 400 and "conversation 'k' went backwards" in data["message"]


async def test_exhausted_script_repeats_closing_or_errors(fake, http):
    fake.register_script("repeat", TurnListScript([Turn.say("only")], closing_text="Anything else?"))
    fake.register_script("strict", TurnListScript([Turn.say("only")], when_exhausted="error"))
    later = [*MESSAGES, {"role": "assistant", "content": "only"}, {"role": "user", "content": "?"}]
    for key in ("repeat", "strict"):
        await chat(http, fake, messages=MESSAGES, user=key)
    assert _text(await chat(http, fake, messages=later, user="repeat")) == "Anything else?"
    status, data = await post_json(http, f"{fake.base_url}/chat/completions", {"messages": later, "user": "strict"})
    assert status == 400 and "has 1 turns and ended; the request asks for turn 1" in data["message"]


async def test_keyless_requests_use_the_default_script_when_configured(http):
    default = ScriptSpec(turns=[TurnSpec(text="default answer")])
    with start_fake_server(missing_key="default", default_script=default) as fake:
        assert _text(await chat(http, fake, messages=MESSAGES)) == "default answer"


async def test_key_can_come_from_metadata(http):
    with start_fake_server(key_field="metadata.conversation") as fake:
        fake.register_script("m1", [Turn.say("from metadata")])
        data = await chat(http, fake, messages=MESSAGES, metadata={"conversation": "m1"}, user="ignored")
        assert _text(data) == "from metadata"


async def test_custom_provider_serves_its_own_key_format(http):
    class EchoScript:
        token_consistent = True

        def respond(self, request: ScriptRequest) -> Turn:
            return Turn.say(f"{request.key} turn {request.turn_index}: {request.messages[-1]['content']}")

    class EchoProvider:
        def script_for(self, key: str):
            return EchoScript() if key.startswith("echo:") else None

    async with serve_fake_server(providers=[EchoProvider()]) as fake:  # on this test's own event loop
        assert _text(await chat(http, fake, messages=MESSAGES, user="echo:1")) == "echo:1 turn 0: hi"


def test_config_rejects_default_mode_without_script():
    with pytest.raises(ValueError, match="missing_key='default' needs a default_script"):
        start_fake_server(missing_key="default")


def test_turn_needs_text_or_calls():
    with pytest.raises(ValueError, match="needs non-empty text or at least one tool call"):
        Turn(text="")
