"""The user simulator's requests, without servers: llm's are exactly tau2's user call as the agent made it before
strategies existed (same keys, order and values), and each strategy adds only its own parts."""

import json

import orjson
import pytest

from nemo_tau2.gym.agent import user_strategies as strategies
from nemo_tau2.gym.agent.conversation import EpisodeState, start_conversation
from nemo_tau2.gym.agent.user_simulator import UserSimulator, tau2_trial_seed
from nemo_tau2.gym.agent.user_strategies import UserStrategyConfig
from nemo_tau2.gym.episode_config import EpisodeSettings
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.gym_rows import task_row

PARAMS = {"temperature": 0.0, "top_p": 1.0, "max_output_tokens": 256}
DEVICE_TOOLS = [{"type": "function", "name": "toggle_airplane_mode", "parameters": {}, "strict": False}]


def _settings(strategy: str = "llm", **fields) -> EpisodeSettings:
    return EpisodeSettings(
        user_responses_create_params=PARAMS, user_strategy=UserStrategyConfig(strategy=strategy, **fields)
    )


def _state() -> EpisodeState:
    state = EpisodeState.for_row(task_row("telecom", domains.get_tasks("telecom", "test")[0].id), 3)
    state.user_system_prompt, state.user_tools = "You are a customer.", DEVICE_TOOLS
    start_conversation(state)
    return state


def _answer(text: str) -> dict:
    return {"output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}]}


class Recorder:
    def __init__(self, *answers: str):
        self.answers = list(answers)
        self.bodies: list[dict] = []

    async def __call__(self, state, body):
        self.bodies.append(json.loads(orjson.dumps(body)))
        return _answer(self.answers.pop(0))


async def test_llm_requests_are_tau2s_user_call_byte_for_byte():
    state, record = _state(), Recorder("Hi, my phone cannot send pictures.")
    turn = await UserSimulator(_settings(), record)(state)
    expected = PARAMS | {
        "input": [
            {"type": "message", "role": "system", "content": "You are a customer."},
            {"type": "message", "role": "user", "content": state.user_history[0]["content"]},
        ],
        "user": f"tau2|telecom|{state.task_id}|{state.conversation_id}|user",
        "tools": DEVICE_TOOLS,
        "metadata": {"extra_body": json.dumps({"seed": tau2_trial_seed(300, 3)}, separators=(",", ":"))},
    }
    assert orjson.dumps(record.bodies[0]) == orjson.dumps(expected)
    assert turn.text == "Hi, my phone cannot send pictures." and state.user_history[-1]["role"] == "assistant"


async def test_react_adds_its_format_to_the_system_prompt_and_keeps_the_thought_to_itself():
    output = f"{strategies.THOUGHT_LABEL}\nI start.\n{strategies.MESSAGE_LABEL}\nHello there."
    state, record = _state(), Recorder(output)
    turn = await UserSimulator(_settings("react"), record)(state)
    system = record.bodies[0]["input"][0]["content"]
    assert system == f"You are a customer.\n\n{strategies.REACT_INSTRUCTIONS}"
    assert turn.text == "Hello there."
    assert state.user_history[-1]["content"] == output  # the user model sees its own thought next time


@pytest.mark.parametrize(
    ("verdict", "expected"), [("yes", True), ("No, it invents a number.", False), ("True", True), ("maybe", None)]
)
def test_check_verdicts_are_read_from_the_first_word(verdict, expected):
    assert strategies.check_verdict(verdict) is expected


async def test_a_check_quotes_the_instructions_the_conversation_and_the_candidate():
    state, record = _state(), Recorder("Hello.", "yes")
    await UserSimulator(_settings("verify"), record)(state)
    check = record.bodies[1]
    assert check["user"].endswith("|user_check") and "tools" not in check
    prompt = check["input"][1]["content"]
    assert "You are a customer." in prompt and strategies.quoted_candidate(prompt) == "Hello."
    assert "Agent: " + state.user_history[0]["content"] in prompt


async def test_verify_regenerations_get_their_own_seed():
    state, record = _state(), Recorder("Hello.", "no", "Hi.", "yes")
    turn = await UserSimulator(_settings("verify"), record)(state)
    seeds = [json.loads(body["metadata"]["extra_body"])["seed"] for body in record.bodies]
    base = tau2_trial_seed(300, 3)
    assert seeds == [base, base, base + 1, base] and turn.text == "Hi."


def test_trial_seeds_are_tau2s_in_any_order_of_asking():
    """tau2's run_domain: random.seed(base), one randint(0, 1e6) per trial; the agent keeps the draws it made."""
    import random

    def tau2s(base: int, trial: int) -> int:
        rng = random.Random(base)
        return [rng.randint(0, 1000000) for _ in range(trial + 1)][trial]

    asked = [(300, 40_000), (300, 3), (11, 7), (300, 40_001), (300, 0), (11, 0), (12345, 1)]
    assert [tau2_trial_seed(base, trial) for base, trial in asked] == [tau2s(base, trial) for base, trial in asked]
