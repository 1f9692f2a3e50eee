"""Progress inside episodes: the agent counts policy turns and tokens as they happen, and
``run_async_nemo_gym_rollout`` reports them to ``on_progress`` long before the episode ends, without changing its
results."""

import asyncio
import dataclasses

import aiohttp
import requests

from nemo_tau2.experience.progress import ProgressWatch, RolloutProgress
from nemo_tau2.experience.rollouts import SamplingParams, run_nemo_gym_rollout_sync
from nemo_tau2.gym.stack import AGENT, RESOURCES_SERVER
from nemo_tau2.tau2_env.gym_rows import task_row
from nemo_tau2.testing.scripts import TurnListScript

SAMPLING = SamplingParams(temperature=0.0, top_p=1.0)


def test_a_long_episode_reports_turns_and_tokens_before_it_ends(fresh_stack):
    # A conversation that never ends: ~100 policy turns until tau2's max_steps (200), each model call held 10 ms.
    fresh_stack.provider.policy = TurnListScript([], closing_text="Could you tell me more about that?")
    fresh_stack.provider.user = TurnListScript([], closing_text="Hmm, let me think.")
    fresh_stack.fake.inject_fault("timeout", hold_s=0.01, count=None)
    snapshots: list[RolloutProgress] = []
    (result,) = run_nemo_gym_rollout_sync(
        [task_row("airline", "11")],
        {AGENT: fresh_stack.agent_url},
        SAMPLING,
        1,
        on_progress=snapshots.append,
        progress_interval_s=0.05,
    )
    assert result.ok and result.termination_reason == "max_steps" and result.num_turns >= 50
    during = [s for s in snapshots if s.episodes_done == 0]
    assert any(s.episodes_running == 1 and 0 < s.policy_turns < result.num_turns for s in during), during[-3:]
    assert any(s.generation_tokens > 0 and s.tokens_per_s > 0 for s in during)
    turns = [s.policy_turns for s in snapshots]
    assert turns == sorted(turns)  # counts only grow
    last = snapshots[-1]
    assert (last.episodes_done, last.episodes_running, last.episodes_total) == (1, 0, 1)
    assert (last.policy_turns, last.user_turns) == (result.num_turns, result.num_user_turns)
    assert "1 running" in during[-1].describe() and "turns" in during[-1].describe()
    counters = requests.get(fresh_stack.agent_url + "/progress", timeout=10).json()
    assert counters["running_episodes"] == 0 and counters["policy_turns"] >= result.num_turns


def test_watching_does_not_change_the_results(fresh_stack):
    rows = [task_row("airline", "11"), task_row("airline", "11")]
    urls = {AGENT: fresh_stack.agent_url}
    plain = run_nemo_gym_rollout_sync(rows, urls, SAMPLING, 2)
    watched = run_nemo_gym_rollout_sync(rows, urls, SAMPLING, 2, on_progress=lambda _: None, progress_interval_s=0.01)

    def comparable(result):
        return dataclasses.replace(result, timings={}, full_result=None)

    assert [comparable(r) for r in plain] == [comparable(r) for r in watched]
    assert all(r.ok and r.reward == 1.0 for r in watched)


def test_an_agent_without_progress_counters_shows_episodes_only(fresh_stack):
    """NeMo-Gym's own agents have no /progress: turn counts are then unknown (None), not zero."""
    snapshots: list[RolloutProgress] = []

    async def poll_once():
        async with aiohttp.ClientSession() as http:
            watch = ProgressWatch(http, [fresh_stack.servers.url(RESOURCES_SERVER)], 1, snapshots.append, 1.0)
            await watch.start()
            watch.done = 1
            await watch.report()

    asyncio.run(poll_once())
    (snapshot,) = snapshots
    assert snapshot.policy_turns is None and snapshot.tokens_per_s is None and snapshot.episodes_done == 1
    assert snapshot.describe() == "0 running"
