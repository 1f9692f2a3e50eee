"""tau2-bench as a NeMo-Gym resources server: isolated per-episode tau2 environments, tool routes, tau2's reward.

Protocol (NeMo-Gym cookies identify the episode, as in every stateful Gym resources server):

- ``POST /seed_session`` with ``domain`` and ``task_id`` (the whole Gym row may be posted): a fresh environment
  with the task's initial state; answers with what the agent needs to simulate the user (tau2's user system prompt
  and, in telecom, the user's device tools).
- ``POST /{tool_name}``: an agent tool call; the body is the arguments object. ``POST /user_tools/{tool_name}``:
  a simulated user's device tool (telecom), never listed to the policy. The body of the answer is exactly the tool
  message tau2 would produce (``Error: ...`` for any failure, as tau2 phrases it, so the episode continues); the
  ``X-Tau2-Tool-Error`` header says whether it counts as a tool error (tau2's ``max_errors`` limit).
- ``POST /verify``: tau2's reward for the episode (see :mod:`nemo_tau2.tau2_env.reward`) with partial-credit
  components; ends the session once the answer is built, and keeps the verdict ``verdict_ttl_s`` for retries.
  Without a live session, a body carrying the row and its ``tau2_messages`` is a stored episode, re-scored from its
  trajectory (:mod:`.rescoring`; ``GET /reverify_mode`` says ``stateless``).

Every request may carry an ``Idempotency-Key``; a retry with the same key is answered from the record and nothing
runs twice (:mod:`.replay`). Protocol misuse (no live session, unknown domain/task, malformed JSON, oversized or
too deeply nested body, a key reused for another request) gets a 4xx naming the problem.
"""

import asyncio
import contextlib
import json
import logging
from typing import Any

import orjson
from fastapi import FastAPI, HTTPException, Request, Response
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.server_utils import SESSION_ID_KEY
from pydantic import ConfigDict, Field, PrivateAttr, model_validator

from nemo_tau2.gym.agent.episode_record import trajectory_of
from nemo_tau2.gym.config_keys import GymInstanceConfigMixin, RequestLimitsMixin
from nemo_tau2.gym.fast_middleware import FastMiddlewareMixin
from nemo_tau2.gym.nemo_gym_compat import add_route_if_missing
from nemo_tau2.gym.resources_server.forks import ForkRoutes
from nemo_tau2.gym.resources_server.in_process import call_tool, score_episode, start_episode
from nemo_tau2.gym.resources_server.pivot_verify import PivotRoutes
from nemo_tau2.gym.resources_server.release import WorkerEpisode, WorkerRelease
from nemo_tau2.gym.resources_server.replay import RecordedAnswer, describe, fingerprint, idempotency_key
from nemo_tau2.gym.resources_server.rescoring import rescore, stored_row
from nemo_tau2.gym.resources_server.scoring import InFlightScorings
from nemo_tau2.gym.resources_server.sessions import Session, SessionStore, TooManySessionsError
from nemo_tau2.gym.task_fields import Tau2TaskFields
from nemo_tau2.tau2_env import DOMAINS, domain_problem, domains, prompts
from nemo_tau2.tau2_env.episode import Episode, Requestor
from nemo_tau2.tau2_env.reward import NLAssertionsNotEvaluatedError
from nemo_tau2.tau2_release.client import Tau2JudgeError, Tau2RequestError, Tau2WorkerError
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig

logger = logging.getLogger(__name__)

TOOL_ERROR_HEADER = "X-Tau2-Tool-Error"


class Tau2ResourcesServerConfig(GymInstanceConfigMixin, RequestLimitsMixin, BaseResourcesServerConfig):
    model_config = ConfigDict(extra="allow")

    domains: list[str] = Field(
        default=["airline", "retail", "telecom"],
        description="Domains whose data is loaded at start-up (others load on first use).",
    )
    session_idle_timeout_s: float = Field(
        default=1800.0, gt=0, description="A session untouched this long is dropped (its episode never verified)."
    )
    max_live_sessions: int = Field(default=16384, gt=0, description="Seeding beyond this many live sessions is a 503.")
    verdict_ttl_s: float = Field(
        default=900.0,
        gt=0,
        description="How long a verified episode's verdict is kept for a retried /verify (cover the agent's retries).",
    )
    tau2: Tau2ReleaseConfig = Field(default_factory=Tau2ReleaseConfig, description="Which tau2 release serves.")

    @model_validator(mode="after")
    def _domains_of_the_release(self) -> "Tau2ResourcesServerConfig":
        problems = [problem for domain in self.domains if (problem := domain_problem(domain, self.tau2.version))]
        if problems:
            raise ValueError(f"domains: {problems[0]}")
        return self


class Tau2SeedSessionRequest(Tau2TaskFields, BaseSeedSessionRequest):
    model_config = ConfigDict(extra="allow")  # NeMo-Gym agents post the whole dataset row


class Tau2SeedSessionResponse(BaseSeedSessionResponse):
    domain: str
    task_id: str
    user_system_prompt: str = Field(description="tau2's user-simulator system prompt for this task.")
    user_tools: list[dict] = Field(description="The simulated user's tools (Responses API format); may be empty.")
    reward_basis: list[str] = Field(description="What tau2 multiplies into this task's reward.")
    tau2_version: str = Field(default="v0.2.1", description="The tau2 release that serves and scores the episode.")
    retrieval_variant: str | None = Field(
        default=None, description="banking_knowledge: the knowledge-retrieval variant the episode is played with."
    )


class Tau2VerifyRequest(BaseVerifyRequest):
    model_config = ConfigDict(extra="allow")

    termination_reason: str | None = Field(
        default=None,
        description="tau2 termination reason of the episode. Absent (e.g. NeMo-Gym's simple_agent, which ends when "
        "the model answers with text): treated as agent_stop, and the response says so.",
    )
    tau2_messages: list[dict] | None = Field(
        default=None, description="tau2's trajectory as the agent played it (what tau2 v1.0.1 scores)."
    )


class Tau2VerifyResponse(BaseVerifyResponse):
    model_config = ConfigDict(extra="allow")

    domain: str
    task_id: str
    success: bool
    termination_reason: str
    db_match: bool | None
    action_match_fraction: float | None
    write_action_match_fraction: float | None
    env_assertion_fraction: float | None
    communicate_fraction: float | None
    num_tool_calls: int
    num_tool_errors: int
    reward_info: dict[str, Any]
    retrieval: dict[str, Any] | None = None  # a knowledge domain's: documents found, tools unlocked, against gold


_PROTOCOL_ROUTES = frozenset(
    {"/", "/seed_session", "/verify", "/aggregate_metrics", "/end_session", "/close_session", "/session_stats"}
)


def _json_response(value: Any, status: int = 200) -> Response:
    return Response(content=orjson.dumps(value), status_code=status, media_type="application/json")


class Tau2ResourcesServer(FastMiddlewareMixin, SimpleResourcesServer):
    config: Tau2ResourcesServerConfig
    _sessions: SessionStore = PrivateAttr()
    _sweeper: asyncio.Task | None = PrivateAttr(default=None)
    _release: WorkerRelease | None = PrivateAttr(default=None)  # None: v0.2.1, in process
    _scorings: InFlightScorings = PrivateAttr(default_factory=InFlightScorings)  # v1.0.1's, off the loop

    def model_post_init(self, context: Any) -> None:
        config = self.config
        self._sessions = SessionStore(config.session_idle_timeout_s, config.max_live_sessions, config.verdict_ttl_s)
        return super().model_post_init(context)

    @staticmethod
    def load_domain_data(domain: str) -> None:
        """Load (and cache, per process) what an episode of ``domain`` needs, rather than inside the first one."""
        domains.snapshot_databases(domain)
        domains.task_splits(domain)
        domains.get_task(domain, domains.task_splits(domain)["base"][0])
        prompts.user_system_prompt(domain, domains.task_splits(domain)["base"][0])

    @classmethod
    def preload(cls) -> None:
        """Every domain's data, for processes forked from this one to share (:mod:`nemo_tau2.gym.fork_server`)."""
        for domain in DOMAINS:
            cls.load_domain_data(domain)

    def setup_webserver(self) -> FastAPI:
        if self.config.tau2.version != "v0.2.1":  # the one place the release is chosen
            self._release = WorkerRelease(self.config.tau2)
        for domain in self.config.domains:
            (self._release or self).load_domain_data(domain)
        app = super().setup_webserver()
        if self._release is not None:
            app.router.on_shutdown.append(self._release.close)
        app.get("/session_stats")(self.session_stats)
        app.post("/end_session")(self.end_session)
        add_route_if_missing(app, "POST", "/close_session", self.close_resources_session)  # NeMo-Gym 0.7.0's
        add_route_if_missing(app, "GET", "/reverify_mode", self.get_reverify_mode)
        for routes in (ForkRoutes, PivotRoutes):  # /fork, /adopt_fork (.forks); /verify_pivot (.pivot_verify)
            routes(self, Tau2SeedSessionRequest).add_to(app)
        app.post("/user_tools/{tool_name}")(self.user_tool)
        app.post("/{tool_name}")(self.agent_tool)
        app.router.on_startup.append(self._start_sweeper)
        app.router.on_shutdown.append(self._stop_sweeper)
        return app

    def lone_surrogates_allowed(self, path: str) -> bool:
        return path not in _PROTOCOL_ROUTES  # tool routes answer them with a tool error (a model mistake)

    # ---------------------------------------------------------------- idle sessions, on a timer
    async def _start_sweeper(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep_forever())

    async def _stop_sweeper(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self._sessions.sweep_interval_s())
            self._sessions.evict_idle()

    # ---------------------------------------------------------------- routes
    async def seed_session(self, request: Request, body: Tau2SeedSessionRequest) -> Response:
        key = idempotency_key(request.headers)
        raw = await request.body()
        if key is not None and (earlier := self._sessions.seeded(key)) is not None:
            session_id, session = earlier
            answer = session.seed_answer.replay(key, "/seed_session", raw)
            request.session[SESSION_ID_KEY] = session_id  # the retry gets the first attempt's session cookie
            self._sessions.replayed_answers += 1
            return answer
        problem = self._row_problem(body)
        if problem is not None:
            raise HTTPException(status_code=problem[0], detail=problem[1])
        try:
            episode, answer = (self._release.start_episode if self._release else start_episode)(
                body.domain, body.task_id
            )
        except (domains.UnknownDomainError, domains.UnknownTaskError, Tau2RequestError) as e:
            raise HTTPException(status_code=404, detail=str(e)) from e
        except Tau2WorkerError as e:
            raise self._infrastructure_error(e) from e
        response = _json_response(Tau2SeedSessionResponse.model_validate(answer).model_dump(mode="json"))
        recorded = RecordedAnswer.of("/seed_session", raw, response) if key is not None else None
        try:
            self._sessions.put(request.session[SESSION_ID_KEY], episode, key, recorded)
        except TooManySessionsError as e:
            raise HTTPException(status_code=503, detail=str(e)) from e
        # which episode lives here (its idempotency-key prefix): with several replicas, the log says where each ran
        logger.info(
            "session seeded: %s task %s, episode %s", body.domain, body.task_id, (key or "-").rsplit("-", 1)[0]
        )
        return response

    def _row_problem(self, body: Tau2SeedSessionRequest) -> tuple[int, str] | None:
        """A row this server cannot play as written: a domain it does not have (404, as an unknown task), another
        release's row, or (banking_knowledge) a row written for another retrieval variant, whose prompt and tools are
        that variant's (400)."""
        version = self.config.tau2.version
        problem = domain_problem(body.domain, version)
        if problem is not None:
            return 404, problem
        extra = body.model_extra or {}  # a bare {domain, task_id} is fine; a row that says otherwise is refused
        row_version = extra.get("tau2_version")
        if row_version is not None and row_version != version:
            return 400, f"the row is of tau2 {row_version}; this server serves tau2 {version}: write the rows again"
        served = self._release.retrieval_variant(body.domain) if self._release else None
        row_variant = extra.get("retrieval_variant")
        if row_variant is not None and row_variant != served:
            return 400, (
                f"the row was written for retrieval variant {row_variant!r} and this server serves {served!r}: write "
                f"the rows with tau2.retrieval_variant={served}, or serve tau2.retrieval_variant={row_variant}"
            )
        return None

    def _no_session(self, request: Request) -> HTTPException:
        if self._sessions.verdict(request.session.get(SESSION_ID_KEY)) is not None:
            return HTTPException(status_code=404, detail="this session's episode was already verified and has ended")
        return HTTPException(
            status_code=404,
            detail="no live tau2 session for this cookie: call /seed_session first (a session ends at /verify "
            f"or after {self.config.session_idle_timeout_s:g} s without requests)",
        )

    def _live_session(self, request: Request) -> Session:
        if (session := self._sessions.session(request.session.get(SESSION_ID_KEY))) is None:
            raise self._no_session(request)
        return session

    async def _tool_call(self, request: Request, tool_name: str, requestor: Requestor) -> Response:
        key = idempotency_key(request.headers)
        session = self._live_session(request)
        if request.session.get(SESSION_ID_KEY) in self._scorings:
            raise HTTPException(status_code=409, detail="this session's episode is being verified: it has ended")
        raw = await request.body()
        route = f"/{tool_name}" if requestor == "assistant" else f"/user_tools/{tool_name}"
        if key is not None and key in session.answers:
            self._sessions.replayed_answers += 1
            return session.answers[key].replay(key, route, raw)
        response = self._run_tool(session.episode, request, tool_name, requestor, raw)
        if key is not None:
            session.answers[key] = RecordedAnswer.of(route, raw, response)
        return response

    def _run_tool(self, episode: Episode, request: Request, tool_name: str, requestor: Requestor, raw: bytes):
        """Run one call (no await: a concurrent retry sees either nothing or the recorded answer)."""
        try:
            arguments = json.loads(raw) if raw.strip() else {}
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise HTTPException(status_code=400, detail=f"tool call body is not valid JSON: {e}") from e
        try:
            message = call_tool(episode, tool_name, arguments, requestor, request.headers.get("X-Tool-Call-Id", ""))
        except Tau2WorkerError as e:  # the release's worker died or failed: nothing recorded, so a retry runs again
            raise self._infrastructure_error(e) from e
        return Response(
            # backslashreplace: a tool's own message may quote text that is not valid Unicode; never a 500 for it
            content=(message.content or "").encode(errors="backslashreplace"),
            media_type="text/plain; charset=utf-8",
            headers={TOOL_ERROR_HEADER: "1" if message.error else "0"},
        )

    async def agent_tool(self, request: Request, tool_name: str) -> Response:
        return await self._tool_call(request, tool_name, "assistant")

    async def user_tool(self, request: Request, tool_name: str) -> Response:
        return await self._tool_call(request, tool_name, "user")

    async def verify(self, request: Request, body: Tau2VerifyRequest, response: Response) -> Tau2VerifyResponse:
        """tau2's verdict; the session ends only once it is built, and the verdict is kept for an identical retry
        (one verdict per session, whatever idempotency key the retry carries)."""
        session_id = request.session.get(SESSION_ID_KEY)
        raw = await request.body()
        verdict = self._sessions.verdict(session_id)
        if verdict is not None:
            if fingerprint("/verify", raw) != verdict.fingerprint:
                raise HTTPException(
                    status_code=409,
                    detail=f"this session was already verified, for {verdict.request}; a retried /verify must "
                    f"repeat that request byte for byte, not {describe('/verify', raw)}",
                )
            self._sessions.replayed_answers += 1
            response.headers["X-Idempotent-Replay"] = "1"
            return Tau2VerifyResponse.model_validate(body.model_dump() | verdict.fields)
        session = self._sessions.session(session_id)
        if session is None:  # a stored episode, re-scored from its trajectory (or the 404 of a missing session)
            messages, termination = body.tau2_messages, body.termination_reason
            if messages is None:  # NeMo-Gym's reverify posts the row and the stored response: it carries them
                messages, termination = trajectory_of(body.response.metadata)
            if messages is None or session_id in self._scorings:
                raise self._no_session(request)
            row = stored_row(Tau2SeedSessionRequest, body.model_extra)  # the task, rebuilt from the row's fields
            if (problem := self._row_problem(row)) is not None:
                raise HTTPException(status_code=problem[0], detail=problem[1])
            score = await rescore(self._release, row.domain, row.task_id, messages, termination)
            return Tau2VerifyResponse.model_validate(body.model_dump() | score)
        episode = session.episode
        items = body.responses_create_params.model_dump().get("input") or []
        items = (items if isinstance(items, list) else []) + body.response.model_dump()["output"]
        request_name, request_fingerprint = describe("/verify", raw), fingerprint("/verify", raw)

        def finish(score: dict[str, Any]) -> dict[str, Any]:
            live = self._sessions.session(session_id)  # re-seeded while scored off the loop: the new one lives on
            if live is None or live.episode is episode:
                self._sessions.finish(session_id, request_name, request_fingerprint, score)
            return score

        try:
            if isinstance(episode, WorkerEpisode):  # scored on the release's scoring thread: the loop serves on

                async def score_off_the_loop() -> dict[str, Any]:
                    scoring = self._release.score_episode, episode, body.tau2_messages, body.termination_reason
                    return finish(await asyncio.get_running_loop().run_in_executor(self._release.scoring, *scoring))

                score = await self._scorings.run(session_id, request_fingerprint, request_name, score_off_the_loop)
            else:
                score = finish(score_episode(episode, items, body.termination_reason))
        except (Tau2JudgeError, Tau2WorkerError) as e:  # infrastructure, with its cause: never a score
            raise self._infrastructure_error(e) from e
        except (NLAssertionsNotEvaluatedError, ValueError) as e:
            raise HTTPException(status_code=400, detail=str(e)) from e
        return Tau2VerifyResponse.model_validate(body.model_dump() | score)

    def _infrastructure_error(self, error: Exception) -> HTTPException:
        """A 502 naming its cause: the release's worker or its NL judge failed, not the request (never scored)."""
        return HTTPException(status_code=502, detail=f"tau2 {self.config.tau2.version}: {error}")

    async def end_session(self, request: Request) -> dict[str, bool]:
        """Drop the episode without scoring it (the agent calls this when the episode failed for other reasons)."""
        return {"ended": self._sessions.pop(request.session.get(SESSION_ID_KEY)) is not None}

    async def close_resources_session(self, request: Request) -> dict[str, str | None]:
        """NeMo-Gym 0.7.0's ``/close_session``: the episode of this cookie is dropped, unscored (as
        ``/end_session``); closing one already closed or never seeded succeeds."""
        session_id = request.session.get(SESSION_ID_KEY)
        self._sessions.pop(session_id)
        return {"resources_session_id": session_id}

    async def get_reverify_mode(self) -> str:
        """NeMo-Gym 0.7.0's ``/reverify_mode``: ``stateless``, since a stored rollout's ``/verify`` body (its
        ``tau2_messages``) is re-scored without its session (:mod:`.rescoring`)."""
        return "stateless"

    async def session_stats(self) -> dict[str, int]:
        """Counts as they stand (reading them evicts nothing: the timer does)."""
        return {
            "live_sessions": len(self._sessions),
            "verified_sessions_kept": self._sessions.num_verdicts,
            "evicted_idle_sessions": self._sessions.evicted_idle,
            "replayed_answers": self._sessions.replayed_answers,
        }
