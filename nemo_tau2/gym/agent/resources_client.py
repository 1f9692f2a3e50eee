"""The tau2 session of an episode on a running resources server, over HTTP (the agent server's way).

Each episode has its own NeMo-Gym session (cookie) on the server; one pooled client serves every episode. Failures
after retries raise :class:`InfrastructureError`; a tool's own error is a valid answer (``X-Tau2-Tool-Error``).

Retries are safe: every request carries an ``Idempotency-Key`` of its own (the episode's key and a request counter),
the same on each retry, so the server answers a retried write from its record instead of applying it again
(``nemo_tau2/gym/resources_server/replay.py``). A row the server refuses at ``/seed_session`` (unknown domain or task,
invalid fields) is the caller's :class:`RowError`; tool arguments it refuses (too large, nested too deep) are the
model's mistake, a tool error.

With several resources replicas, each episode lives on one (:class:`ReplicaRouter`'s sticky routing, the model
server's mechanism: new episodes to the replica with the fewest running). A replica that cannot be reached gets no
new episodes for a while; an episode whose replica is lost mid-way is an infrastructure error (its database was
there), and one whose seeding finds its replica gone is seeded on another (nothing was started on the lost one).
"""

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nemo_tau2.gym.agent.conversation import EpisodeState, RowError, final_response
from nemo_tau2.gym.agent.episode_record import TRAJECTORY_KEY, trajectory_metadata
from nemo_tau2.gym.agent.tool_calls import REFUSED_CALL_ANSWER
from nemo_tau2.gym.agent.turns import without_token_ids
from nemo_tau2.gym.http_client import GymHttpClient, InfrastructureError, JsonResponse, RetryConfig
from nemo_tau2.gym.model_server.routing import ReplicaRouter

logger = logging.getLogger(__name__)

TOOL_ERROR_HEADER = "x-tau2-tool-error"  # lower case: JsonResponse.headers
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
PIVOT_KEY = "expected_action"  # a row holding it is a pivot (NeMo-Gym's pivot row contract): one turn, /verify_pivot
PIVOT_TERMINATION = "pivot_turn"  # a pivot episode's end: its one policy turn was taken
PIVOT_ROW_ONLY = frozenset({TRAJECTORY_KEY, "turn", "source_reward"})
PIVOT_NOT_FORKED = frozenset({"responses_create_params", "expected_action", "turn"})  # /fork's turn is another turn
PIVOT_CONTINUED = "continued"  # a text pivot played on (pivot_text_reward: continue): tau2's reward
PIVOT_NO_COMPONENTS = (
    "db_match",
    "action_match_fraction",
    "write_action_match_fraction",
    "env_assertion_fraction",
    "communicate_fraction",
)  # tau2's reward components: a pivot's reward is the functional verdict


class HttpTau2Session:
    """:class:`~nemo_tau2.gym.agent.conversation.Tau2Session` on the resources server replicas at ``urls``."""

    def __init__(self, http: GymHttpClient, urls: list[str], retry: RetryConfig):
        self.http = http
        self.router = ReplicaRouter(urls)
        self.retry = retry

    @contextmanager
    def placed(self, state: EpisodeState) -> Iterator[None]:
        """Hold the episode on one replica while it runs (counted there as running, for balancing)."""
        with self.router.call(state.request_key) as url:
            state.resources_url = url
            yield

    async def seed(self, state: EpisodeState) -> None:
        seed_body = {key: value for key, value in state.row.items() if key != "responses_create_params"}
        state.resources_url = state.resources_url or self.router.route(state.request_key)  # unless placed()
        try:
            response = await self._post(state, "/seed_session", seed_body, "seeding the tau2 session")
        except InfrastructureError as e:
            if not e.unreachable or len(self.router.urls) == 1:
                raise
            state.resources_url = self.router.route(state.request_key)  # _post set the lost replica aside
            logger.warning("seeding on %s instead: %s", state.resources_url, e)
            response = await self._post(state, "/seed_session", seed_body, "seeding the tau2 session")
        if response.status in (400, 404, 422):
            raise RowError(f"the resources server refused the row at /seed_session: {response.text[:500]}")
        if response.status != 200:
            raise response.failure("/seed_session")
        state.user_system_prompt = response.body["user_system_prompt"]
        state.user_tools = response.body["user_tools"]
        state.tau2_version = response.body.get("tau2_version", "v0.2.1")
        state.retrieval_variant = response.body.get("retrieval_variant")

    async def call_tool(
        self, state: EpisodeState, name: str, arguments: dict, requestor: str, call_id: str
    ) -> tuple[str, bool]:
        prefix = "" if requestor == "assistant" else "/user_tools"
        response = await self._post(
            state,
            f"{prefix}/{name}",
            arguments,
            f"tool call {name}",
            headers={"X-Tool-Call-Id": call_id},
            expect_json=False,
        )
        if response.status in (400, 413):  # the body was the model's arguments: its mistake
            return f"{REFUSED_CALL_ANSWER}: {_detail(response)}", True
        if response.status != 200:
            raise response.failure(f"tool route /{name}")
        return response.text, response.headers.get(TOOL_ERROR_HEADER) == "1"

    @staticmethod
    def verify_body(state: EpisodeState) -> tuple[dict, dict]:
        """A verify request for the episode, and its whole response object (token ids included).

        The row's fields go back in the answer (NeMo-Gym's convention), except its collector's private keys
        (NeMo-RL's _rowidx, NeMo-Gym's _ng_*): the collector holds the row and stamps what it needs on the result,
        and NeMo-RL would log each number among them as a metric. The reward needs no token ids: the transcript is
        verified without them (a fraction of the bytes), and the caller puts the full output back into the answer."""
        extras = {key: value for key, value in state.row.items() if key[:1] != "_"}
        del extras["responses_create_params"]
        response_object = final_response(state)
        body = extras | {
            "responses_create_params": state.row["responses_create_params"],
            "response": response_object | {"output": [without_token_ids(item) for item in state.outputs]},
        }
        return body, response_object

    async def verify(self, state: EpisodeState) -> dict:
        body, response_object = self.verify_body(state)
        body["termination_reason"] = state.termination_reason
        if state.tau2_version not in (None, "v0.2.1"):  # a release in its own worker scores tau2's own trajectory
            # (v0.2.1's live verdict reads the live episode: its body stays small, and a call the servers refused,
            # arguments nested past max_json_depth, stays a tool error instead of making /verify a 400)
            body["tau2_messages"] = state.tau2_messages
        response = await self._post(state, "/verify", body, "verifying the episode")
        if response.status != 200:
            raise response.failure("/verify")
        # the stored rollout's response carries the trajectory: a re-scoring from the row and response alone has it
        metadata = trajectory_metadata(state.tau2_messages, state.termination_reason)
        response.body["response"] = response_object | {"metadata": metadata}
        if response.body.get("tau2_messages") is None:  # the record keeps the trajectory on every release
            response.body["tau2_messages"] = state.tau2_messages
        return response.body

    async def verify_pivot(self, state: EpisodeState) -> dict:
        """The pivot turn's functional verdict; the answer in a scored episode's shape (``success``: reward 1, no
        tau2 reward components), with the policy's output (token ids included) as its ``response``."""
        body, response_object = self.verify_body(state)
        state.resources_url = state.resources_url or self.router.route(state.request_key)
        response = await self._post(state, "/verify_pivot", body, "verifying the pivot turn")
        if response.status in (400, 404, 422):
            raise RowError(f"the resources server refused the pivot at /verify_pivot: {response.text[:500]}")
        if response.status != 200:
            raise response.failure("/verify_pivot")
        # the row's prefix, and its numeric provenance (NeMo-RL logs every number of the answer as a metric)
        answer = {key: value for key, value in response.body.items() if key not in PIVOT_ROW_ONLY}
        state.verified = True
        return answer | dict.fromkeys(PIVOT_NO_COMPONENTS) | {
            "response": response_object, "success": answer["reward"] == 1.0, "num_tool_calls": 0,
            "num_tool_errors": 0, "reward_info": {"pivot": {key: answer.get(key) for key in ("category", "detail")}},
        }  # fmt: skip

    async def fork_prefix(self, state: EpisodeState) -> None:
        """Make this episode's session a fork of the pivot row's state (its task with the prefix ``tau2_messages``
        replayed on the server, ``POST /fork``), adopted by the episode's cookie (``/adopt_fork``); set the user's
        prompt and tools as seeding does. A prefix the server cannot replay is the row's :class:`RowError`."""
        body = {key: value for key, value in state.row.items() if key[:1] != "_" and key not in PIVOT_NOT_FORKED}
        state.resources_url = state.resources_url or self.router.route(state.request_key)
        response = await self._post(state, "/fork", body | {"n": 1, "turn": None}, "forking the pivot's state")
        if response.status in (400, 404, 422):
            raise RowError(f"the resources server refused the pivot's prefix at /fork: {response.text[:500]}")
        if response.status != 200:
            raise response.failure("/fork")
        fork_id = response.body["fork_ids"][0]
        adopted = await self._post(state, "/adopt_fork", {"fork_id": fork_id}, "adopting the pivot's fork")
        if adopted.status != 200:
            raise adopted.failure("/adopt_fork")
        state.user_system_prompt = response.body["user_system_prompt"]
        state.user_tools = response.body["user_tools"]

    async def end(self, state: EpisodeState) -> None:
        if not state.cookies["resources"]:
            return
        try:
            await self.http.post(
                state.resources_url + "/end_session",
                {},
                RetryConfig(timeout_s=10, max_attempts=1),
                cookies=state.cookies["resources"],
                what="ending the session",
            )
        except InfrastructureError as e:
            logger.info("could not end the failed episode's session (it will expire): %s", e)

    async def _post(
        self, state: EpisodeState, path: str, payload: Any, what: str, headers: dict | None = None, **kwargs
    ) -> JsonResponse:
        """POST under a fresh idempotency key, kept by every retry of this request."""
        state.resource_requests += 1
        key = f"{state.request_key}-{state.resource_requests}"
        try:
            response = await self.http.post(
                state.resources_url + path,
                payload,
                self.retry,
                cookies=state.cookies["resources"],
                headers={IDEMPOTENCY_KEY_HEADER: key, **(headers or {})},
                what=what,
                **kwargs,
            )
        except InfrastructureError as e:
            if e.unreachable:
                self.router.unreachable(state.resources_url)
            raise
        state.cookies["resources"] = response.cookies or state.cookies["resources"]
        return response


def _detail(response: JsonResponse) -> str:
    body = response.body
    return str(body.get("detail") if isinstance(body, dict) and "detail" in body else response.text[:500])
