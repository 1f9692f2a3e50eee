"""Async GRPO's collector and replay buffer against real Gym servers (tau2's mock domain), the scripted fake as policy
and user, and a simulated trainer (sleeps for its training, a timed no-op for its weight load) driving
``take`` / ``paused`` as ``grpo_train`` does: the staleness bound, the bounded buffer, and weight updates that never
fall inside an episode."""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from nemo_tau2.algorithms.async_collector import AsyncCollector
from nemo_tau2.algorithms.curriculum import TaskCurriculum
from nemo_tau2.algorithms.grpo_config import GRPODataConfig, GRPOSettings
from nemo_tau2.algorithms.replay_buffer import PromptDraw, ReplayBuffer, VersionedGroup
from nemo_tau2.algorithms.sampling import EpisodeGroup
from nemo_tau2.algorithms.training_setup import train_and_val_rows
from nemo_tau2.experience.message_log import turn_weight_versions
from nemo_tau2.experience.rollouts import SamplingParams
from nemo_tau2.generation import GenerationConfig
from nemo_tau2.gym.environment import Tau2Environment, Tau2EnvironmentSpec
from nemo_tau2.gym.episode_config import NemoGymEnvConfig
from nemo_tau2.testing.config import ControlRequest
from nemo_tau2.testing.faults import FaultSpec

PROMPTS_PER_STEP, MAX_AGE = 2, 1
SAMPLING = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=256)


@pytest.fixture(scope="module")
def environment():
    # every model call takes 40 ms: a mock episode (~6 calls of policy and user) takes a few hundred ms
    fake = GenerationConfig(backend="fake", fake_cfg={"latency_ms": 40}, temperature=0.0, top_p=1.0)
    spec = Tau2EnvironmentSpec(
        policy=fake, user=fake, domains=["mock"], gym=NemoGymEnvConfig(return_token_ids=True, max_turns=4)
    )
    with Tau2Environment(spec) as env:
        yield env


@dataclass
class Run:
    """What the simulated trainer saw: per step the groups it took, each weight load's interval, and metrics."""

    taken: list[tuple[int, list[VersionedGroup]]] = field(default_factory=list)
    loads: list[tuple[float, float, int]] = field(default_factory=list)  # (start, end, new version)
    metrics: list[dict[str, float]] = field(default_factory=list)
    snapshot: dict | None = None  # the collector's state_dict() after step ``snapshot_at``, as a checkpoint takes it
    draws: dict[int, int] = field(default_factory=dict)  # draw_id -> row_index of every group trained


def _drive(
    environment: Tau2Environment,
    *,
    steps: int,
    train_s: float | tuple[float, ...],
    max_age: int = MAX_AGE,
    start: int = 0,
    state: dict | None = None,
    snapshot_at: int | None = None,
    in_flight: bool = False,
    before_load: Callable[[], None] = lambda: None,
) -> Run:
    settings = GRPOSettings(
        num_prompts_per_step=PROMPTS_PER_STEP, num_generations_per_prompt=2, max_num_steps=steps,
        max_rollout_concurrency=16, curriculum={"enabled": False}, reward_shaping={"enabled": False},
        async_grpo={"enabled": True, "max_trajectory_age_steps": max_age, "in_flight_weight_updates": in_flight},
    )  # fmt: skip
    tasks = ["update_task_1", "create_task_1"]
    rows, _ = train_and_val_rows(
        GRPODataConfig(domains=["mock"], train_split="base", val_split=None, task_ids=tasks, compact_rows=True)
    )
    curriculum = TaskCurriculum([f"{r['domain']}/{r['task_id']}" for r in rows], settings.curriculum, seed=0)
    if state is not None:
        curriculum.load_state_dict(state["curriculum"])
    collector = AsyncCollector(settings, rows, curriculum, environment.agent_urls, SAMPLING, start, state)
    run = Run()
    environment.policy.engine.set_weight_version(start)  # the weights served at the start: those of step `start`
    collector.start()
    try:
        for step in range(start, steps):
            groups, results, _ = collector.take(step)
            assert [g.group for g in collector.last_taken] == groups and len(groups) == PROMPTS_PER_STEP
            assert all(r.ok for r in results), [r.error for r in results]
            run.taken.append((step, collector.last_taken))
            time.sleep(train_s[step % len(train_s)] if isinstance(train_s, tuple) else train_s)  # the trainer trains
            before_load()
            with collector.paused(step + 1):
                started = time.monotonic()
                time.sleep(0.02)  # the weights load
                environment.policy.engine.set_weight_version(step + 1)  # and the policy's answers say so
                run.loads.append((started, time.monotonic(), step + 1))
            run.metrics.append(collector.step_metrics())
            run.draws |= {group.draw.draw_id: group.draw.row_index for group in collector.last_taken}
            if step + 1 == snapshot_at:
                run.snapshot = collector.state_dict()
    finally:
        collector.stop()
    return run


@pytest.mark.parametrize("max_age", [1, 2])
def test_a_slow_trainer_trains_no_group_past_the_age_bound_and_the_collector_waits_instead_of_overproducing(
    environment, max_age
):
    """The trainer takes five times as long per step as a step's groups take to generate on this box, as measured
    just before (at least 1 s; a group takes ~0.2 s on an idle box, several times that on a loaded one): the
    collector could produce several steps' worth per step. It fills the steps within the bound and then idles;
    groups are used at exactly the oldest age allowed and none is generated only to be dropped (with in-flight
    updates off, a group finishes before the next weights exist and the bound leaves room to train it, so the drop
    never fires: the buffer's own test covers the drop)."""
    run = _drive(environment, steps=4, train_s=max(1.0, 5 * _generation_s(environment)), max_age=max_age)
    ages = [[group.age_at(step) for group in groups] for step, groups in run.taken]
    # the buffer runs ahead as far as the bound allows: from the first fill on, every group is exactly max_age old
    assert ages == [[min(step, max_age)] * PROMPTS_PER_STEP for step in range(4)], ages
    assert sum(m["train/async/groups_dropped_for_age"] for m in run.metrics) == 0
    assert max(m["train/async/buffer_size"] for m in run.metrics) <= PROMPTS_PER_STEP * (max_age + 1)
    assert all(m["train/async/generation_idle_fraction"] > 0.3 for m in run.metrics[1:]), run.metrics
    assert [m["train/async/trajectory_age_max"] for m in run.metrics] == [min(step, max_age) for step in range(4)]
    draws = [group.draw.draw_id for _, groups in run.taken for group in groups]
    assert len(set(draws)) == len(draws)  # no group trained twice


def _generation_s(environment: Tau2Environment) -> float:
    """How long one step's groups take to generate on this box now: a trainer that trains in no time, one step,
    twice (the first after the stack starts pays its warm-up: 3 s where the second takes 0.3 s, at load 8)."""
    durations = []
    for _ in range(2):
        _, groups = _drive(environment, steps=1, train_s=0.0).taken[0]
        durations.append(max(group.finished_s for group in groups) - min(group.started_s for group in groups))
    return min(durations)


def test_weights_never_load_while_an_episode_runs_and_each_group_carries_the_version_it_used(environment):
    """A trainer that never waits for training: each weight load finds the next step's groups running, so it must
    wait for them (in_flight_weight_updates: false). Every group's episodes run entirely between two loads, and its
    weight version is the number of loads before it started."""
    run = _drive(environment, steps=5, train_s=0.0)
    groups = [group for _, taken in run.taken for group in taken]
    for group in groups:
        overlapping = [load for load in run.loads if load[0] < group.finished_s and group.started_s < load[1]]
        assert not overlapping, (group.draw, group.started_s, group.finished_s, overlapping)
        loads_before = [version for _, end, version in run.loads if end <= group.started_s]
        assert group.weight_version == max(loads_before, default=0), (group.draw, loads_before)
    assert sum(m["train/async/trainer_idle_fraction"] for m in run.metrics) > 0  # it did wait for episodes
    assert any(group.weight_version > 0 for group in groups)


def test_in_flight_updates_reach_running_episodes_whose_turns_say_which_weights_and_late_groups_are_dropped(
    environment,
):
    """in_flight_weight_updates: weight loads no longer wait for running episodes; the turns after a load report the
    new version (read by the agent from the policy server's answers), so a group is as old as its oldest turn. One
    policy turn of one episode is held for 6 s: its group finishes after the trainer has moved on past the bound
    and is dropped, never trained; every group trained is within the bound."""
    hold = FaultSpec(kind="timeout", key_pattern=r"\|create_task_1\|.*\|policy$", hold_s=6.0, count=1)
    environment.policy.engine.control(ControlRequest(faults=[hold]))
    # the policy answers 300 ms after each request, and each load waits until an episode's second policy turn is
    # in that wait, so loads land inside running episodes whatever the box's load (max age 2: at max age 1 the
    # bound lets no group run during a load in the steady state, as the next step's groups need those weights)
    environment.policy.engine.set_latency(300)
    try:
        run = _drive(
            environment, steps=8, train_s=0.05, max_age=2, in_flight=True,
            before_load=_during_a_second_policy_turn(environment, set()),
        )  # fmt: skip
    finally:
        environment.policy.engine.control(ControlRequest(clear_faults=True))
        environment.policy.engine.set_latency(40)
    groups = [(step, group) for step, taken in run.taken for group in taken]
    assert all(group.age_at(step) <= 2 for step, group in groups)  # the bound holds for what trains
    assert sum(m["train/async/groups_dropped_for_age"] for m in run.metrics) >= 1  # the held group's
    spanning = [group for _, group in groups if len(set(group.turn_weight_versions)) > 1]
    assert spanning, [group.turn_weight_versions for _, group in groups]  # loads reached running episodes
    assert sum(m["train/async/groups_spanning_weight_updates"] for m in run.metrics) == len(spanning)
    for _, group in groups:
        for result in group.results:
            versions = turn_weight_versions(result.message_log)
            assert versions == sorted(versions) and len(versions) == len(result.message_log) // 2
        assert group.weight_version == min(group.turn_weight_versions)  # as old as its oldest turn
    overlapping = [
        g for g in spanning if any(g.started_s < end and start < g.finished_s for start, end, _ in run.loads)
    ]
    assert overlapping  # loads happened while they ran, which the default mode never lets happen


def _during_a_second_policy_turn(environment: Tau2Environment, seen: set[str]) -> Callable[[], None]:
    """Wait (up to 3 s) until an episode's second policy turn has reached the policy (which answers 300 ms later,
    reporting the weight version of that moment), its first one answered already."""

    def wait() -> None:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            second = {k for k, n in environment.policy.engine.stats().requests_by_key.items() if n == 2} - seen
            if second:
                seen.update(second)
                return
            time.sleep(0.01)

    return wait


def test_a_resumed_collector_regenerates_the_prompts_not_yet_trained_and_trains_none_twice(environment):
    """A checkpoint after step 2 holds the prompts drawn but not trained (buffered or running); a collector resumed
    from it regenerates those first, under the same group ids, then draws on from the saved curriculum: draw k is
    the same row as in the uninterrupted run, no prompt is trained twice, none is lost."""
    uninterrupted = _drive(environment, steps=5, train_s=0.05, snapshot_at=2)
    before = {draw: row for draw, row in uninterrupted.draws.items() if draw in _trained(uninterrupted, upto=2)}
    pending = uninterrupted.snapshot["async_collector"]["pending_draws"]
    assert pending and not set(before) & {draw for draw, _ in pending}
    resumed = _drive(environment, steps=5, train_s=0.05, start=2, state=uninterrupted.snapshot)
    assert not set(before) & set(resumed.draws)  # nothing trained before the checkpoint is trained again
    first_resumed = [group.draw.draw_id for group in resumed.taken[0][1]]
    assert set(first_resumed) <= {draw for draw, _ in pending}  # the pending prompts go first
    assert all(group.weight_version >= 2 for _, taken in resumed.taken for group in taken)  # regenerated
    both = set(resumed.draws) & set(uninterrupted.draws)
    assert len(both) >= PROMPTS_PER_STEP and all(resumed.draws[d] == uninterrupted.draws[d] for d in both)
    pending_ids = {draw for draw, _ in pending}
    assert set(before) | pending_ids == set(range(uninterrupted.snapshot["async_collector"]["next_draw_id"]))
    assert pending_ids <= set(resumed.draws)  # no prompt lost: each one drawn before the checkpoint trains once


def _trained(run: Run, upto: int) -> set[int]:
    return {group.draw.draw_id for step, taken in run.taken if step < upto for group in taken}


def _versioned(draw_id: int, version: int) -> VersionedGroup:
    return VersionedGroup(PromptDraw(draw_id, 0), version, EpisodeGroup(draw_id))


def test_the_buffer_drops_groups_past_the_bound_and_serves_the_oldest_first():
    buffer = ReplayBuffer()
    for draw_id, version in [(5, 2), (0, 0), (3, 1), (1, 0), (4, 2), (2, 1)]:
        buffer.push(_versioned(draw_id, version))
    taken, stale = buffer.take(2, step=2, max_age=1)  # versions 0 are 2 steps old: dropped, never served
    assert [g.draw.draw_id for g in stale] == [0, 1]
    assert [(g.draw.draw_id, g.weight_version) for g in taken] == [(2, 1), (3, 1)]
    assert buffer.take(3, step=3, max_age=1) == ([], [])  # two left, three wanted: nothing taken
    taken, stale = buffer.take(2, step=3, max_age=1)
    assert [g.draw.draw_id for g in taken] == [4, 5] and not stale and len(buffer) == 0
    with pytest.raises(ValueError, match="before the weights"):
        buffer.push(_versioned(6, 5))
        buffer.take(1, step=4, max_age=1)
