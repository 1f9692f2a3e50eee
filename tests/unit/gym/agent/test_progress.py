"""Progress inside episodes: the agent counts policy turns and tokens as they happen, and
``run_async_nemo_gym_rollout`` reports them to ``on_progress`` long before the episode ends, without changing its
results."""

import asyncio
import dataclasses
import logging
import os
import signal
import time

import aiohttp
import requests

from nemo_tau2.experience import progress
from nemo_tau2.experience.progress import ProgressWatch, RolloutProgress
from nemo_tau2.experience.rollouts import SamplingParams, run_nemo_gym_rollout_sync
from nemo_tau2.gym.launch import free_port
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


def test_an_unreachable_agent_is_named_once_and_not_polled_until_it_answers_again(fresh_stack, caplog, monkeypatch):
    """A silent agent (its process stopped: the port accepts, nothing answers, as a hung host) and one whose port
    refuses: each is reported unreachable once over three steps' watches, and only the first watch waits for the
    silent one's poll timeout. Started again, the agent is found answering by the background probe and counted."""
    agent_pid, refusing = fresh_stack.servers.pid(AGENT), f"http://127.0.0.1:{free_port()}"
    urls = [fresh_stack.agent_url, refusing]
    caplog.set_level(logging.INFO, logger=progress.__name__)

    async def one_step() -> float:
        began = time.monotonic()
        async with aiohttp.ClientSession() as http:
            watch = ProgressWatch(http, urls, 1, lambda _: None, 1.0)
            await watch.start()
            await watch.report()
        return time.monotonic() - began

    os.kill(agent_pid, signal.SIGSTOP)
    try:
        waits = [asyncio.run(one_step()) for _ in range(3)]
    finally:
        os.kill(agent_pid, signal.SIGCONT)
    assert waits[0] >= progress.POLL_TIMEOUT_S and max(waits[1:]) < 1.0, waits
    for url in urls:
        lines = [r.getMessage() for r in caplog.records if url in r.getMessage()]
        assert len(lines) == 1 and "is unreachable" in lines[0], lines
    assert "no answer within" in caplog.text and "Cannot connect" in caplog.text  # each cause named

    monkeypatch.setattr(progress, "UNREACHABLE_RECHECK_S", 0.2)
    snapshots: list[RolloutProgress] = []

    async def watch_a_while() -> None:
        async with aiohttp.ClientSession() as http:
            watch = ProgressWatch(http, [fresh_stack.agent_url], 1, snapshots.append, 0.1)
            await watch.start()
            watching = asyncio.create_task(watch.run_forever())
            await asyncio.sleep(1.5)
            watching.cancel()

    asyncio.run(watch_a_while())
    assert f"agent at {fresh_stack.agent_url} answers again" in caplog.text
    assert snapshots and snapshots[-1].policy_turns == 0  # polled again: its counters are back
