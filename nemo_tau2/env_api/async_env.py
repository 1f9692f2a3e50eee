"""``AsyncTau2Env``: tau2 episodes step by step, for RL stacks that drive the policy themselves.

The environment plays everything but the policy, with the agent server's own parts: tau2's orchestrator rules
(:mod:`nemo_tau2.gym.agent.conversation`), its user simulator and strategies
(:mod:`nemo_tau2.gym.agent.user_simulator`) and the resources server's session code (in process by default, or a
running resources server by URL). ``reset`` starts a task and returns the conversation up to the policy's first
turn; ``step`` takes the policy's turn and returns what follows (tool results, the user's reply; the user's device
actions stay on the user's side) until the policy must speak again or the episode ends; at the end the reward is
tau2's, with the partial-credit components in ``info``.

Hundreds of instances can share one event loop: each holds only its own episode, the user model is called over
async HTTP, and tau2's tools and reward run in microseconds to milliseconds. Infrastructure failures (the user
model unreachable after retries) raise :class:`~nemo_tau2.gym.http_client.InfrastructureError`: the episode has no
outcome and is never scored; ``reset()`` starts over. Nothing is applied twice: a step cut short (cancelled, timed
out, Ctrl-C) ends the episode rather than let a retry run its tool calls again, and against running Gym servers every
request carries an idempotency key, as the agent server's do.
"""

import asyncio
import contextlib
import copy
import logging
import uuid
from typing import Any

from gymnasium.utils import seeding

from nemo_tau2.env_api.config import Tau2EnvConfig
from nemo_tau2.env_api.messages import RESPOND_USER_TOOL, action_turn, assistant_message, chat_messages
from nemo_tau2.env_api.parties import (
    EndpointUserModel,
    GymServerUrls,
    GymUserModel,
    LocalTau2Session,
    ReleaseTau2Session,
)
from nemo_tau2.env_api.release_tasks import ReleaseTasks
from nemo_tau2.generation.launch import GenerationHandle, start_generation
from nemo_tau2.gym.agent.conversation import (
    EpisodeState,
    Tau2Session,
    agent_said,
    play_until_agent,
    start_conversation,
    verify,
)
from nemo_tau2.gym.agent.episode_record import failure_kind
from nemo_tau2.gym.agent.resources_client import HttpTau2Session
from nemo_tau2.gym.agent.user_simulator import UserSimulator
from nemo_tau2.gym.http_client import GymHttpClient, InfrastructureError, RetryConfig
from nemo_tau2.gym.resources_server.release import WorkerRelease
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.gym_rows import task_row
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig

logger = logging.getLogger(__name__)

_LARGE_VERIFY_FIELDS = ("responses_create_params", "response")  # the transcript, which the caller already has


class AsyncTau2Env:
    """tau2 episodes of one domain, step by step (see the module docstring and docs/env-api.md).

    Args:
        domain: airline, retail, telecom or mock; with ``tau2`` v1.0.1 also its own banking_knowledge and
            telecom-workflow.
        split: a tau2 split of the domain (train, test, base; telecom also small, full). Or:
        task_ids: these tasks.
        user: the eval/GRPO ``user`` block (``generation``, ``seed``, ``strategy``, ``max_checks``) or only its
            ``generation`` block: a :class:`GenerationConfig`, a :class:`UserSimulatorConfig` or their dicts.
        max_steps, max_errors, max_turns: tau2's limits; None keeps the agent server's default (as for the next).
        user_empty_retries, user_retry, resources_retry: retries of an empty user message, of user-model calls
            (timeouts, connection errors, 429/5xx) and of resources-server calls (``gym_servers``).
        seed: seeds the task chosen by ``reset()`` when it is given none.
        respond_user: the policy talks to the user through a ``respond_user(text)`` tool call.
        user_endpoint: an endpoint already serving ``user.generation`` (shared by many environments); None starts
            one on the first ``reset()`` and stops it in ``close()``.
        gym_servers: play against running Gym servers (a tau2 resources server and the user's model server)
            instead of in process.
        http: a connection pool to share between environments; None makes one per environment.
        tau2: the tau2 release (the run configs' ``tau2`` block). v0.2.1 runs in this process; a release in its
            own environment (v1.0.1) runs through the resources server's release code, its two workers started
            here (``close()`` stops them), or through ``gym_servers`` serving that release.
    """

    def __init__(
        self,
        domain: str,
        *,
        user: Any,
        split: str | None = None,
        task_ids: list[str] | None = None,
        max_steps: int | None = None,
        max_errors: int | None = None,
        max_turns: int | None = None,
        user_empty_retries: int | None = None,
        user_retry: RetryConfig | dict | None = None,
        resources_retry: RetryConfig | dict | None = None,
        seed: int | None = None,
        respond_user: bool = False,
        user_endpoint: GenerationHandle | None = None,
        gym_servers: GymServerUrls | None = None,
        http: GymHttpClient | None = None,
        tau2: Tau2ReleaseConfig | dict | None = None,
    ):
        release = Tau2ReleaseConfig.model_validate(tau2 or {})
        given = {
            "max_steps": max_steps,
            "max_errors": max_errors,
            "max_turns": max_turns,
            "user_empty_retries": user_empty_retries,
            "user_retry": user_retry,
            "resources_retry": resources_retry,
        }
        self.config = Tau2EnvConfig.model_validate(
            {"domain": domain, "split": split, "task_ids": task_ids, "user": user, "seed": seed}
            | {"respond_user": respond_user, "tau2": release}
            | {key: value for key, value in given.items() if value is not None}
        )
        self.settings = self.config.episode_settings()
        self._release: WorkerRelease | None = None
        self._owns_release = True  # False in a fork: the workers are its parent's
        self._release_tasks: ReleaseTasks | None = None
        if release.version == "v0.2.1":
            self.task_ids = [task.id for task in self.config.tasks()]
            tools = domains.chat_tool_schemas(domain)
        else:  # its tasks, tools and prompts from its own workers, started here (each imports tau2: seconds)
            if gym_servers is None:
                self._release = WorkerRelease(release)
            try:
                self._release_tasks = ReleaseTasks.load(self.config, self._release and self._release.worker)
            except BaseException:  # a split or task the release has not: its workers must not outlive the refusal
                if self._release is not None:
                    self._release.close()
                raise
            self.task_ids, tools = self._release_tasks.task_ids, self._release_tasks.tools
        self.tools = tools + ([RESPOND_USER_TOOL] if respond_user else [])
        self.np_random, _ = seeding.np_random(seed)
        self._http = http or GymHttpClient()
        self._owns_http = http is None
        self._gym_servers = gym_servers
        self._user_endpoint = user_endpoint
        self._owned_endpoint: GenerationHandle | None = None
        self._user: UserSimulator | None = None
        self._start_lock = asyncio.Lock()
        self._session: Tau2Session | None = None
        self._state: EpisodeState | None = None
        self._respond_id: str | None = None
        self._failed: str | None = None
        self._busy = False
        self.last_result: dict | None = None

    # ------------------------------------------------------------------ the episode
    async def reset(
        self,
        task_index: int | None = None,
        sample_index: int = 0,
        *,
        seed: int | None = None,
        options: dict | None = None,
    ) -> tuple[dict, dict]:
        """Start an episode: ``(observation, info)``, the observation being the conversation so far and the tools.

        Args:
            task_index: which task (an index into ``task_ids``); None picks one at random.
            sample_index: which sample of the task (tau2's trial: it sets the user model's seed).
            seed: reseeds the random choice of tasks (Gymnasium's ``reset(seed=)``).
            options: ``task_index`` and ``sample_index`` may come here instead (for Gymnasium wrappers).
        """
        options = options or {}
        task_index = options.get("task_index", task_index)
        sample_index = int(options.get("sample_index", sample_index))
        if seed is not None:
            self.np_random, _ = seeding.np_random(seed)
        if task_index is None:
            task_index = int(self.np_random.integers(len(self.task_ids)))
        if not isinstance(task_index, int) or not 0 <= task_index < len(self.task_ids):
            raise ValueError(f"task_index must be an int in 0..{len(self.task_ids) - 1}, got {task_index!r}")
        if sample_index < 0:
            raise ValueError(f"sample_index must be >= 0, got {sample_index}")
        with self._one_call():
            await self._end_episode()
            user = await self._user_simulator()
            task_id = self.task_ids[task_index]
            row = self._release_tasks.rows[task_id] if self._release_tasks else task_row(self.config.domain, task_id)
            state = EpisodeState.for_row(row, sample_index)
            self._session = self._new_session()
            self._state, self._respond_id, self._failed, self.last_result = state, None, None, None
            await self._guarded(self._open(state, user))
            observation = {"messages": chat_messages(state.row_input() + state.outputs), "tools": self.tools}
            info = self._info(state) | {"reward_basis": self._reward_basis(state)}
            if state.termination_reason is not None:  # the user ended it before the policy spoke
                info |= await self._score(state)
            return observation, info

    async def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        """Play the policy's turn: ``(observation, reward, terminated, truncated, info)``.

        The reward is 0 until the episode ends, then tau2's. ``terminated``: the episode ended (the user stopped, an
        agent or user error, too many tool errors); ``truncated``: a limit cut it (``max_steps``, ``max_turns``).
        """
        state = self._live_state()
        message = assistant_message(action)  # a malformed action raises before anything changes
        with self._one_call():
            turn, respond_id = action_turn(message, self.config.respond_user)
            state.policy_turns += 1
            if turn is not None:
                state.outputs.extend(turn.items)
            seen = len(state.outputs)
            await self._guarded(self._after_agent(state, turn))
            observation = {"messages": chat_messages(state.outputs[seen:], respond_id), "tools": []}
            info = self._info(state)
            if state.termination_reason is None:
                return observation, 0.0, False, False, info
            info |= await self._score(state)
            truncated = state.truncated_by is not None
            return observation, float(info["reward"]), not truncated, truncated, info

    async def fork(self, n: int) -> list["AsyncTau2Env"]:
        """``n`` independent environments in this one's state, at the policy's turn (ARCHITECTURE.md, decision 16).

        Each holds its own tau2 episode, forked from this one's (v0.2.1: the environment deep-copied, copy-on-write
        over its DB; v1.0.1: the release's worker runs this episode's calls again in a new one, with its own
        unlocked tools and sandbox), and a copy of the conversation and counters; the user simulator continues from
        that history. Forks share this environment's user endpoint, connection pool and release workers: a fork's
        ``close()`` ends only its episode, and this environment's stops what it started (close it last). An episode
        on running Gym servers is forked by the resources server's ``/fork`` route instead.
        """
        state = self._live_state()
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        if not hasattr(self._session, "fork"):
            raise NotImplementedError("an episode on running Gym servers is forked by the resources server's /fork")
        with self._one_call():
            sessions = self._session.fork(n)
        forks = []
        for session in sessions:
            env = copy.copy(self)  # the settings, user simulator, endpoint, pool and workers: shared
            env._session, env._state = session, _forked_state(state)
            env._owns_http, env._owned_endpoint, env._owns_release = False, None, False
            env._start_lock, env._busy, env._failed, env.last_result = asyncio.Lock(), False, None, None
            env.np_random = copy.deepcopy(self.np_random)
            forks.append(env)
        return forks

    @property
    def messages(self) -> list[dict]:
        """The whole conversation as the policy saw it (chat messages, tau2's view: respond_user calls as text)."""
        state = self._state
        return [] if state is None else chat_messages(state.row_input() + state.outputs)

    async def close(self) -> None:
        """End a live episode unscored and stop what this environment started."""
        await self._end_episode()
        if self._owned_endpoint is not None:
            await asyncio.to_thread(self._owned_endpoint.shutdown)
            self._owned_endpoint = None
        if self._owns_http:
            await self._http.close()
        if self._release is not None and self._owns_release:
            await asyncio.to_thread(self._release.close)
        self._release = None

    async def __aenter__(self) -> "AsyncTau2Env":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ parts
    async def _open(self, state: EpisodeState, user: UserSimulator) -> None:
        await self._session.seed(state)
        start_conversation(state)
        await play_until_agent(state, user, self._session, self.settings)

    async def _after_agent(self, state: EpisodeState, turn) -> None:
        agent_said(state, turn, self.settings)
        await play_until_agent(state, self._user, self._session, self.settings)

    async def _score(self, state: EpisodeState) -> dict:
        result = await self._guarded(verify(state, self._session))
        self._session = None
        self.last_result = {key: value for key, value in result.items() if key not in _LARGE_VERIFY_FIELDS} | {
            # how it ended, as the Gym agent's episode record and the eval's shares name it (an infrastructure
            # failure raises instead: it has no outcome)
            "tau2_failure_kind": failure_kind(False, state.termination_reason, state.agent_calls).value,
            "agent_tool_calls": state.agent_calls.model_dump(),
        }
        return self.last_result

    async def _guarded(self, work):
        """Run episode work; whatever stops it part-way ends the episode unscored and is raised.

        An infrastructure failure leaves the episode without an outcome. Anything else that cuts the work short
        (cancellation, a timeout around ``step``, Ctrl-C in ``Tau2Env``) may have applied some of the turn's tool
        calls already: retrying the step would apply them twice, so the episode is over there too.
        """
        try:
            return await work
        except BaseException as e:
            self._failed = (
                str(e)
                if isinstance(e, InfrastructureError)
                else f"interrupted by {type(e).__name__}; tool calls may have been applied, so it cannot be retried"
            )
            await self._end_episode()
            raise

    async def _user_simulator(self) -> UserSimulator:
        async with self._start_lock:
            if self._user is None:
                self._user = UserSimulator(self.settings, await self._user_model())
        return self._user

    async def _user_model(self):
        if self._gym_servers is not None:
            return GymUserModel(self._gym_servers.user_model_server, self._http, self.settings.user_retry)
        if self._user_endpoint is None:
            self._owned_endpoint = await asyncio.to_thread(start_generation, self.config.user.generation)
            self._user_endpoint = self._owned_endpoint
        return EndpointUserModel(self._user_endpoint, self._http, self.settings.user_retry)

    def _new_session(self) -> Tau2Session:
        if self._gym_servers is not None:
            return HttpTau2Session(self._http, [self._gym_servers.resources_server], self.settings.resources_retry)
        if self._release is not None:
            return ReleaseTau2Session(self._release)
        return LocalTau2Session()

    async def _end_episode(self) -> None:
        if self._session is not None and self._state is not None:
            await self._session.end(self._state)
        self._session = None

    def _live_state(self) -> EpisodeState:
        if self._failed is not None:
            raise RuntimeError(f"the episode failed ({self._failed}); call reset() to start another")
        if self._state is None:
            raise RuntimeError("no episode: call reset() first")
        if self._state.termination_reason is not None:
            raise RuntimeError(f"the episode has ended ({self._state.termination_reason}); call reset()")
        return self._state

    @contextlib.contextmanager
    def _one_call(self):
        if self._busy:
            raise RuntimeError("reset() or step() called while another one is running on this environment")
        self._busy = True
        try:
            yield
        finally:
            self._busy = False

    def _info(self, state: EpisodeState) -> dict:
        return {
            "domain": state.domain,
            "task_id": state.task_id,
            "sample_index": state.sample_index,
            "tau2_version": state.tau2_version,
            "retrieval_variant": state.retrieval_variant,  # banking_knowledge's (None for the other domains)
            "conversation_id": state.conversation_id,
            "termination_reason": state.termination_reason,
            "truncated_by": state.truncated_by,
            "num_turns": state.policy_turns,
            "num_user_turns": state.user_turns,
            "num_steps": state.steps,
            "num_tool_errors": state.errors,
            "user_simulator": state.user_simulator.report(self.settings.user_strategy.strategy, state.user_turns),
            "timings": {key: round(value, 6) for key, value in state.seconds.items()},
        }

    def _reward_basis(self, state: EpisodeState) -> list[str]:
        if self._release_tasks is not None:
            return self._release_tasks.reward_basis[state.task_id]
        criteria = domains.get_task(state.domain, state.task_id).evaluation_criteria
        return [basis.value for basis in criteria.reward_basis] if criteria else []


def _forked_state(state: EpisodeState) -> EpisodeState:
    """A copy of the episode's state for a fork, the row (read only) shared: the same conversation id (its prefix
    is the parent's: a user model's replica and prefix cache serve it as well), its own request keys."""
    forked = copy.deepcopy(state, {id(state.row): state.row})
    forked.request_key = uuid.uuid4().hex
    return forked
