"""Shared for the environment tests: one scripted fake model server (the user simulator's endpoint, and the policy
of a reference agent stack), and helpers that play an episode with the fake's scripted policies."""

import asyncio
from dataclasses import dataclass

import pytest

from nemo_tau2.env_api import AsyncTau2Env, Tau2Env
from nemo_tau2.generation.launch import GenerationHandle
from nemo_tau2.gym.launch import GymServers, ServerSpec
from nemo_tau2.gym.stack import AGENT, ModelEndpoint, tau2_stack
from nemo_tau2.testing import start_fake_server
from nemo_tau2.testing.scripts import DEFAULT_CLOSING_TEXT, Turn
from nemo_tau2.testing.tau2_scripts import policy_turns
from tests.unit.gym.agent.conftest import FAST_RETRY, SwitchableProvider

USER = {"backend": "fake", "temperature": 0.0, "top_p": 1.0}  # the user block's generation (not started: see below)
STRATEGY_AGENT = "tau2_agent_reflection"


@dataclass
class Fake:
    server: object
    provider: SwitchableProvider
    user_endpoint: GenerationHandle

    def env(self, domain: str, cls=AsyncTau2Env, **kwargs):
        kwargs.setdefault("split", None if "task_ids" in kwargs else "base")
        return cls(domain, user=kwargs.pop("user", USER), user_endpoint=self.user_endpoint, **kwargs)


@pytest.fixture(scope="package")
def fake_package():
    provider = SwitchableProvider()
    with start_fake_server(providers=[provider]) as server:
        handle = GenerationHandle(backend="fake", base_urls=[server.base_url], model_name="fake-user")
        yield Fake(server, provider, handle)


@pytest.fixture
def fake(fake_package):
    """The shared fake back to oracle policy + scripted user, no faults, before and after the test."""

    def clean() -> None:
        fake_package.server.reset()
        fake_package.server.set_tau2_scripts()
        fake_package.provider.policy = fake_package.provider.user = None

    clean()
    yield fake_package
    clean()


@pytest.fixture(scope="package")
def agent_stack(fake_package):
    """The agent server (and a second one with the reflection strategy) over the same fake: the reference."""
    url = fake_package.server.base_url
    specs = tau2_stack(
        ModelEndpoint([url], "fake-policy"),
        ModelEndpoint([url], "fake-user"),
        domains=["airline", "retail", "telecom"],
        agent_config={"policy_retry": FAST_RETRY, "user_retry": FAST_RETRY},
    )
    agent = next(spec for spec in specs if spec.name == AGENT)
    reflective = agent.config | {"user_strategy": {"strategy": "reflection", "max_checks": 2}}
    specs.append(ServerSpec(STRATEGY_AGENT, agent.server_type, agent.impl, agent.server_class, reflective))
    with GymServers(specs) as servers:
        yield servers


def chat_turns(domain: str, task_id: str, variant: str = "oracle") -> list[dict]:
    return [turn.chat_message() for turn in policy_turns(domain, task_id, variant)]


async def play(env: AsyncTau2Env, task_index: int, variant: str = "oracle", sample_index: int = 0):
    """One episode with the fake's scripted policy: ``(last info, every observation, last step's flags)``."""
    observation, info = await env.reset(task_index, sample_index)
    observations = [observation]
    turns = chat_turns(env.config.domain, info["task_id"], variant)
    closing = Turn.say(DEFAULT_CLOSING_TEXT).chat_message()
    flags = (info["termination_reason"] is not None, False)
    for index in range(env.config.max_steps):
        if flags[0] or flags[1]:
            break
        observation, _, *flags, info = await env.step(turns[index] if index < len(turns) else closing)
        observations.append(observation)
    return info, observations, tuple(flags)


def play_sync(env: Tau2Env, task_index: int, variant: str = "oracle"):
    observation, info = env.reset(task_index)
    for action in chat_turns(env.config.domain, info["task_id"], variant):
        observation, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return info
    raise AssertionError(f"the scripted episode of task {info['task_id']} did not end")


async def gather_limited(coroutines, limit: int = 32) -> list:
    gate = asyncio.Semaphore(limit)

    async def one(coroutine):
        async with gate:
            return await coroutine

    return await asyncio.gather(*(one(c) for c in coroutines))


def play_forked(env: Tau2Env, task_index: int, at: int | None = None) -> tuple[list[dict], list[list[dict]]]:
    """The oracle played to turn ``at`` (None: its middle), the episode forked in two there; then the parent and the
    first fork
    play the rest of the oracle and the second fork says the closing text at once. Each one's last info (with its
    reward) and the tool answers it saw after the fork."""
    observation, info = env.reset(task_index)
    turns = chat_turns(env.config.domain, info["task_id"])
    middle = len(turns) // 2 if at is None else at
    for action in turns[:middle]:
        assert env.step(action)[2:4] == (False, False)
    forks = env.fork(2)
    assert [fork.messages for fork in forks] == [env.messages] * 2  # the conversation so far
    closing = Turn.say(DEFAULT_CLOSING_TEXT).chat_message()
    infos, answers = [], []
    try:
        for played, plan in ((env, turns[middle:]), (forks[0], turns[middle:]), (forks[1], [closing])):
            seen = []
            for action in [*plan, closing]:
                observation, reward, terminated, truncated, info = played.step(action)
                seen += [message["content"] for message in observation["messages"] if message["role"] == "tool"]
                if terminated or truncated:
                    break
            infos.append(info | {"reward": reward})
            answers.append(seen)
    finally:
        for fork in forks:
            fork.close()
    return infos, answers
