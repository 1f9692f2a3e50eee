"""User strategies with a real small model (SmolLM2-135M on llama.cpp) as the user: no crash whatever it writes,
every user-model call counted, only messages reach the policy."""

import importlib.util
from collections import Counter

import pytest

from nemo_tau2.env_api import AsyncTau2Env
from nemo_tau2.generation import GenerationConfig, start_generation
from nemo_tau2.gym.agent import user_strategies as strategies
from nemo_tau2.gym.http_client import GymHttpClient

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("xllamacpp") is None, reason="needs the llamacpp extra (uv sync --extra llamacpp)"
)

USER = GenerationConfig(
    backend="llamacpp",
    temperature=1.0,  # a regenerated message can differ
    top_p=1.0,
    max_new_tokens=40,
    # one thread: llama.cpp's threads spin, and the suite runs two workers on two cores (24 s alone; 90-134 s with two)
    llamacpp_cfg={"n_ctx": 2048, "n_parallel": 1, "n_threads": 1},
)


class CountingHttp(GymHttpClient):
    """Counts the chat completions sent to the endpoint, by the role in their conversation key."""

    def __init__(self):
        super().__init__()
        self.roles = Counter()

    async def post(self, url, payload, *args, **kwargs):
        if url.endswith("/chat/completions"):
            self.roles[payload["user"].rsplit("|", 1)[1]] += 1
        return await super().post(url, payload, *args, **kwargs)


@pytest.fixture(scope="module")
def smollm2():
    with start_generation(USER) as handle:
        yield handle


@pytest.mark.parametrize("strategy", ["react", "verify", "reflection"])
async def test_a_small_user_model_plays_each_strategy_without_failing_the_episode(smollm2, strategy):
    http = CountingHttp()
    user = {"generation": USER, "strategy": strategy}
    async with AsyncTau2Env("mock", task_ids=["create_task_1"], user=user, user_endpoint=smollm2, http=http) as env:
        observation, info = await env.reset(0)
        seen = [m for m in observation["messages"] if m["role"] == "user"]
        if info["termination_reason"] is None:
            observation, _, _, _, info = await env.step({"role": "assistant", "content": "What is the task title?"})
            seen += [m for m in observation["messages"] if m["role"] == "user"]
        await http.close()
    stats = info["user_simulator"]
    assert stats["strategy"] == strategy
    assert stats["model_calls"] == sum(http.roles.values()) > 0
    assert http.roles["user_check"] == stats["checks"] and http.roles["user_reflect"] == stats["reflections"]
    # each check passes, fails or has no readable verdict; each reflection rewrites or has no readable rewrite
    readable = stats["checks"] + stats["reflections"] if strategy != "react" else len(seen)
    assert stats["failed_checks"] + stats["format_fallbacks"] <= readable
    if strategy == "react" and stats["format_fallbacks"] == 0:
        assert not any(strategies.MESSAGE_LABEL.lower() in m["content"].lower() for m in seen)
    if strategy != "react":
        assert stats["checks"] >= len(seen)  # every message checked at least once
    if strategy == "verify":
        assert stats["reflections"] == 0
