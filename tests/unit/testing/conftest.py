"""Fixtures for the fake server's tests: a fresh server per test, an HTTP session, and a minimal tau2 agent loop
that plays a policy and a user simulator against each other over HTTP, executing tool calls in a real tau2
episode."""

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from nemo_tau2.testing import OUT_OF_SCOPE, STOP, TRANSFER, FakeServerHandle, start_fake_server, tau2_key

GREETING = "Hi! How can I help you today?"  # tau2's DEFAULT_FIRST_AGENT_MESSAGE
USER_STOP_TOKENS = (STOP, TRANSFER, OUT_OF_SCOPE)
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=30)


@pytest.fixture
def fake() -> Iterator[FakeServerHandle]:
    with start_fake_server() as handle:
        yield handle


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
        yield session


async def post_json(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with session.post(url, json=body) as response:
        return response.status, await response.json(content_type=None)


async def chat(session: aiohttp.ClientSession, fake: FakeServerHandle, **body: Any) -> dict[str, Any]:
    """POST a chat completion that must succeed; returns the body."""
    status, data = await post_json(session, f"{fake.base_url}/chat/completions", {"model": "fake-model", **body})
    assert status == 200, data
    return data


def assistant_message(completion: dict[str, Any], carry_tokens: bool = False) -> dict[str, Any]:
    """The completion's message as the next request's history entry (optionally with the splice fields)."""
    message = completion["choices"][0]["message"]
    entry = {"role": "assistant", "content": message["content"], "tool_calls": message["tool_calls"]}
    if carry_tokens:
        entry["prompt_token_ids"] = completion["prompt_token_ids"]
        entry["generation_token_ids"] = completion["choices"][0]["token_ids"]
        entry["generation_log_probs"] = [item["logprob"] for item in completion["choices"][0]["logprobs"]["content"]]
    return entry


@dataclass
class PlayedEpisode:
    episode: Any  # nemo_tau2.tau2_env.episode.Episode
    assistant_texts: list[str] = field(default_factory=list)
    user_texts: list[str] = field(default_factory=list)
    policy_turns: list[tuple[list[int], list[int]]] = field(default_factory=list)  # (prompt ids, generated ids)
    ending: str | None = None  # the user's stop token, None if max_steps ran out


async def play_episode(
    session: aiohttp.ClientSession,
    fake: FakeServerHandle,
    domain: str,
    task_id: str,
    episode_id: str = "0",
    carry_tokens: bool = False,
    max_steps: int = 80,
) -> PlayedEpisode:
    """tau2's orchestration, reduced: the user speaks after the greeting; each side's tool calls run in the episode
    (with its requestor) until it says something; the user's stop tokens end the episode."""
    from nemo_tau2.tau2_env import domains
    from nemo_tau2.tau2_env.episode import Episode

    played = PlayedEpisode(Episode.start(domain, task_id))
    tools = {"policy": domains.chat_tool_schemas(domain), "user": domains.chat_tool_schemas(domain, "user") or None}
    history = {
        "policy": [{"role": "system", "content": domains.policy(domain)}, {"role": "assistant", "content": GREETING}],
        "user": [{"role": "system", "content": "You are a customer."}, {"role": "user", "content": GREETING}],
    }
    speaker = "user"
    for _ in range(max_steps):
        completion = await chat(
            session,
            fake,
            messages=history[speaker],
            tools=tools[speaker],
            user=tau2_key(domain, task_id, episode_id, speaker),
            logprobs=True,
            top_logprobs=0,
            return_tokens_as_token_ids=True,
        )
        message = completion["choices"][0]["message"]
        if speaker == "policy":
            played.policy_turns.append((completion["prompt_token_ids"], completion["choices"][0]["token_ids"]))
        history[speaker].append(assistant_message(completion, carry_tokens and speaker == "policy"))
        if message["tool_calls"]:
            requestor = "assistant" if speaker == "policy" else "user"
            for call in message["tool_calls"]:
                function = call["function"]
                result = played.episode.call_tool(function["name"], json.loads(function["arguments"]), requestor)
                history[speaker].append({"role": "tool", "tool_call_id": call["id"], "content": result.content})
            continue
        text = message["content"]
        if speaker == "user":
            played.user_texts.append(text)
            ending = next((token for token in USER_STOP_TOKENS if token in text), None)
            if ending is not None:
                played.ending = ending
                return played
        else:
            played.assistant_texts.append(text)
        other = "policy" if speaker == "user" else "user"
        history[other].append({"role": "user", "content": text})  # roles flipped for the user simulator
        speaker = other
    return played


@pytest.fixture
def episode_player():
    return play_episode
