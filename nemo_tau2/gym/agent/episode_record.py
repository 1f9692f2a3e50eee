"""The episode record: what the agent's ``/run`` adds to tau2's verdict, one typed model from the agent to the metrics.

The agent server builds an :class:`EpisodeData` for every episode (played or failed) and merges it into its answer;
the rollout side reads it back with :meth:`EpisodeData.from_response` (a missing or renamed field is an error, not a
silent 0), carries the same field names onto ``RolloutResult`` and ``rollouts.jsonl``, and the metrics read those
names again. Token contiguity is computed once, by the agent; the status is one enum, :class:`EpisodeStatus`.

Every number at the top level of an answer is a metric (docs/nemo-rl.md lists them): NeMo-RL logs each numeric
top-level key of a Gym result as ``<agent>/<key>/{mean,max,...}``. So identity stays out of them (the sample is the
caller's: ``sample_index``/``_ng_rollout_index`` of its row, and the tail of ``conversation_id``), and the
termination and the infrastructure failure are flags beside tau2's components (:func:`metric_flags`).
"""

import json
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

#: The termination reasons an episode of this agent can end with (tau2's, both releases): one 0/1 flag each in every
#: answer, ``termination_<reason>``, so that their means are the rates of each ending.
TERMINATIONS = ("user_stop", "agent_stop", "max_steps", "too_many_errors", "agent_error", "user_error")


class EpisodeStatus(StrEnum):
    """``ok``: the episode was played and scored. ``infrastructure_error``: a server failed; never scored."""

    OK = "ok"
    INFRASTRUCTURE_ERROR = "infrastructure_error"


class FailureKind(StrEnum):
    """How an episode ended, one kind per episode, the first that applies in this order: ``infrastructure`` (a
    server failed; never scored), ``tool_error_cap`` (tau2's ``too_many_errors``), ``max_steps`` (a step or turn
    limit), ``empty_message`` (an empty agent or user message: tau2's ``agent_error``/``user_error``), ``transfer``
    (the policy called ``transfer_to_human_agents``), ``malformed_tool_call`` (a policy call whose JSON or arguments
    could not be read), ``hallucinated_tool`` (a policy call of a tool that does not exist), ``ended_normally``."""

    INFRASTRUCTURE = "infrastructure"
    TOOL_ERROR_CAP = "tool_error_cap"
    MAX_STEPS = "max_steps"
    EMPTY_MESSAGE = "empty_message"
    TRANSFER = "transfer"
    MALFORMED_TOOL_CALL = "malformed_tool_call"
    HALLUCINATED_TOOL = "hallucinated_tool"
    ENDED_NORMALLY = "ended_normally"


class AgentToolCalls(BaseModel):
    """The policy's tool calls in one episode (the simulated user's device calls are not counted)."""

    model_config = ConfigDict(extra="forbid")

    total: int = Field(ge=0, description="Every call the policy made, well-formed or not.")
    malformed: int = Field(ge=0, description="Calls whose JSON or arguments could not be read.")
    hallucinated: int = Field(ge=0, description="Calls of a tool that does not exist (tau2's 'Tool ... not found').")
    transfer_to_human_agents: bool = Field(description="Whether the policy called transfer_to_human_agents.")


_ENDINGS = {
    "too_many_errors": FailureKind.TOOL_ERROR_CAP,
    "max_steps": FailureKind.MAX_STEPS,
    "agent_error": FailureKind.EMPTY_MESSAGE,
    "user_error": FailureKind.EMPTY_MESSAGE,
}


def failure_kind(infrastructure: bool, termination_reason: str | None, calls: AgentToolCalls) -> FailureKind:
    """The episode's :class:`FailureKind` (the first that applies, in the enum's order)."""
    if infrastructure:
        return FailureKind.INFRASTRUCTURE
    if termination_reason in _ENDINGS:
        return _ENDINGS[termination_reason]
    if calls.transfer_to_human_agents:
        return FailureKind.TRANSFER
    if calls.malformed:
        return FailureKind.MALFORMED_TOOL_CALL
    if calls.hallucinated:
        return FailureKind.HALLUCINATED_TOOL
    return FailureKind.ENDED_NORMALLY


#: Where a stored rollout's ``response`` carries the episode's trajectory (Responses ``metadata``: text values), so
#: that a rollout re-scored from its row and ``response`` alone (NeMo-Gym >= 0.7's ``gym eval reverify``) has it.
TRAJECTORY_KEY, TERMINATION_KEY = "tau2_messages", "tau2_termination_reason"


def trajectory_metadata(tau2_messages: list[dict], termination_reason: str | None) -> dict[str, str]:
    """The ``metadata`` of an episode's final ``response``: its trajectory (JSON text) and termination."""
    return {TRAJECTORY_KEY: json.dumps(tau2_messages, ensure_ascii=False), TERMINATION_KEY: termination_reason or ""}


def trajectory_of(metadata: dict[str, str] | None) -> tuple[Any, str | None]:
    """``(tau2_messages, termination_reason)`` from a stored ``response``'s ``metadata``; ``(None, None)`` without
    them, and text that is not JSON as it stands (the re-scoring refuses it, saying why)."""
    if not metadata or TRAJECTORY_KEY not in metadata:
        return None, None
    try:
        messages = json.loads(metadata[TRAJECTORY_KEY])
    except json.JSONDecodeError:
        messages = metadata[TRAJECTORY_KEY]
    return messages, metadata.get(TERMINATION_KEY) or None


class TokenContiguity(BaseModel):
    """Whether each policy turn's prompt ids extend the previous turn's prompt + generation (training needs it)."""

    model_config = ConfigDict(extra="forbid")

    checked_turns: int = Field(ge=0, description="Policy turns with token ids.")
    breaks: list[str] = Field(description="Each break, readable (turn, position, why).")
    first_break_turn: int | None = Field(description="The first turn that does not extend the previous; None: none.")


class EpisodeData(BaseModel):
    """The agent's episode fields (beside tau2's reward, components and transcript in the same answer)."""

    model_config = ConfigDict(extra="forbid")

    status: EpisodeStatus
    domain: str
    task_id: str
    tau2_version: str | None = Field(description="The tau2 release that seeded the episode (None: never seeded).")
    retrieval_variant: str | None = Field(
        default=None, description="banking_knowledge: tau2's retrieval variant it was played with (else None)."
    )
    conversation_id: str
    policy_model: str | None = Field(description="The model that played the policy (as its server names it).")
    error: str | None = Field(description="The infrastructure failure, when status is infrastructure_error.")
    cause: str | None = Field(
        default=None,
        description="``error`` without where it happened (addresses, ids): the same words for every episode one "
        "failure hits, what summaries count.",
    )
    unreachable: str | None = Field(
        default=None,
        description="The server (scheme://host:port) that gave the failed episode no answer at all, if that was the "
        "failure: on a Ray cluster the head names its loss once the watcher declares it.",
    )
    termination_reason: str | None = Field(description="tau2's termination reason (None: the episode failed).")
    truncated_by: str | None = Field(description="The limit that cut the episode (max_steps, max_turns), if any.")
    tau2_failure_kind: FailureKind = Field(
        description="How the episode ended (see FailureKind). Not NeMo-Gym >= 0.7's own failure_kind, which names an "
        "infrastructure failure in its vocabulary and is unset on a sample measured normally."
    )
    agent_tool_calls: AgentToolCalls
    num_turns: int = Field(ge=0, description="Policy turns (model calls of the policy).")
    num_user_turns: int = Field(ge=0)
    num_steps: int = Field(ge=0, description="tau2's steps: every message hop.")
    num_tool_errors: int = Field(ge=0, description="Tool calls that ended in an error (what max_errors counts).")
    num_truncated_generations: int = Field(ge=0, description="Policy generations cut at max_output_tokens.")
    prompt_tokens: int = Field(ge=0, description="The first policy turn's prompt.")
    generation_tokens: int = Field(ge=0, description="Every token the policy generated.")
    total_tokens: int = Field(ge=0, description="The last policy turn's prompt + generation: the whole sequence.")
    token_contiguity: TokenContiguity
    user_simulator: dict[str, Any] = Field(description="The user strategy's model calls and format fallbacks.")
    timings: dict[str, float] = Field(description="Seconds per party (policy, user, tools, verify) and total.")

    @classmethod
    def from_response(cls, body: dict[str, Any]) -> "EpisodeData":
        """The episode fields of an agent's ``/run`` answer; raises if one is missing or malformed."""
        return cls.model_validate({name: body[name] for name in cls.model_fields if name in body})


def metric_flags(data: EpisodeData) -> dict[str, bool]:
    """What an answer adds to its record as 0/1 metrics, derived from it (never read back): ``infrastructure_error``
    (the status) and ``termination_<reason>`` for each of :data:`TERMINATIONS` (all false for a failed episode)."""
    return {"infrastructure_error": data.status == EpisodeStatus.INFRASTRUCTURE_ERROR} | {
        f"termination_{reason}": data.termination_reason == reason for reason in TERMINATIONS
    }
