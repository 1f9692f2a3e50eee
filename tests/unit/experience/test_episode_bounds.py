"""An episode's POST to an agent's ``/run`` is bounded: a replica declared lost ends its episodes at once and gets no
new ones, an episode past its wall-clock limit ends saying so, and the keys that set these bounds are checked.

The agents here are real HTTP servers on 127.0.0.1 that play no episode: one answers at once, one never answers (a
stopped agent keeps its port open and says nothing), which is all these bounds depend on.
"""

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from nemo_tau2.config import ConfigError, apply_overrides, load_config
from nemo_tau2.evals.eval import setup_eval
from nemo_tau2.experience.episode_post import post_episode
from nemo_tau2.gym.episode_config import NemoGymEnvConfig
from nemo_tau2.gym.model_server.routing import ReplicaRouter
from nemo_tau2.gym.replica_health import ReplicaHealth, ServerLoss

EVAL_FAKE = Path(__file__).parents[3] / "examples" / "configs" / "evals" / "tau2_fake.yaml"


async def _agents(hits: dict[str, int]) -> tuple[web.AppRunner, str, str]:
    """Two agents on one server: ``/answering/run`` answers at once, ``/silent/run`` never does."""

    async def answering(request: web.Request) -> web.Response:
        hits["answering"] += 1
        return web.json_response({"status": "ok"})

    async def silent(request: web.Request) -> web.Response:
        hits["silent"] += 1
        await asyncio.sleep(3600)
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/answering/run", answering)
    app.router.add_post("/silent/run", silent)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}/answering", f"http://127.0.0.1:{port}/silent"


def _run(check) -> None:
    async def main() -> None:
        hits = {"answering": 0, "silent": 0}
        runner, answering, silent = await _agents(hits)
        try:
            async with aiohttp.ClientSession() as http:
                await asyncio.wait_for(check(http, answering, silent, hits), timeout=20)
        finally:
            await runner.cleanup()

    asyncio.run(main())


def test_an_episode_on_a_replica_declared_lost_ends_within_a_second_naming_the_cause():
    async def check(http, answering, silent, hits):
        health = ReplicaHealth()
        router = ReplicaRouter([silent], health=health)
        episode = asyncio.create_task(post_episode(http, router, "0", b"{}", timeout_s=600))
        while hits["silent"] < 1:  # however long the request takes to arrive (the check's own limit is 20 s)
            await asyncio.sleep(0.05)
        assert hits["silent"] == 1 and not episode.done()  # in flight, unanswered
        declared = time.monotonic()
        where = f"tau2_agent_1 at {silent} on 127.0.0.1"
        health.mark_lost(silent, ServerLoss("its agent did not answer 3 health probes in a row (5 s each)", where))
        status, body = await episode
        assert time.monotonic() - declared < 1.5
        assert status == 0
        assert body["cause"] == (
            "the agent replica was declared lost mid-episode: its agent did not answer 3 health probes in a row "
            "(5 s each); the episode was dropped"
        )
        assert body["error"] == f"{body['cause']} ({silent}; {where})"

    _run(check)


def test_new_episodes_go_to_live_replicas_only_and_none_is_left_when_all_are_lost():
    async def check(http, answering, silent, hits):
        health = ReplicaHealth()
        health.mark_lost(silent, ServerLoss("its agent was on a node Ray marked dead", "tau2_agent_1"))
        router = ReplicaRouter([silent, answering], health=health)
        answers = await asyncio.gather(*(post_episode(http, router, str(i), b"{}", 600) for i in range(6)))
        assert answers == [(200, {"status": "ok"})] * 6
        assert hits == {"answering": 6, "silent": 0}
        health.mark_lost(answering, ServerLoss("its model server lost its node's launcher actor", "policy_model"))
        status, body = await post_episode(http, router, "6", b"{}", 600)
        assert status == 0 and body["cause"] == (
            "no agent replica left: every replica was declared lost: its agent was on a node Ray marked dead; its "
            "model server lost its node's launcher actor; the episode was dropped"
        )
        assert body["error"].endswith("(tau2_agent_1; policy_model)")

    _run(check)


def test_an_episode_past_its_wall_clock_limit_is_an_infrastructure_error_that_says_so():
    async def check(http, answering, silent, hits):
        began = time.monotonic()
        status, body = await post_episode(http, ReplicaRouter([silent]), "0", b"{}", timeout_s=1.0)
        assert 1.0 <= time.monotonic() - began < 2.5
        assert status == 0 and body["cause"].startswith("the episode passed its wall-clock limit of 1 s (")
        assert body["cause"].endswith("; the episode was dropped") and body["error"].endswith(f" ({silent})")

    _run(check)


def test_the_episode_limit_is_max_turns_times_the_turn_budget_unless_set():
    assert NemoGymEnvConfig().episode_limit_s() == 200 * 30.0  # max_steps bounds the policy turns
    assert NemoGymEnvConfig(max_turns=10, turn_timeout_s=12).episode_limit_s() == 120.0
    assert NemoGymEnvConfig(max_turns=10, episode_timeout_s=50).episode_limit_s() == 50.0


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("++env.nemo_gym.episode_timeout_s=inf", "env.nemo_gym.episode_timeout_s"),
        ("++env.nemo_gym.turn_timeout_s=0", "env.nemo_gym.turn_timeout_s"),
        ("++env.nemo_gym.resources_retry.timeout_s=inf", "env.nemo_gym.resources_retry.timeout_s"),
        ("++cluster.gym_health_timeout_s=-1", "cluster.gym_health_timeout_s"),
        ("++cluster.gym_health_failures=0", "cluster.gym_health_failures"),
        ("++cluster.gym_server_restart=1", "cluster.gym_server_restart"),  # a misspelt key
        ("++cluster.gym_health_interval_s=30,++cluster.gym_health_failures=10", "cluster"),  # 350 s of silence
    ],
)
def test_a_bad_or_unknown_bound_is_refused_in_one_line_naming_its_key(override, key):
    with pytest.raises(ConfigError) as refused:
        setup_eval(apply_overrides(load_config(EVAL_FAKE), override.split(",")))
    (problem,) = refused.value.problems
    assert key in problem and "\n" not in problem
