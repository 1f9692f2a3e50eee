"""One episode's POST to an agent replica's ``/run``, bounded: its wall-clock limit, and the replica's loss.

An episode is one long request: the agent answers when the episode is over. Two things end it before that, each as
an infrastructure error that names its cause (status 0: no answer came):

- its wall-clock limit (``env.nemo_gym.episode_timeout_s``, by default the policy turns it may play times
  ``env.nemo_gym.turn_timeout_s``): past it, the episode is over whatever the servers are doing;
- the replica being declared lost by the Gym servers' watcher (:class:`ReplicaHealth`): an agent on a silent node
  (stopped, partitioned) keeps the connection open and never answers, so the head cancels the request itself, within
  ``HEALTH_POLL_S`` of the watcher's verdict.
"""

import asyncio
import time
from typing import Any

import aiohttp
import orjson

from nemo_tau2.gym.model_server.routing import NoLiveReplica, ReplicaRouter
from nemo_tau2.gym.replica_health import ReplicaHealth

HEALTH_POLL_S = 0.5


async def _answer(http: aiohttp.ClientSession, url: str, data: bytes) -> tuple[int, Any]:
    async with http.post(f"{url}/run", data=data, headers={"Content-Type": "application/json"}) as response:
        raw = await response.read()
        try:
            return response.status, orjson.loads(raw)
        except orjson.JSONDecodeError:  # a proxy's page, or an answer cut short
            shown = raw[:200].decode(errors="replace") or "an empty body"
            return response.status, {"error": f"an answer that is not JSON: {shown!r} ({url})"}


async def _declared_lost(health: ReplicaHealth | None, url: str) -> str:
    """Wait until ``url`` is declared lost; its cause (never returns without a health registry)."""
    while True:
        cause = health.cause(url) if health is not None else None
        if cause is not None:
            return cause
        await asyncio.sleep(HEALTH_POLL_S)


async def post_episode(
    http: aiohttp.ClientSession, router: ReplicaRouter, key: str, data: bytes, timeout_s: float
) -> tuple[int, Any]:
    """POST one episode's row to an agent replica: ``(status, body)``, status 0 when no answer came.

    A replica that refuses the connection never got the request: it is set aside and the next one is tried. One
    that drops the connection mid-episode (lost with its node) is set aside too, and the episode is an
    infrastructure error: it cannot be resumed elsewhere. So is one the watcher declares lost, and one past
    ``timeout_s`` (the whole episode's, every try included)."""
    refused: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    for _ in router.urls:  # each replica at most once
        try:
            with router.call(key) as url:
                answer = await _bounded(http, router, url, data, deadline, timeout_s)
        except NoLiveReplica as e:
            return 0, {"error": f"no agent replica left: {e}"}
        except aiohttp.ClientConnectorError as e:  # never reached the replica: safe to send elsewhere
            router.unreachable(url)
            refused = {"error": f"{type(e).__name__}: {e}"}
            continue
        except (aiohttp.ClientError, TimeoutError) as e:
            if isinstance(e, aiohttp.ClientConnectionError):
                router.unreachable(url)
            return 0, {"error": f"{type(e).__name__}: {e} ({url})"}
        return answer
    return 0, refused


async def _bounded(
    http: aiohttp.ClientSession, router: ReplicaRouter, url: str, data: bytes, deadline: float, timeout_s: float
) -> tuple[int, Any]:
    """The replica's answer, unless it is declared lost or the episode's deadline passes first."""
    request = asyncio.ensure_future(_answer(http, url, data))
    lost = asyncio.ensure_future(_declared_lost(router.health, url))
    try:
        done, _ = await asyncio.wait(
            {request, lost}, timeout=max(0.0, deadline - time.monotonic()), return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for task in (request, lost):
            task.cancel()
    if request in done:
        return request.result()
    if lost in done:
        return 0, {"error": f"the agent replica {url} was declared lost mid-episode: {lost.result()}"}
    return 0, {
        "error": f"the episode passed its wall-clock limit of {timeout_s:g} s on {url} "
        "(env.nemo_gym.episode_timeout_s, by default max turns x env.nemo_gym.turn_timeout_s)"
    }
