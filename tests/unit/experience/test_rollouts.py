"""``run_async_nemo_gym_rollout`` on its own: real Gym servers, real tau2, the scripted fake as policy and user."""

import socket

import pytest

from nemo_tau2.experience.rollouts import (
    INFRASTRUCTURE_ERROR,
    OK,
    SamplingParams,
    rollout_metrics,
    run_async_nemo_gym_rollout,
    run_nemo_gym_rollout_sync,
)
from nemo_tau2.generation import GenerationConfig
from nemo_tau2.gym.environment import Tau2Environment, Tau2EnvironmentSpec
from nemo_tau2.gym.episode_config import NemoGymEnvConfig
from nemo_tau2.tau2_env.gym_rows import task_row

SAMPLING = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=512)
TASKS = [("airline", "0"), ("retail", "0")]


@pytest.fixture(scope="module")
def environment():
    fake = GenerationConfig(backend="fake", fake_cfg={}, temperature=0.0, top_p=1.0)
    spec = Tau2EnvironmentSpec(
        policy=fake, user=fake, domains=["airline", "retail"], gym=NemoGymEnvConfig(return_token_ids=True)
    )
    with Tau2Environment(spec) as env:
        yield env


def _rows(n: int) -> list[dict]:
    return [task_row(domain, task_id) for domain, task_id in TASKS for _ in range(n)]


async def test_groups_arrive_whole_with_token_data_and_tau2_rewards(environment):
    groups = [
        group
        async for group in run_async_nemo_gym_rollout(_rows(3), environment.agent_urls, SAMPLING, num_generations=3)
    ]
    assert sorted(group.group_index for group in groups) == [0, 1]
    for group in groups:
        assert [r.sample_index for r in group.results] == [0, 1, 2]
        assert {(r.domain, r.task_id) for r in group.results} == {TASKS[group.group_index]}
        for result in group.results:
            assert result.status == OK and result.reward == 1.0 and result.success is True  # the oracle policy
            assert result.termination_reason in ("user_stop", "agent_stop")
            assert result.token_contiguity_breaks == []
            generated = [m for m in result.message_log if m["role"] == "assistant"]
            assert generated and all(m["token_ids"] and len(m["generation_logprobs"]) == len(m["token_ids"])
                                     for m in generated)  # fmt: skip
            assert result.total_tokens == sum(len(m["token_ids"]) for m in result.message_log)
            assert result.user_simulator["strategy"] == "llm" and result.user_simulator["extra_model_calls"] == 0
            assert result.user_simulator["model_calls"] == result.num_user_turns
    metrics = rollout_metrics([r for g in groups for r in g.results])
    assert metrics["num_episodes"] == 6 and metrics["num_infrastructure_errors"] == 0
    assert metrics["success_rate"] == 1.0 and metrics["natural_termination_rate"] == 1.0
    assert metrics["user_extra_model_calls_per_sample"] == 0.0


def test_an_unreachable_agent_is_an_infrastructure_error_never_a_zero_reward():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    results = run_nemo_gym_rollout_sync(_rows(2), {"tau2_agent": url}, SAMPLING, num_generations=2)
    assert [r.row_index for r in results] == [0, 1, 2, 3]
    assert all(r.status == INFRASTRUCTURE_ERROR and r.reward is None and r.success is None for r in results)
    assert all(r.error for r in results)
    metrics = rollout_metrics(results)
    assert metrics == {"num_episodes": 4, "num_infrastructure_errors": 4}


def test_bad_batches_and_sampling_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="top_k must be None"):
        SamplingParams(temperature=1.0, top_p=1.0, top_k=20)
    with pytest.raises(ValueError, match="num_generations"):
        run_nemo_gym_rollout_sync(_rows(3)[:5], {"tau2_agent": "http://127.0.0.1:9"}, SAMPLING, num_generations=3)
