"""One tau2 episode, played as tau2's orchestrator plays it, over NeMo-Gym servers.

The rules (routing, step counting, stop tokens, limits) are :mod:`.conversation`'s, shared with ``Tau2Env``. Three
parties, each a NeMo-Gym server: the policy (``/v1/responses`` of ``model_server``), the simulated user
(:mod:`.user_simulator` over ``/v1/responses`` of ``user_model_server``, roles flipped as in tau2's
``UserState.flip_roles``), and the tau2 resources server (tools, user device tools, ``/verify``). Every request to
the resources server carries an ``Idempotency-Key`` of its own, the same on each retry (:mod:`.resources_client`),
so the HTTP client's retries never apply a write twice; the episode's session is ended whatever way the episode
fails.
"""

import logging
import time
from dataclasses import dataclass

from nemo_tau2.generation.contiguity import check_contiguity
from nemo_tau2.gym.agent.conversation import (
    EpisodeState,
    RowError,
    agent_said,
    play_until_agent,
    resume_conversation,
    start_conversation,
    verify,
)
from nemo_tau2.gym.agent.episode_record import (
    TRAJECTORY_KEY,
    EpisodeData,
    EpisodeStatus,
    TokenContiguity,
    failure_kind,
    metric_flags,
)
from nemo_tau2.gym.agent.resources_client import (
    PIVOT_CONTINUED,
    PIVOT_KEY,
    PIVOT_ROW_ONLY,
    PIVOT_TERMINATION,
    HttpTau2Session,
)
from nemo_tau2.gym.agent.turns import Turn, read_turn, with_last_token_ids_only
from nemo_tau2.gym.agent.user_simulator import UserSimulator
from nemo_tau2.gym.episode_config import EpisodeSettings
from nemo_tau2.gym.http_client import GymHttpClient, InfrastructureError

logger = logging.getLogger(__name__)


@dataclass
class AgentProgress:
    """What the agent server has done so far, over all its callers (``GET /progress``): callers poll it to show
    progress inside long episodes, which ``/run`` only answers at the end of."""

    running_episodes: int = 0
    finished_episodes: int = 0
    policy_turns: int = 0  # policy model calls answered
    user_turns: int = 0  # user simulator model calls answered
    generation_tokens: int = 0  # the policy's output tokens (its answers' usage)


@dataclass
class Endpoints:
    resources: list[str]  # http://host:port of each resources replica
    policy: str  # http://host:port of the model servers
    user: str


async def post_model(http: GymHttpClient, url: str, retry, state: EpisodeState, role: str, body: dict) -> dict:
    """One Responses API call to a Gym model server (retried, timed); ``role`` is ``policy`` or ``user``."""
    what = "policy model" if role == "policy" else "user simulator"
    started = time.perf_counter()
    response = await http.post(url + "/v1/responses", body, retry, cookies=state.cookies[role], what=f"{what} call")
    state.seconds[role] += time.perf_counter() - started
    if response.status != 200:
        raise response.failure(what)
    state.cookies[role] = response.cookies or state.cookies[role]
    return response.body


class EpisodeOrchestrator:
    """Plays episodes; one instance serves all concurrent episodes of an agent server (state lives per episode)."""

    def __init__(self, http: GymHttpClient, endpoints: Endpoints, settings: EpisodeSettings):
        self.http = http
        self.endpoints = endpoints
        self.settings = settings
        self.session = HttpTau2Session(http, endpoints.resources, settings.resources_retry)
        self.user = UserSimulator(settings, self._user_call)
        self.progress = AgentProgress()

    # ---------------------------------------------------------------- the episode
    async def run(self, row: dict) -> tuple[int, dict]:
        """Play the row's task: ``(200, verify response + episode data)``, ``(502, infrastructure error)``, or
        ``(400, detail)`` when the resources server refuses the row."""
        started = time.perf_counter()
        state = EpisodeState.for_row(row, int(row.get("sample_index", row.get("_ng_rollout_index", 0)) or 0))
        self.progress.running_episodes += 1
        with self.session.placed(state):
            logger.info(
                "episode started: %s task %s sample %d on %s, episode %s",
                *(state.domain, state.task_id, state.sample_index, state.resources_url, state.request_key),
            )
            try:
                if PIVOT_KEY in row:  # a pivot (docs/pivot-rl.md): one policy turn, judged by what it does
                    result = await self._pivot_turn(state)
                else:
                    await self.session.seed(state)
                    await self._play(state)
                    result = await verify(state, self.session)
            except InfrastructureError as e:
                return 502, self._episode_data(state, time.perf_counter() - started, failure=e)
            except RowError as e:
                return 400, {"detail": str(e)}
            finally:
                self.progress.running_episodes -= 1
                self.progress.finished_episodes += 1
                if not state.verified:  # failed, cancelled or crashed: the session must not linger until it expires
                    await self.session.end(state)
        result.update(self._episode_data(state, time.perf_counter() - started))
        return 200, result

    async def _play(self, state: EpisodeState) -> None:
        start_conversation(state)
        await self._play_on(state)

    async def _play_on(self, state: EpisodeState) -> None:
        await play_until_agent(state, self.user, self.session, self.settings)
        while state.termination_reason is None:
            agent_said(state, await self._policy_turn(state), self.settings)
            await play_until_agent(state, self.user, self.session, self.settings)

    async def _pivot_turn(self, state: EpisodeState) -> dict:
        """A pivot row's episode: the policy's one turn at the pivot's prompt, scored by ``/verify_pivot`` (the
        action run in a fork of the pivot's state). No session is seeded: the server rebuilds the state per pivot."""
        state.tau2_version = state.row.get("tau2_version") or "v0.2.1"
        state.retrieval_variant = state.row.get("retrieval_variant")
        expected = state.row[PIVOT_KEY]  # its shape is the server's to check (/verify_pivot's 400s)
        if (
            self.settings.pivot_text_reward == "continue"
            and isinstance(expected, dict)
            and expected.get("type") == "message"
        ):
            return await self._continued_pivot(state)
        turn = await self._policy_turn(state)
        state.termination_reason = PIVOT_TERMINATION if turn is not None else "agent_error"
        return await self.session.verify_pivot(state)

    async def _continued_pivot(self, state: EpisodeState) -> dict:
        """A text pivot in mode ``continue``: the sampled turn, then the episode played on from a fork of the pivot's
        state by the policy and the simulated user, scored by tau2's ``/verify``. The response is the pivot turn alone
        (what trains: PivotRL's response is the sampled turn); the whole trajectory is the answer's
        ``tau2_messages``."""
        resume_conversation(state, state.row.get(TRAJECTORY_KEY))  # checked before the server replays it
        await self.session.fork_prefix(state)
        agent_said(state, await self._policy_turn(state), self.settings)
        pivot_turn_items = len(state.outputs)
        await self._play_on(state)
        result = await verify(state, self.session)
        answer = {key: value for key, value in result.items() if key not in PIVOT_ROW_ONLY}
        played = f"played on to {state.termination_reason} after {state.policy_turns} policy turn(s)"
        pivot = {"category": PIVOT_CONTINUED, "detail": played}
        return answer | {
            "response": result["response"] | {"output": result["response"]["output"][:pivot_turn_items]},
            TRAJECTORY_KEY: state.tau2_messages,
            "reward_info": (result.get("reward_info") or {}) | {"pivot": pivot},
        }

    # ---------------------------------------------------------------- the policy and the user model
    async def _policy_turn(self, state: EpisodeState) -> Turn | None:
        params = {key: value for key, value in state.row["responses_create_params"].items() if key != "input"}
        body = params | {
            "input": state.row_input() + with_last_token_ids_only(state.outputs),
            "user": state.key("policy"),
        }
        answer = await post_model(self.http, self.endpoints.policy, self.settings.policy_retry, state, "policy", body)
        state.policy_turns += 1
        state.last_policy_response = answer
        self._count_usage(state, answer)
        self.progress.policy_turns += 1
        self.progress.generation_tokens += (answer.get("usage") or {}).get("output_tokens") or 0
        turn = read_turn(answer, lenient=True)
        self._record_tokens(state, turn.items)
        state.truncated_turns += turn.truncated
        state.outputs.extend(turn.items)
        if not turn.calls and not turn.text.strip():
            return None
        return turn

    async def _user_call(self, state: EpisodeState, body: dict) -> dict:
        answer = await post_model(self.http, self.endpoints.user, self.settings.user_retry, state, "user", body)
        self.progress.user_turns += 1
        return answer

    def _record_tokens(self, state: EpisodeState, items: list[dict]) -> None:
        for item in items:
            if item.get("generation_token_ids") is not None:  # ints: vllm_model validated them
                state.token_turns.append((item["prompt_token_ids"], item["generation_token_ids"]))

    @staticmethod
    def _count_usage(state: EpisodeState, body: dict) -> None:
        usage = body.get("usage") or {}  # a server that reports no usage: its counts stay 0
        input_tokens, output_tokens = usage.get("input_tokens") or 0, usage.get("output_tokens") or 0
        if state.policy_turns == 1:
            state.usage["first_input_tokens"] = input_tokens
        state.usage["last_input_tokens"], state.usage["last_output_tokens"] = input_tokens, output_tokens
        state.usage["input_tokens"] += input_tokens
        state.usage["output_tokens"] += output_tokens

    # ---------------------------------------------------------------- results
    def _episode_data(self, state: EpisodeState, total_s: float, failure: InfrastructureError | None = None) -> dict:
        breaks = check_contiguity(state.token_turns)
        data = EpisodeData(
            status=EpisodeStatus.OK if failure is None else EpisodeStatus.INFRASTRUCTURE_ERROR,
            domain=state.domain,
            task_id=state.task_id,
            tau2_version=state.tau2_version,
            retrieval_variant=state.retrieval_variant,
            conversation_id=state.conversation_id,
            policy_model=(state.last_policy_response or {}).get("model") or self.endpoints.policy,
            error=None if failure is None else str(failure),
            cause=None if failure is None else failure.cause,
            unreachable=None if failure is None else failure.server,
            termination_reason=state.termination_reason if failure is None else None,
            truncated_by=state.truncated_by,
            tau2_failure_kind=failure_kind(failure is not None, state.termination_reason, state.agent_calls),
            agent_tool_calls=state.agent_calls,
            num_turns=state.policy_turns,
            num_user_turns=state.user_turns,
            num_steps=state.steps,
            num_tool_errors=state.errors,
            num_truncated_generations=state.truncated_turns,
            **token_counts(state),
            token_contiguity=TokenContiguity(
                checked_turns=len(state.token_turns),
                breaks=[str(b) for b in breaks],
                first_break_turn=min((b.turn for b in breaks), default=None),
            ),
            user_simulator=state.user_simulator.report(self.user.strategy, state.user_turns),
            timings={key: round(value, 6) for key, value in state.seconds.items()} | {"total": round(total_s, 6)},
        )
        answer = data.model_dump(mode="json") | metric_flags(data)
        if failure is not None and state.termination_reason is not None:  # played to its end, failed at /verify
            # what re-scores it later without re-playing it (run_eval.py --rescore): the judge's outage is over
            answer["unscored_episode"] = {
                "termination_reason": state.termination_reason,
                "tau2_messages": state.tau2_messages,
                "transcript": state.outputs,  # what a scored episode's line keeps (the report, SFT rows)
            }
        return answer


def token_counts(state: EpisodeState) -> dict[str, int]:
    """``prompt_tokens``, ``generation_tokens`` and ``total_tokens`` of the episode: from the policy's token ids
    when its server returns them (exact), else from the ``usage`` of its answers (every OpenAI-compatible server)."""
    if state.token_turns:
        first_prompt, _ = state.token_turns[0]
        last_prompt, last_generation = state.token_turns[-1]
        return {
            "prompt_tokens": len(first_prompt),
            "generation_tokens": sum(len(generated) for _, generated in state.token_turns),
            "total_tokens": len(last_prompt) + len(last_generation),
        }
    usage = state.usage
    return {
        "prompt_tokens": usage["first_input_tokens"],
        "generation_tokens": usage["output_tokens"],
        "total_tokens": usage["last_input_tokens"] + usage["last_output_tokens"],
    }
