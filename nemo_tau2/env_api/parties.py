"""The two parties an environment episode needs besides the policy, in process or on running Gym servers.

- the tau2 session: :class:`LocalTau2Session` runs the resources server's own session code
  (:func:`~nemo_tau2.gym.resources_server.in_process.start_episode`, ``Episode.call_tool``,
  :func:`~nemo_tau2.gym.resources_server.in_process.score_episode`) in this process; :class:`ReleaseTau2Session`
  the server's code for a release in its own environment (v1.0.1, through its workers); the agent server's
  :class:`~nemo_tau2.gym.agent.resources_client.HttpTau2Session` talks to a running resources server;
- the user model: :class:`EndpointUserModel` sends the user simulator's Responses requests to an OpenAI-compatible
  endpoint through ``fast_vllm_model``'s request path (:class:`~nemo_tau2.gym.model_server.endpoint.ChatEndpoint`)
  without a model server; :class:`GymUserModel` posts them to a running Gym model server, as the agent does.
"""

import asyncio
import time
from dataclasses import dataclass

from nemo_tau2.generation.launch import GenerationHandle
from nemo_tau2.gym.agent.conversation import EpisodeState, RowError
from nemo_tau2.gym.agent.orchestrator import post_model
from nemo_tau2.gym.http_client import RETRYABLE_STATUSES, GymHttpClient, InfrastructureError, RetryConfig
from nemo_tau2.gym.model_server.app import FastVLLMModelConfig
from nemo_tau2.gym.model_server.conversion import BadRequest
from nemo_tau2.gym.model_server.endpoint import ChatEndpoint, EndpointError
from nemo_tau2.gym.model_server.routing import ReplicaRouter
from nemo_tau2.gym.resources_server.in_process import call_tool, score_episode, start_episode
from nemo_tau2.gym.resources_server.release import WorkerEpisode, WorkerRelease
from nemo_tau2.gym.stack import USER_MODEL, ModelEndpoint, model_server_spec
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.episode import Episode
from nemo_tau2.tau2_release.client import Tau2JudgeError, Tau2RequestError, Tau2WorkerError


@dataclass
class GymServerUrls:
    """Running Gym servers an environment plays against instead of in process (``http://host:port`` each)."""

    resources_server: str
    user_model_server: str


class LocalTau2Session:
    """One episode's tau2 environment in this process: the resources server's session code, no HTTP.

    The server's rules hold here too: the episode ends only once its verdict is built (a verify that fails can be
    retried), and a repeated verify gets the first verdict, never a second scoring.
    """

    def __init__(self) -> None:
        self.episode: Episode | None = None
        self.verdict: dict | None = None

    async def seed(self, state: EpisodeState) -> None:
        try:
            episode, answer = start_episode(state.domain, state.task_id)
        except (domains.UnknownDomainError, domains.UnknownTaskError) as e:
            raise RowError(str(e)) from e
        self.episode, self.verdict = episode, None
        state.tau2_version = "v0.2.1"
        state.user_system_prompt = answer["user_system_prompt"]
        state.user_tools = answer["user_tools"]

    async def call_tool(
        self, state: EpisodeState, name: str, arguments: dict, requestor: str, call_id: str
    ) -> tuple[str, bool]:
        message = call_tool(self._episode(), name, arguments, requestor, call_id)
        return message.content or "", bool(message.error)

    async def verify(self, state: EpisodeState) -> dict:
        if self.verdict is None:
            self.verdict = score_episode(self._episode(), state.row_input() + state.outputs, state.termination_reason)
            self.episode = None
        return dict(self.verdict)

    async def end(self, state: EpisodeState) -> None:
        self.episode = None

    def fork(self, n: int) -> list["LocalTau2Session"]:
        """``n`` sessions in this one's state, each its own episode (:meth:`Episode.fork`)."""
        forks = [LocalTau2Session() for _ in range(n)]
        for session, episode in zip(forks, self._episode().fork(n), strict=True):
            session.episode = episode
        return forks

    def _episode(self) -> Episode:
        if self.episode is None:
            raise RuntimeError("no live tau2 episode in this session (seed it first)")
        return self.episode


class ReleaseTau2Session:
    """One episode of a tau2 release that runs in its own environment (v1.0.1), through the resources server's own
    release code (:class:`~nemo_tau2.gym.resources_server.release.WorkerRelease`: seeds and tool calls in its
    episode worker, the verdict from its scoring worker, off the event loop). The same rules as the local session."""

    def __init__(self, release: WorkerRelease) -> None:
        self.release = release
        self.episode: WorkerEpisode | None = None
        self.verdict: dict | None = None

    async def seed(self, state: EpisodeState) -> None:
        try:
            episode, answer = self.release.start_episode(state.domain, state.task_id)
        except Tau2RequestError as e:
            raise RowError(str(e)) from e
        self.episode, self.verdict = episode, None
        state.tau2_version = answer["tau2_version"]
        state.retrieval_variant = answer.get("retrieval_variant")
        state.user_system_prompt = answer["user_system_prompt"]
        state.user_tools = answer["user_tools"]

    async def call_tool(
        self, state: EpisodeState, name: str, arguments: dict, requestor: str, call_id: str
    ) -> tuple[str, bool]:
        message = self._episode().call_tool(name, arguments, requestor, call_id)
        return message.content, message.error

    async def verify(self, state: EpisodeState) -> dict:
        if self.verdict is None:
            try:
                self.verdict = await asyncio.to_thread(
                    self.release.score_episode, self._episode(), state.tau2_messages, state.termination_reason
                )
            except (Tau2JudgeError, Tau2WorkerError) as e:
                raise InfrastructureError(f"tau2 {self.release.version} could not score the episode: {e}") from e
            self.episode.close()
            self.episode = None
        return dict(self.verdict)

    async def end(self, state: EpisodeState) -> None:
        if self.episode is not None:
            self.episode.close()
        self.episode = None

    def fork(self, n: int) -> list["ReleaseTau2Session"]:
        """``n`` sessions in this one's state, each its own episode in the release's worker (``WorkerEpisode.fork``;
        a fork the worker refuses raises ``Tau2RequestError``, a ``ValueError``)."""
        forks = [ReleaseTau2Session(self.release) for _ in range(n)]
        for session, episode in zip(forks, self._episode().fork(n), strict=True):
            session.episode = episode
        return forks

    def _episode(self) -> WorkerEpisode:
        if self.episode is None:
            raise RuntimeError("no live tau2 episode in this session (seed it first)")
        return self.episode


class EndpointUserModel:
    """The user model's endpoint called in process, as the agent's ``fast_vllm_model`` user server would call it."""

    def __init__(self, handle: GenerationHandle, http: GymHttpClient, retry: RetryConfig):
        spec = model_server_spec(USER_MODEL, ModelEndpoint(handle.base_urls, handle.model_name, handle.api_key))
        config = FastVLLMModelConfig.model_validate(
            spec.config | {"name": USER_MODEL, "host": "127.0.0.1", "port": 0, "entrypoint": "app.py"}
        )
        # one replica per episode (its prefix cache), chosen as the model server chooses per session
        self.router = ReplicaRouter(handle.base_urls, config.replica_routing, config.replica_retry_after_s)
        self.endpoint = ChatEndpoint(config, http, retry, retry_statuses=RETRYABLE_STATUSES)

    async def __call__(self, state: EpisodeState, body: dict) -> dict:
        started = time.perf_counter()
        with self.router.call(state.conversation_id) as base_url:
            try:
                return await self.endpoint.responses(body, base_url)
            except (BadRequest, EndpointError) as e:
                raise InfrastructureError(f"user simulator call failed: {e}") from e
            except InfrastructureError as e:
                if e.unreachable:
                    self.router.unreachable(base_url)
                raise
            finally:
                state.seconds["user"] += time.perf_counter() - started


class GymUserModel:
    """The user model behind a running Gym model server (``/v1/responses``), as the agent server calls it."""

    def __init__(self, url: str, http: GymHttpClient, retry: RetryConfig):
        self.url = url
        self.http = http
        self.retry = retry

    async def __call__(self, state: EpisodeState, body: dict) -> dict:
        return await post_model(self.http, self.url, self.retry, state, "user", body)
