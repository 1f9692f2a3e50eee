"""Forks: an episode forked at an assistant turn into N independent episodes (ARCHITECTURE.md, decision 16).

- ``POST /fork`` ``{"n": N}`` with a live session's cookie: N episodes in that session's state now.
- ``POST /fork`` without a live session, the body carrying a stored episode (its row's ``domain`` and ``task_id``,
  its ``tau2_messages``) and ``turn``: the parent is rebuilt as a stored episode is re-scored (:mod:`.rescoring`:
  the task's start state, the calls made before assistant turn ``turn`` replayed, each answer checked against the
  recorded one), then forked. A prefix that does not replay is refused (400) with its reason and the call, message
  and assistant turn where the answer differs: never forked silently.
- Each fork is a live session of this server, as a seeded one: its own DB (copy-on-write over the parent's state:
  v0.2.1 deep-copies the environment, whose collections copy only what the parent holds of its own; v1.0.1's worker
  runs the parent's calls again in a new episode, its own sandbox and unlocked tools included), never the parent's
  objects. The answer lists ``fork_ids``; ``POST /adopt_fork`` ``{"fork_id"}`` makes the caller's cookie that
  fork's session (once per fork), whose tool calls and ``/verify`` then go on as any session's. The conversation so
  far is the caller's (a live parent's), or the answer's ``tau2_messages`` (a stored one's prefix, with the user's
  prompt and tools, as ``/seed_session`` answers them: what a simulated user needs to play on).
- A ``/fork`` with an ``Idempotency-Key`` runs once: a retry (same key, same bytes) gets the recorded answer, the same
  fork ids; the same key on another request is a 409 (:mod:`.replay`). An ``/adopt_fork`` retried with its key gets
  its answer and cookie again.
"""

import uuid
from collections import OrderedDict
from typing import Any

from fastapi import FastAPI, HTTPException, Request, Response
from nemo_gym.server_utils import SESSION_ID_KEY
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_tau2.gym.resources_server.in_process import start_episode
from nemo_tau2.gym.resources_server.release import WorkerRelease
from nemo_tau2.gym.resources_server.replay import RecordedAnswer, idempotency_key
from nemo_tau2.gym.resources_server.rescoring import TrajectoryError, replay_into, stored_row
from nemo_tau2.gym.resources_server.sessions import TooManySessionsError
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_release.client import Tau2RequestError, Tau2WorkerError

MAX_FORKS = 64
MAX_RECORDED_FORKS = 4096  # /fork answers kept for retries (the oldest dropped first)


class ForkRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # a stored episode's row fields (domain, task_id, tau2_version, ...)

    n: int = Field(ge=1, le=MAX_FORKS, description="How many forks.")
    tau2_messages: list[dict] | None = Field(
        default=None, description="A stored episode's trajectory, when no live session is forked."
    )
    turn: int | None = Field(
        default=None,
        ge=0,
        description="Fork the stored episode before this assistant turn (0-based, among tau2_messages' assistant "
        "messages); None: after its last message.",
    )


class ForkResponse(BaseModel):
    fork_ids: list[str]
    domain: str
    task_id: str
    num_tool_calls: int = Field(description="The tool calls each fork's state holds (the parent's so far).")
    tau2_messages: list[dict] | None = Field(
        default=None, description="A stored parent's prefix: the conversation the forks continue from."
    )
    user_system_prompt: str | None = Field(
        default=None, description="A stored parent's: the simulated user's prompt (as /seed_session answers it)."
    )
    user_tools: list[dict] | None = Field(default=None, description="A stored parent's: the user's device tools.")


class AdoptForkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    fork_id: str


def prefix_before(messages: list[dict], turn: int | None) -> list[dict]:
    """The messages before assistant turn ``turn`` (all of them for None); a 400 when there is no such turn."""
    if turn is None:
        return messages
    starts = [index for index, message in enumerate(messages) if message.get("role") == "assistant"]
    if turn >= len(starts):
        raise HTTPException(
            status_code=400, detail=f"turn {turn}: tau2_messages has {len(starts)} assistant turns (0-based)"
        )
    return messages[: starts[turn]]


def rebuild(release: WorkerRelease | None, domain: str, task_id: str, messages: list[dict]) -> tuple[Any, dict]:
    """A stored episode's parent: the task's start state with ``messages``' calls replayed (:mod:`.rescoring`), and
    what ``/seed_session`` answers about the task (the user's prompt and tools: a fork played on needs them)."""
    episode, answer = release.start_episode(domain, task_id) if release is not None else start_episode(domain, task_id)
    try:
        return replay_into(episode, domain, messages), answer
    except BaseException:
        if hasattr(episode, "close"):
            episode.close()
        raise


def _count(episode: Any) -> int:
    return episode.num_tool_calls if hasattr(episode, "num_tool_calls") else len(episode.tool_log)


class ForkRoutes:
    """``/fork`` and ``/adopt_fork`` of a :class:`~.app.Tau2ResourcesServer` (its sessions and release)."""

    def __init__(self, server: Any, row_model: type[BaseModel]):  # the app's server: typed there, not imported here
        self.server = server
        self.row_model = row_model  # the server's seed request: what a stored episode's row must hold
        self.unadopted: set[str] = set()  # fork ids no cookie holds yet
        self.recorded: OrderedDict[str, RecordedAnswer] = OrderedDict()  # /fork's answers by Idempotency-Key
        self.adoptions: OrderedDict[str, str] = OrderedDict()  # /adopt_fork's fork ids by Idempotency-Key

    def add_to(self, app: FastAPI) -> None:
        app.post("/fork")(self.fork)
        app.post("/adopt_fork")(self.adopt_fork)

    async def fork(self, request: Request) -> Response:
        """The forks, once per ``Idempotency-Key``: a retried request gets the same fork ids (its recorded answer),
        never a second set of episodes."""
        key, raw = idempotency_key(request.headers), await request.body()
        if key is not None and (recorded := self.recorded.get(key)) is not None:
            return recorded.replay(key, "/fork", raw)
        answer = await self._fork(request)
        response = Response(content=answer.model_dump_json(), media_type="application/json")
        if key is not None:
            self.recorded[key] = RecordedAnswer.of("/fork", raw, response)
            while len(self.recorded) > MAX_RECORDED_FORKS:
                self.recorded.popitem(last=False)
        return response

    async def _fork(self, request: Request) -> ForkResponse:
        body = await body_as(request, ForkRequest)
        server, sessions = self.server, self.server._sessions
        session_id = request.session.get(SESSION_ID_KEY)
        session = sessions.session(session_id)
        if session is not None and session_id in server._scorings:
            raise HTTPException(status_code=409, detail="this session's episode is being verified: it has ended")
        prefix, seeded = None, {}
        try:
            if session is not None:
                if body.tau2_messages is not None:
                    detail = "a live session is forked in its state now: its /fork takes no tau2_messages"
                    raise HTTPException(status_code=400, detail=detail)
                parent, rebuilt = session.episode, False
            else:
                if body.tau2_messages is None:
                    raise HTTPException(
                        status_code=404,
                        detail="no live tau2 session for this cookie: /fork forks a live session, or a stored "
                        "episode given as its row's domain and task_id and its tau2_messages",
                    )
                row = stored_row(self.row_model, body.model_extra)
                if (problem := server._row_problem(row)) is not None:
                    raise HTTPException(status_code=problem[0], detail=problem[1])
                prefix = prefix_before(body.tau2_messages, body.turn)
                (parent, seeded), rebuilt = rebuild(server._release, row.domain, row.task_id, prefix), True
            try:
                forks = parent.fork(body.n)
            finally:
                if rebuilt and hasattr(parent, "close"):
                    parent.close()
        except TrajectoryError as e:
            raise HTTPException(status_code=400, detail=f"this prefix cannot be forked: {e}") from e
        except (domains.UnknownDomainError, domains.UnknownTaskError) as e:
            raise HTTPException(status_code=404, detail=str(e)) from e
        except Tau2RequestError as e:  # the worker refused: a call answered otherwise in a fork
            raise HTTPException(status_code=409 if prefix is None else 400, detail=str(e)) from e
        except Tau2WorkerError as e:
            raise server._infrastructure_error(e) from e
        fork_ids = []
        try:
            for episode in forks:
                fork_ids.append(_new_id())
                sessions.put(fork_ids[-1], episode)
        except TooManySessionsError as e:
            for fork_id in fork_ids:
                sessions.pop(fork_id)
            raise HTTPException(status_code=503, detail=str(e)) from e
        self.unadopted = {fork_id for fork_id in self.unadopted if fork_id in sessions}  # evicted ones go
        self.unadopted.update(fork_ids)
        first = forks[0]
        task_id = str(first.task_id if hasattr(first, "task_id") else first.task.id)
        return ForkResponse(
            fork_ids=fork_ids, domain=first.domain, task_id=task_id, num_tool_calls=_count(first),
            tau2_messages=prefix, user_system_prompt=seeded.get("user_system_prompt"),
            user_tools=seeded.get("user_tools"),
        )  # fmt: skip

    async def adopt_fork(self, request: Request) -> dict[str, str]:
        """The caller's cookie becomes the fork's session (a fork is adopted once; an unadopted fork left idle is
        dropped as any idle session). A retry with the first request's ``Idempotency-Key`` gets the same answer and
        cookie while the fork lives: an answer lost on the way never strands the caller."""
        body = await body_as(request, AdoptForkRequest)
        key = idempotency_key(request.headers)
        retried = key is not None and self.adoptions.get(key) == body.fork_id  # its first answer was lost
        if retried and self.server._sessions.session(body.fork_id) is not None:
            request.session[SESSION_ID_KEY] = body.fork_id
            return {"fork_id": body.fork_id}
        if body.fork_id not in self.unadopted or self.server._sessions.session(body.fork_id) is None:
            self.unadopted.discard(body.fork_id)
            raise HTTPException(status_code=404, detail=f"no unadopted live fork {body.fork_id!r}")
        self.unadopted.discard(body.fork_id)
        request.session[SESSION_ID_KEY] = body.fork_id
        if key is not None:
            self.adoptions[key] = body.fork_id
            while len(self.adoptions) > MAX_RECORDED_FORKS:
                self.adoptions.popitem(last=False)
        return {"fork_id": body.fork_id}


async def body_as[Body: BaseModel](request: Request, model: type[Body]) -> Body:
    """The request's body as ``model``; a one-line 400 naming the first problem."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as e:
        error = e.errors()[0]
        where = ".".join(map(str, error["loc"])) or "body"
        raise HTTPException(status_code=400, detail=f"{request.url.path}: {where}: {error['msg']}") from None


def _new_id() -> str:
    return f"fork-{uuid.uuid4().hex}"
