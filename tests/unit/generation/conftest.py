"""Fixtures shared by the generation tests: a tiny model taught one tool call, and servers started once."""

import copy

import pytest

from nemo_tau2.generation import GenerationConfig, start_generation
from nemo_tau2.generation.tiny_model import WEATHER_TOOL, TinyModel, build_tiny_model, teach_reply, tool_call_text
from tests.torch_threads import _one_torch_thread  # noqa: F401  (autouse)

TOOL_PROMPT = [
    {"role": "system", "content": "You are a helpful customer service agent."},
    {"role": "user", "content": "What is the weather in Paris?"},
]
TOOL_REPLY = tool_call_text("get_weather", {"city": "Paris"})


@pytest.fixture(scope="session")
def taught_tiny() -> TinyModel:
    """A tiny model that answers TOOL_PROMPT (with WEATHER_TOOL) with TOOL_REPLY under greedy decoding."""
    tiny = build_tiny_model(seed=0)
    loss = teach_reply(tiny, TOOL_PROMPT, TOOL_REPLY, tools=[WEATHER_TOOL], steps=100)
    assert loss < 0.05, f"the tiny model did not learn the tool call (loss {loss})"
    return tiny


def hf_config(**hf_cfg) -> GenerationConfig:
    return GenerationConfig(backend="hf", model_name="tiny", temperature=1.0, top_p=1.0, hf_cfg=hf_cfg)


@pytest.fixture(scope="module")
def hf_handle(taught_tiny):
    """An in-process hf server over a copy of the taught model (tests must not update its weights)."""
    model = copy.deepcopy(taught_tiny.model)
    with start_generation(hf_config(), model=model, tokenizer=taught_tiny.tokenizer) as handle:
        yield handle


@pytest.fixture(scope="session")
def llamacpp_handle():
    cfg = GenerationConfig(
        backend="llamacpp", temperature=1.0, top_p=1.0, llamacpp_cfg={"n_ctx": 2048, "n_parallel": 2, "n_threads": 1}
    )
    with start_generation(cfg) as handle:
        yield handle
