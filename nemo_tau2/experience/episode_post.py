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

from nemo_tau2.gym.http_client import exception_cause
from nemo_tau2.gym.model_server.routing import NoLiveReplica, ReplicaRouter
from nemo_tau2.gym.replica_health import ReplicaHealth, ServerLoss

HEALTH_POLL_S = 0.5


DROPPED = "the episode was dropped"


def _failed(cause: str, where: str) -> tuple[int, dict[str, str]]:
    """No answer: status 0, the error with where it happened, and its cause without."""
    return 0, {"error": f"{cause} ({where})", "cause": cause}


async def _answer(http: aiohttp.ClientSession, url: str, data: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    async with http.post(f"{url}/run", data=data, headers={"Content-Type": "application/json", **headers}) as response:
        raw = await response.read()
        try:
            return response.status, orjson.loads(raw)
        except orjson.JSONDecodeError:  # a proxy's page, or an answer cut short
            shown = raw[:200].decode(errors="replace") or "an empty body"
            return response.status, {"error": f"an answer that is not JSON: {shown!r} ({url})",
                                     "cause": f"an answer that is not JSON: {shown!r}"}  # fmt: skip


async def _declared_lost(health: ReplicaHealth | None, url: str) -> ServerLoss:
    """Wait until ``url`` is declared lost; its cause (never returns without a health registry)."""
    while True:
        loss = health.cause(url) if health is not None else None
        if loss is not None:
            return loss
        await asyncio.sleep(HEALTH_POLL_S)


def _lost_mid_episode(url: str, loss: ServerLoss) -> tuple[int, dict[str, str]]:
    return _failed(f"the agent replica was declared lost mid-episode: {loss.cause}; {DROPPED}", f"{url}; {loss.where}")


async def _loss_behind(health: ReplicaHealth | None, url: str) -> ServerLoss | None:
    """A replica that went away (its server answered that it is stopping, or dropped the connection) is being lost
    with its node, most likely: the watcher's verdict, if it comes within its detection time, says how."""
    if health is None or health.detection_s <= 0:
        return None
    try:
        return await asyncio.wait_for(_declared_lost(health, url), timeout=health.detection_s + HEALTH_POLL_S)
    except TimeoutError:
        return None


async def post_episode(
    http: aiohttp.ClientSession,
    router: ReplicaRouter,
    key: str,
    data: bytes,
    timeout_s: float,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """POST one episode's row to an agent replica: ``(status, body)``, status 0 when no answer came; a failure's
    body has ``error`` (with where) and ``cause`` (without).

    A replica that refuses the connection never got the request: it is set aside and the next one is tried. One
    that drops the connection mid-episode, or answers that it is stopping (lost with its node), is set aside too,
    and the episode is an infrastructure error naming the loss once the watcher declares it (it cannot be resumed
    elsewhere). So is one the watcher declares lost, and one past ``timeout_s`` (the whole episode's, every try
    included)."""
    refused: tuple[int, Any] = (0, {})
    deadline = time.monotonic() + timeout_s
    for _ in router.urls:  # each replica at most once
        try:
            with router.call(key) as url:
                status, answer = await _bounded(http, router, url, data, deadline, timeout_s, headers or {})
        except NoLiveReplica as e:
            return 0, {"error": f"no agent replica left: {e}", "cause": f"no agent replica left: {e.cause}; {DROPPED}"}
        except aiohttp.ClientConnectorError as e:  # never reached the replica: safe to send elsewhere
            router.unreachable(url)
            refused = _failed(exception_cause(e), url)
            continue
        except (aiohttp.ClientError, TimeoutError) as e:
            if not isinstance(e, aiohttp.ClientConnectionError):
                return _failed(exception_cause(e), url)
            router.unreachable(url)
            loss = await _loss_behind(router.health, url)
            return _lost_mid_episode(url, loss) if loss else _failed(exception_cause(e), url)
        if status == 503 and (loss := await _loss_behind(router.health, url)) is not None:
            return _lost_mid_episode(url, loss)
        gone = answer.get("unreachable") if status == 502 and isinstance(answer, dict) else None
        if gone and (loss := await _loss_behind(router.health, gone)) is not None:  # its resources replica, mostly
            cause = f"the agent replica lost a server mid-episode: {loss.cause}; {DROPPED}"
            return 0, answer | _failed(cause, f"{url}; {loss.where}")[1]
        return status, answer
    return refused


async def _bounded(
    http: aiohttp.ClientSession,
    router: ReplicaRouter,
    url: str,
    data: bytes,
    deadline: float,
    timeout_s: float,
    headers: dict[str, str],
) -> tuple[int, Any]:
    """The replica's answer, unless it is declared lost or the episode's deadline passes first."""
    request = asyncio.ensure_future(_answer(http, url, data, headers))
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
        return _lost_mid_episode(url, lost.result())
    return _failed(
        f"the episode passed its wall-clock limit of {timeout_s:g} s (env.nemo_gym.episode_timeout_s, by default max "
        f"turns x env.nemo_gym.turn_timeout_s); {DROPPED}",
        url,
    )
