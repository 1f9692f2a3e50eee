"""``POST /verify_pivot``: PivotRL's functional reward, exact: a sampled action run in a fork of the pivot's state.

A pivot (:mod:`nemo_tau2.pivots.candidates`) is one assistant turn of a stored trajectory: the prompt before it
(``responses_create_params``), the demonstrated action (``expected_action``, NeMo-Gym's pivot row contract) and
what rebuilds its state (the row's ``domain``, ``task_id``, ``tau2_version``, ``retrieval_variant`` and the
trajectory's messages before the turn, ``tau2_messages``). The body is that row plus the model's ``response``, as
NeMo-Gym posts any ``/verify``.

- The state is rebuilt once per pivot, as ``/fork`` rebuilds a stored prefix (:func:`.forks.rebuild`: the task's
  start state, the prefix's calls replayed and each answer checked), and kept (LRU) for the pivot's next samples.
- **A tool call scores 1** when, run in its own fork of that state, it leaves the database as the demonstrated
  call, run in another fork, leaves it, and answers as it answers. The database is compared as tau2 compares
  databases (generated ids included: the same state generates the same ids); a read-only call changes nothing, so
  it is judged by its answer. Several calls in one turn are run in order in one fork and their answers compared
  as a set: the same calls in another order score 1, a subset or a superset 0.
- **A text turn** (``message`` expected) scores 1 for any text, as NeMo-Gym's verifier scores it; a call where text
  was expected scores 0.
- The category says why (:class:`PivotCategory`). A prefix that does not replay is a 400 naming its reason (the
  pivot was cut from another release's or data's trajectory); a worker failure is a 502: never a score.
"""

import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson
from fastapi import FastAPI, HTTPException, Request, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nemo_tau2.gym.resources_server.forks import rebuild
from nemo_tau2.gym.resources_server.in_process import call_tool
from nemo_tau2.gym.resources_server.rescoring import TrajectoryError, stored_row
from nemo_tau2.pivots.actions import (
    Action,
    FunctionCallAction,
    MessageAction,
    action_of_output,
    calls_of,
    decoded_arguments,
)
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.episode import Episode
from nemo_tau2.tau2_env.session_db import SnapshotJsonCache, databases_equal
from nemo_tau2.tau2_release.client import Tau2RequestError, Tau2WorkerError

MAX_PIVOT_STATES = 512  # rebuilt pivot states kept for their next samples (a profile's K, a GRPO group)


class PivotCategory(StrEnum):
    EQUIVALENT = "equivalent"  # the same database change and the same answers as the demonstrated call(s)
    DIFFERENT_STATE = "different_state"  # the database after the sampled calls is not the demonstrated one's
    DIFFERENT_ANSWER = "different_answer"  # the same database, other answers (a read of something else)
    MALFORMED_CALL = "malformed_call"  # a call whose arguments are not a JSON object
    CALL_EXPECTED = "call_expected"  # text where the demonstration called a tool
    MESSAGE = "message"  # text where the demonstration spoke (mode message: any text)
    MESSAGE_EXPECTED = "message_expected"  # calls where the demonstration spoke
    NO_ACTION = "no_action"  # neither a call nor text


class PivotResponse(BaseModel):
    model_config = ConfigDict(extra="allow")  # NeMo-Gym's response object: echoed whole, only its output read

    output: list[dict]


class PivotVerifyRequest(BaseModel):
    """NeMo-Gym's verify request (``responses_create_params``, ``response``) for a pivot row: the row's fields, its
    ``expected_action`` and its prefix. The prompt is echoed, never read: it is not validated item by item."""

    model_config = ConfigDict(extra="allow")  # the pivot row: domain, task_id, tau2_version, retrieval_variant, ...

    responses_create_params: dict
    response: PivotResponse
    expected_action: Action
    tau2_messages: list[dict] = Field(description="The trajectory before the pivot turn: what rebuilds its state.")


@dataclass
class Outcome:
    """What some calls did in a fork: their answers (sorted: a set of parallel calls) and the state they left."""

    answers: list[str]
    state: Any  # in process: the fork itself (its DB compared entry by entry); a release's worker: its digest


@dataclass
class PivotState:
    parent: Any  # the rebuilt episode (never called: every action runs in a fork of it)
    demonstrated: dict[str, Outcome] = field(default_factory=dict)  # expected action's JSON -> its outcome
    # canonical JSON of the parent's entries, for comparing its branches (dies with the state: keyed by object ids)
    json_cache: SnapshotJsonCache = field(default_factory=SnapshotJsonCache)


class PivotStates:
    """Rebuilt pivot states by fingerprint, least recently used dropped first (a worker's episode is ended)."""

    def __init__(self, capacity: int = MAX_PIVOT_STATES):
        self.capacity = capacity
        self._states: OrderedDict[str, PivotState] = OrderedDict()
        self.rebuilt = 0

    def get(self, key: str, build: Any) -> PivotState:
        state = self._states.get(key)
        if state is None:
            state = self._states[key] = PivotState(build())
            self.rebuilt += 1
            while len(self._states) > self.capacity:
                _close(self._states.popitem(last=False)[1].parent)
        self._states.move_to_end(key)
        return state

    def close(self) -> None:
        while self._states:
            _close(self._states.popitem()[1].parent)


def _close(episode: Any) -> None:
    if hasattr(episode, "close"):
        episode.close()


def _state_of(fork: Any) -> Any:
    return fork if isinstance(fork, Episode) else fork.state_digest()


def same_state(left: Any, right: Any, cache: SnapshotJsonCache) -> bool:
    """Whether two outcomes' states are equal as tau2 compares them (agent and user databases)."""
    if isinstance(left, Episode) and isinstance(right, Episode):
        user = [env.user_tools.db if env.user_tools else None for env in (left.env, right.env)]
        return databases_equal(left.env.tools.db, right.env.tools.db, cache) and databases_equal(*user, cache)
    return left == right


def run_in_fork(parent: Any, calls: list[tuple[str, dict]]) -> Outcome:
    """``calls`` run in order in a new fork of ``parent`` (in process: a branch, copying only what the calls
    touch), as the agent's; the fork is ended once read."""
    (fork,) = [parent.branch()] if isinstance(parent, Episode) else parent.fork(1)
    try:
        answers = [call_tool(fork, name, arguments, "assistant").content or "" for name, arguments in calls]
        return Outcome(sorted(answers), _state_of(fork))
    finally:
        _close(fork)


def _named(calls: list[FunctionCallAction]) -> str:
    return ", ".join(call.name for call in calls)


def functional_verdict(state: PivotState, expected: Action, actual: Action | None) -> tuple[float, PivotCategory, str]:
    """``(reward, category, detail)`` of ``actual`` at the pivot whose rebuilt state is ``state``."""
    if actual is None:
        return 0.0, PivotCategory.NO_ACTION, "the response holds no tool call and no text"
    expected_calls, actual_calls = calls_of(expected), calls_of(actual)
    if isinstance(expected, MessageAction):
        if isinstance(actual, MessageAction):
            return 1.0, PivotCategory.MESSAGE, "text where the demonstration spoke"
        return 0.0, PivotCategory.MESSAGE_EXPECTED, f"called {_named(actual_calls)} where the demonstration spoke"
    if not actual_calls:
        return 0.0, PivotCategory.CALL_EXPECTED, f"text where the demonstration called {_named(expected_calls)}"
    arguments = [decoded_arguments(call) for call in actual_calls]
    if any(decoded is None for decoded in arguments):
        bad = next(call for call, decoded in zip(actual_calls, arguments, strict=True) if decoded is None)
        return 0.0, PivotCategory.MALFORMED_CALL, f"{bad.name}'s arguments are not a JSON object"
    key = expected.model_dump_json()
    if key not in state.demonstrated:
        demonstrated = [(call.name, decoded_arguments(call) or {}) for call in expected_calls]
        state.demonstrated[key] = run_in_fork(state.parent, demonstrated)
    wanted = state.demonstrated[key]
    got = run_in_fork(state.parent, [(call.name, args) for call, args in zip(actual_calls, arguments, strict=True)])
    if not same_state(got.state, wanted.state, state.json_cache):
        return 0.0, PivotCategory.DIFFERENT_STATE, f"{_named(actual_calls)} left another database state"
    if got.answers != wanted.answers:
        return 0.0, PivotCategory.DIFFERENT_ANSWER, f"{_named(actual_calls)} answered otherwise"
    return 1.0, PivotCategory.EQUIVALENT, f"{_named(actual_calls)}: the demonstrated state change and answers"


def _parsed(raw: bytes) -> Any:
    """The body's JSON (orjson; the standard library for what orjson refuses: a lone UTF-16 surrogate escaped in the
    model's text, which the call's own tool error answers); a 400 for what is not JSON."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise HTTPException(status_code=400, detail=f"/verify_pivot: body: not JSON ({e})") from None


def _answer(fields: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(fields)
    except orjson.JSONEncodeError:
        return json.dumps(fields).encode()


def pivot_key(row: BaseModel, prefix: list[dict]) -> str:
    """What identifies a pivot's state: its release, domain, variant, task and prefix."""
    extra = row.model_extra or {}
    named = [row.domain, row.task_id, extra.get("tau2_version"), extra.get("retrieval_variant"), prefix]
    return json.dumps(named, sort_keys=True, ensure_ascii=False, default=str)


class PivotRoutes:
    """``/verify_pivot`` of a :class:`~.app.Tau2ResourcesServer` (its release and row checks)."""

    def __init__(self, server: Any, row_model: type[BaseModel]):  # the app's server: typed there, not imported here
        self.server = server
        self.row_model = row_model
        self.states = PivotStates()
        self.seconds = 0.0
        self.verdicts = 0

    def add_to(self, app: FastAPI) -> None:
        app.post("/verify_pivot")(self.verify_pivot)
        app.get("/pivot_stats")(self.pivot_stats)
        app.router.on_shutdown.append(self.states.close)

    async def verify_pivot(self, request: Request) -> Response:
        """NeMo-Gym's verify answer: the request's fields, ``reward``, ``category`` and ``detail``."""
        fields = _parsed(await request.body())
        try:
            body = PivotVerifyRequest.model_validate(fields)
        except ValidationError as e:
            where = ".".join(map(str, e.errors()[0]["loc"])) or "body"
            raise HTTPException(status_code=400, detail=f"/verify_pivot: {where}: {e.errors()[0]['msg']}") from None
        server, started = self.server, time.perf_counter()
        row = stored_row(self.row_model, body.model_extra, "a pivot's row")
        if (problem := server._row_problem(row)) is not None:
            raise HTTPException(status_code=problem[0], detail=problem[1])
        actual = action_of_output(body.response.output)

        def build() -> Any:
            return rebuild(server._release, row.domain, row.task_id, body.tau2_messages)[0]

        try:
            state = self.states.get(pivot_key(row, body.tau2_messages), build)
            reward, category, detail = functional_verdict(state, body.expected_action, actual)
        except TrajectoryError as e:
            raise HTTPException(status_code=400, detail=f"this pivot's state cannot be rebuilt: {e}") from e
        except (domains.UnknownDomainError, domains.UnknownTaskError) as e:
            raise HTTPException(status_code=404, detail=str(e)) from e
        except Tau2RequestError as e:  # the worker refused a replayed call: the prefix is not of its state
            raise HTTPException(status_code=400, detail=f"this pivot's state cannot be rebuilt: {e}") from e
        except Tau2WorkerError as e:
            raise server._infrastructure_error(e) from e
        self.seconds += time.perf_counter() - started
        self.verdicts += 1
        fields.pop("tau2_messages")  # the row's prefix: the caller holds it (the rest is echoed, as NeMo-Gym does)
        verdict = {"reward": reward, "category": category, "detail": detail}
        return Response(content=_answer(fields | verdict), media_type="application/json")

    async def pivot_stats(self) -> dict[str, Any]:
        """Verdicts given, states rebuilt and kept, and the mean verdict time (server side)."""
        kept = len(self.states._states)
        mean_ms = 1000 * self.seconds / self.verdicts if self.verdicts else None
        return {"verdicts": self.verdicts, "states_rebuilt": self.states.rebuilt, "states_kept": kept,
                "mean_verdict_ms": mean_ms}  # fmt: skip
