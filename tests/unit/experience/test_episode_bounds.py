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


async def _serve(routes: dict[str, object]) -> tuple[web.AppRunner, str]:
    """One server on 127.0.0.1 whose ``/<name>/run`` is each handler: the base URL, each agent being base + /name."""
    app = web.Application()
    for name, handler in routes.items():
        app.router.add_post(f"/{name}/run", handler)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


def _run_on(routes: dict[str, object], check) -> None:
    async def main() -> None:
        runner, base = await _serve(routes)
        try:
            async with aiohttp.ClientSession() as http:
                await asyncio.wait_for(check(http, base), timeout=20)
        finally:
            await runner.cleanup()

    asyncio.run(main())


async def _answer_ok(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def _run(check) -> None:
    """Two agents on one server, each call counted: ``/answering/run`` answers at once, ``/silent/run`` never does."""
    hits = {"answering": 0, "silent": 0}

    async def answering(request: web.Request) -> web.Response:
        hits["answering"] += 1
        return await _answer_ok(request)

    async def silent(request: web.Request) -> web.Response:
        hits["silent"] += 1
        await asyncio.sleep(3600)
        return web.json_response({})

    async def with_agents(http, base: str) -> None:
        await check(http, f"{base}/answering", f"{base}/silent", hits)

    _run_on({"answering": answering, "silent": silent}, with_agents)


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


async def _drop_connection(request: web.Request) -> web.Response:
    """An agent whose process dies mid-episode: the connection closes with no answer."""
    request.transport.close()
    await asyncio.sleep(3600)
    return web.json_response({})


async def _cut_short(request: web.Request) -> web.StreamResponse:
    """An answer that promises 1000 bytes and stops after 2: not a lost connection but a broken answer."""
    response = web.StreamResponse(status=200, headers={"Content-Length": "1000", "Content-Type": "application/json"})
    await response.prepare(request)
    await response.write(b'{"')
    request.transport.close()
    return response


def test_an_answer_that_is_not_json_is_an_error_that_shows_it():
    async def proxy_page(request: web.Request) -> web.Response:
        return web.Response(status=502, text="<html>Bad Gateway</html>", content_type="text/html")

    async def check(http, base):
        url = f"{base}/proxied"
        status, body = await post_episode(http, ReplicaRouter([url]), "0", b"{}", timeout_s=600)
        assert status == 502
        assert body == {"error": f"an answer that is not JSON: '<html>Bad Gateway</html>' ({url})",
                        "cause": "an answer that is not JSON: '<html>Bad Gateway</html>'"}  # fmt: skip

    _run_on({"proxied": proxy_page}, check)


def test_a_replica_that_drops_the_connection_mid_episode_is_named_by_the_watchers_verdict_or_else_as_dropped():
    """Watched (detection_s > 0), the episode waits for the watcher's verdict on the replica and names its cause;
    with no verdict within the detection time, or nothing watching (local runs), it names the dropped connection.
    Either way the replica gets no new episode for a while (another replica is there)."""

    async def check(http, base):
        dropping, answering = f"{base}/dropping", f"{base}/answering"
        health = ReplicaHealth(detection_s=5.0)
        router = ReplicaRouter([dropping, answering], health=health)
        episode = asyncio.create_task(post_episode(http, router, "0", b"{}", timeout_s=600))
        await asyncio.sleep(0.3)  # the connection is gone; the episode waits for the verdict
        assert not episode.done()
        where = f"tau2_agent_0 at {dropping} on 127.0.0.1"
        health.mark_lost(dropping, ServerLoss("its node's raylet stopped answering", where))
        status, body = await episode
        assert status == 0 and body["cause"] == (
            "the agent replica was declared lost mid-episode: its node's raylet stopped answering; "
            "the episode was dropped"
        )
        assert body["error"] == f"{body['cause']} ({dropping}; {where})"

        for health in (ReplicaHealth(detection_s=0.5), ReplicaHealth()):  # no verdict comes; nothing watches
            began = time.monotonic()
            router = ReplicaRouter([dropping, answering], health=health)
            status, body = await post_episode(http, router, "0", b"{}", timeout_s=600)
            assert status == 0 and body["error"].endswith(f" ({dropping})"), body
            assert "disconnected" in body["cause"].lower(), body
            assert time.monotonic() - began < 0.5 + 1.0 + 5  # the detection time and a poll, never the episode's
            assert await post_episode(http, router, "1", b"{}", timeout_s=600) == (200, {"status": "ok"})

    _run_on({"dropping": _drop_connection, "answering": _answer_ok}, check)


def test_an_answer_cut_short_is_an_error_of_that_replica_with_no_wait_for_a_verdict():
    async def check(http, base):
        url = f"{base}/cut"
        health = ReplicaHealth(detection_s=30.0)  # a lost connection would wait up to this for the verdict
        began = time.monotonic()
        status, body = await post_episode(http, ReplicaRouter([url], health=health), "0", b"{}", timeout_s=600)
        assert time.monotonic() - began < 5
        assert status == 0 and body["error"].endswith(f" ({url})") and "payload" in body["cause"].lower(), body

    _run_on({"cut": _cut_short}, check)


def test_a_replica_that_refuses_the_connection_never_got_the_episode_which_goes_to_the_next():
    async def check(http, base):
        refusing = "http://127.0.0.1:9/agent"  # nothing listens on the discard port
        answering = f"{base}/answering"
        answered = await post_episode(http, ReplicaRouter([refusing, answering]), "0", b"{}", 600)
        assert answered == (200, {"status": "ok"})
        status, body = await post_episode(http, ReplicaRouter([refusing]), "0", b"{}", 600)
        assert status == 0 and body["error"].endswith(f" ({refusing})") and "connect" in body["cause"].lower(), body

    _run_on({"answering": _answer_ok}, check)


def test_an_agent_whose_resources_replica_was_declared_lost_names_that_loss():
    """The agent answers 502 naming the server it could not reach (its resources replica, mostly): once the watcher
    declares that server lost, the episode is an infrastructure error naming the loss, the agent's answer kept."""
    resources = "http://127.0.0.1:9/resources_1"

    async def agent(request: web.Request) -> web.Response:
        answer = {"error": "the resources server did not answer", "unreachable": resources}
        return web.json_response(answer, status=502)

    async def check(http, base):
        url = f"{base}/agent"
        health = ReplicaHealth(detection_s=5.0)
        health.mark_lost(resources, ServerLoss("its resources server's node was removed", "tau2_resources_1"))
        status, body = await post_episode(http, ReplicaRouter([url], health=health), "0", b"{}", timeout_s=600)
        assert status == 0 and body["unreachable"] == resources
        assert body["cause"] == (
            "the agent replica lost a server mid-episode: its resources server's node was removed; "
            "the episode was dropped"
        )
        assert body["error"] == f"{body['cause']} ({url}; tau2_resources_1)"
        # with no verdict on that server, the agent's 502 is the answer
        status, body = await post_episode(http, ReplicaRouter([url]), "1", b"{}", timeout_s=600)
        assert status == 502 and body["unreachable"] == resources

    _run_on({"agent": agent}, check)


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
