"""Oracle policy and scripted user playing tau2 tasks against each other over HTTP, scored by tau2's reward."""

import pytest
from conftest import play_episode

from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.reward import evaluate_episode
from nemo_tau2.testing import (
    OUT_OF_SCOPE,
    STOP,
    TRANSFER,
    PolicyScriptConfig,
    UserScriptConfig,
    check_contiguity,
)


def _telecom_tasks() -> list[str]:
    """Three telecom tasks: device actions only, device and agent actions mixed, and the longest."""
    tasks = domains.get_tasks("telecom", "base")
    requestors = {task.id: {action.requestor for action in task.evaluation_criteria.actions} for task in tasks}
    user_only = next(task_id for task_id, kinds in requestors.items() if kinds == {"user"})
    mixed = next(task_id for task_id, kinds in requestors.items() if kinds == {"user", "assistant"})
    longest = max(tasks, key=lambda task: len(task.evaluation_criteria.actions)).id
    return [user_only, mixed, longest]


GOLD_CASES = [
    *[("airline", task_id) for task_id in ("3", "7", "14")],
    *[("retail", task_id) for task_id in ("2", "16", "30")],
    *[("telecom", task_id) for task_id in _telecom_tasks()],
    ("mock", "create_task_1"),
]


def _reward(played) -> float:
    termination = "user_stop" if played.ending else "max_steps"
    return evaluate_episode(played.episode, played.assistant_texts, termination).reward


@pytest.mark.parametrize("domain, task_id", GOLD_CASES, ids=[f"{d}-{t[:24]}" for d, t in GOLD_CASES])
async def test_oracle_and_scripted_user_solve_gold_tasks(fake, http, domain, task_id):
    played = await play_episode(http, fake, domain, task_id)
    assert played.ending == STOP
    assert _reward(played) == 1.0
    gold = domains.get_task(domain, task_id).evaluation_criteria.actions
    assert [record.call.name for record in played.episode.tool_log] == [action.name for action in gold]
    assert [record.call.requestor for record in played.episode.tool_log] == [action.requestor for action in gold]
    assert check_contiguity(played.policy_turns) == []


@pytest.mark.parametrize("variant", ["do_nothing", "wrong_argument"])
@pytest.mark.parametrize("domain, task_id", [("retail", "2"), ("airline", "7"), ("telecom", _telecom_tasks()[1])])
async def test_failing_policy_variants_score_zero(fake, http, variant, domain, task_id):
    fake.set_tau2_scripts(policy=PolicyScriptConfig(variant=variant))
    played = await play_episode(http, fake, domain, task_id)
    assert played.ending == STOP
    assert _reward(played) == 0.0


async def test_variant_every_other_sample_alternates_success(fake, http):
    fake.set_tau2_scripts(policy=PolicyScriptConfig(variant="do_nothing", variant_every=2))
    rewards = [_reward(await play_episode(http, fake, "retail", "2", episode_id=f"ep-{index}")) for index in range(4)]
    assert rewards == [1.0, 0.0, 1.0, 0.0]


async def test_variant_every_needs_a_sample_index_in_the_episode_id(fake, http):
    fake.set_tau2_scripts(policy=PolicyScriptConfig(variant="do_nothing", variant_every=2))
    with pytest.raises(AssertionError, match="does not end with an integer"):
        await play_episode(http, fake, "retail", "2", episode_id="no-index")


async def test_transfer_variant_ends_with_transfer(fake, http):
    fake.set_tau2_scripts(policy=PolicyScriptConfig(variant="transfer"))
    played = await play_episode(http, fake, "airline", "7")
    assert played.ending == TRANSFER
    assert [record.call.name for record in played.episode.tool_log] == ["transfer_to_human_agents"]


async def test_out_of_scope_user_ending(fake, http):
    fake.set_tau2_scripts(user=UserScriptConfig(ending=OUT_OF_SCOPE))
    played = await play_episode(http, fake, "retail", "2")
    assert played.ending == OUT_OF_SCOPE and _reward(played) == 1.0


async def test_inconsistent_policy_is_flagged_and_the_splice_repairs_it(fake, http):
    fake.set_tau2_scripts(policy=PolicyScriptConfig(token_consistent=False))
    played = await play_episode(http, fake, "airline", "7")
    assert _reward(played) == 1.0  # same texts and calls: only the token ids differ
    breaks = check_contiguity(played.policy_turns)
    assert [problem.turn for problem in breaks] == list(range(1, len(played.policy_turns)))
    spliced = await play_episode(http, fake, "airline", "7", episode_id="1", carry_tokens=True)
    assert check_contiguity(spliced.policy_turns) == []
