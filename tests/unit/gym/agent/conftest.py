"""A whole tau2 stack for agent tests: the fake model server (policy and user) behind NeMo-Gym's own vllm_model
servers, the real resources server and the real agent server, all on 127.0.0.1."""

import asyncio
import dataclasses
from dataclasses import dataclass

import aiohttp
import pytest

from nemo_tau2.gym.launch import GymServers
from nemo_tau2.gym.stack import AGENT, ModelEndpoint, tau2_stack
from nemo_tau2.tau2_env.gym_rows import task_row
from nemo_tau2.testing import start_fake_server
from nemo_tau2.testing.scripts import Turn, TurnListScript

CONTINUING_AGENT = "tau2_agent_continuing"  # the stack's agent with pivot_text_reward: continue
FAST_RETRY = {"timeout_s": 3.0, "max_attempts": 3, "backoff_s": 0.05, "max_backoff_s": 0.2}


class SwitchableProvider:
    """Scripts chosen by the test for the next episodes; ``None`` leaves the conversation to the tau2 scripts."""

    def __init__(self):
        self.policy: TurnListScript | None = None
        self.user: TurnListScript | None = None

    def script_for(self, key: str):
        if key.endswith("|policy"):
            return self.policy
        if key.endswith("|user"):
            return self.user
        return None


@dataclass
class Stack:
    fake: object
    provider: SwitchableProvider
    agent_url: str
    servers: GymServers

    def run(self, domain: str, task_id: str, **row_fields) -> tuple[int, dict]:
        return asyncio.run(self.run_many([(domain, task_id, row_fields)]))[0]

    def run_row(self, row: dict, agent: str = AGENT) -> tuple[int, dict]:
        """One whole row (e.g. a pivot's) played by ``agent``, a server of this stack."""
        return asyncio.run(self.run_many([row], agent_url=self.servers.url(agent)))[0]

    async def run_many(self, jobs, concurrency: int = 16, agent_url: str | None = None) -> list[tuple[int, dict]]:
        """``jobs``: (domain, task_id, row fields) of task rows, or whole rows."""
        gate = asyncio.Semaphore(concurrency)
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(timeout=timeout) as http:

            async def one(job):
                row = job if isinstance(job, dict) else task_row(job[0], job[1]) | job[2]
                async with gate, http.post(f"{agent_url or self.agent_url}/run", json=row) as r:
                    return r.status, await r.json()

            return await asyncio.gather(*(one(job) for job in jobs))


@pytest.fixture(scope="package")
def stack():
    provider = SwitchableProvider()
    with start_fake_server(providers=[provider]) as fake:
        specs = tau2_stack(
            # NeMo-Gym's own vllm_model, as NeMo-RL runs it (tests/unit/gym/model_server hold fast_vllm_model to it)
            ModelEndpoint([fake.base_url], "fake-policy", server="vllm_model", return_token_ids=True),
            ModelEndpoint([fake.base_url], "fake-user", server="vllm_model"),
            domains=["airline", "retail", "telecom"],
            agent_config={"policy_retry": FAST_RETRY, "user_retry": FAST_RETRY},
        )
        agent = next(spec for spec in specs if spec.name == AGENT)  # a second agent: text pivots played on
        continuing = agent.config | {"pivot_text_reward": "continue"}
        specs.append(dataclasses.replace(agent, name=CONTINUING_AGENT, config=continuing))
        with GymServers(specs) as servers:
            yield Stack(fake, provider, servers.url(AGENT), servers)


@pytest.fixture
def fresh_stack(stack):
    """The shared stack with the fake back to oracle policy + scripted user, no faults, after the test too."""
    stack.fake.reset()
    stack.fake.set_tau2_scripts()
    stack.provider.policy = stack.provider.user = None
    yield stack
    stack.fake.reset()
    stack.fake.set_tau2_scripts()
    stack.provider.policy = stack.provider.user = None


def say(*texts: str) -> TurnListScript:
    return TurnListScript([Turn.say(text) for text in texts])
