"""tau2's orchestrator rules for one episode, shared by the agent server and ``Tau2Env``.

The message routing, step counting and limits follow ``tau2/orchestrator/orchestrator.py``: the agent's greeting
opens the conversation; each hop (a user message, an agent message, the environment's answer to all calls of one
message) is a step; agent text goes to the user, user text to the agent, calls to the environment and their
results back to the caller; user text containing ``###STOP###``/``###TRANSFER###``/``###OUT-OF-SCOPE###`` ends
the episode; after every hop not addressed to the environment, ``max_steps`` and ``max_errors`` are checked (and,
as in tau2, override a stop in the same hop). A message with both text and calls is a call (tau2 drops the text
for the user but keeps it in the trajectory). An empty agent or user message ends the episode as tau2's
``agent_error`` / ``user_error`` (tau2 would reject it in ``validate()``).

The agent's hop is the one the caller plays (:func:`agent_said`): the agent server asks its policy model, ``Tau2Env``
takes the researcher's action. Everything else (:func:`play_until_agent`) asks the user simulator and the tau2
session (:class:`Tau2Session`: the resources server over HTTP, or the same session code in process).
"""

import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from nemo_tau2.gym.agent.episode_record import AgentToolCalls
from nemo_tau2.gym.agent.tool_calls import MALFORMED_CALL_ANSWER, ParsedCall
from nemo_tau2.gym.agent.turns import Turn, item_text, message_item
from nemo_tau2.gym.agent.user_strategies import UserSimulatorStats
from nemo_tau2.gym.episode_config import EpisodeSettings

USER_STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")  # tau2.user.base
_NOT_FOUND = re.compile(r"^Error: Tool '.*' not found\.$", re.DOTALL)  # tau2's answer to an unknown tool
TRANSFER_TOOL = "transfer_to_human_agents"
_TOOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}$")
# Routes of the resources server that are not tools: a policy "calling" them gets tau2's unknown-tool error.
_RESERVED_ROUTES = frozenset(
    {"seed_session", "verify", "aggregate_metrics", "session_stats", "end_session", "user_tools"}
)
AGENT, USER, ENV = "agent", "user", "env"


class RowError(ValueError):
    """The row names something the tau2 session refuses (an unknown task): the caller's mistake, a 4xx."""


@dataclass
class EpisodeState:
    row: dict
    domain: str
    task_id: str
    conversation_id: str
    sample_index: int
    request_key: str = field(default_factory=lambda: uuid.uuid4().hex)  # Idempotency-Key prefix of this episode
    resource_requests: int = 0  # requests sent to the resources server so far (the key's suffix)
    resources_url: str = ""  # the resources replica holding this episode's session (chosen once, at seeding)
    verified: bool = False  # the session scored the episode (and ended it)
    cookies: dict[str, dict] = field(default_factory=lambda: {"resources": {}, "policy": {}, "user": {}})
    outputs: list[dict] = field(default_factory=list)  # the policy's view after the row's input
    user_history: list[dict] = field(default_factory=list)  # the user's view (flipped roles)
    user_system_prompt: str = ""
    tau2_version: str | None = None  # the release the resources server seeded the episode with (None: unseeded)
    retrieval_variant: str | None = None  # banking_knowledge: the retrieval variant it was seeded with
    tau2_messages: list[dict] = field(default_factory=list)  # tau2's trajectory (what tau2 v1.0.1 scores)
    user_tools: list[dict] = field(default_factory=list)
    steps: int = 0
    errors: int = 0
    agent_calls: AgentToolCalls = field(
        default_factory=lambda: AgentToolCalls(total=0, malformed=0, hallucinated=0, transfer_to_human_agents=False)
    )
    policy_turns: int = 0
    user_turns: int = 0
    truncated_turns: int = 0
    termination_reason: str | None = None
    truncated_by: str | None = None
    sender: str = AGENT
    receiver: str = USER
    pending_calls: list[tuple[str, ParsedCall]] = field(default_factory=list)
    last_policy_response: dict | None = None
    usage: dict = field(  # the policy answers' usage: summed, and the first and last turn's
        default_factory=lambda: dict.fromkeys(
            ("input_tokens", "output_tokens", "first_input_tokens", "last_input_tokens", "last_output_tokens"), 0
        )
    )
    token_turns: list[tuple[list[int], list[int]]] = field(default_factory=list)
    user_simulator: UserSimulatorStats = field(default_factory=UserSimulatorStats)
    seconds: dict = field(default_factory=lambda: {"policy": 0.0, "user": 0.0, "tools": 0.0, "verify": 0.0})

    @classmethod
    def for_row(cls, row: dict, sample_index: int) -> "EpisodeState":
        return cls(
            row=row,
            domain=str(row["domain"]),
            task_id=str(row["task_id"]),
            conversation_id=f"{uuid.uuid4().hex[:12]}-{sample_index}",
            sample_index=sample_index,
        )

    def row_input(self) -> list[dict]:
        """The row's input items (system prompt, greeting): what the policy saw before ``outputs``."""
        value = self.row["responses_create_params"].get("input") or []
        return [message_item("user", value)] if isinstance(value, str) else list(value)

    def key(self, role: str) -> str:
        """The conversation key sent in a model request's ``user`` field (the fake server scripts by it)."""
        return f"tau2|{self.domain}|{self.task_id}|{self.conversation_id}|{role}"


class Tau2Session(Protocol):
    """The episode's tau2 environment: the resources server over HTTP, or its session code in process."""

    async def seed(self, state: EpisodeState) -> None:
        """Start the task's environment; set ``state.user_system_prompt`` and ``state.user_tools``. Raises
        :class:`RowError` if the session refuses the row."""

    async def call_tool(
        self, state: EpisodeState, name: str, arguments: dict, requestor: str, call_id: str
    ) -> tuple[str, bool]:
        """Run one well-formed call (``requestor`` ``assistant`` or ``user``): tau2's tool message and whether it
        is an error."""

    async def verify(self, state: EpisodeState) -> dict:
        """tau2's reward for the finished episode (the resources server's ``/verify`` answer); ends the session once
        the answer is built, so a failed verify can be retried and a repeated one gets the same verdict."""

    async def end(self, state: EpisodeState) -> None:
        """Drop the session without scoring it; never raises."""


UserTurn = Callable[[EpisodeState], Awaitable[Turn | None]]


def is_user_stop(text: str) -> bool:
    return any(token in text for token in USER_STOP_TOKENS)


def start_conversation(state: EpisodeState) -> None:
    """The agent's greeting (the row's last assistant message) opens the conversation; the user speaks next."""
    greeting = next((item_text(i) for i in reversed(state.row_input()) if i.get("role") == "assistant"), "")
    state.user_history.append(message_item("user", greeting))  # the agent's greeting, as the user sees it
    state.tau2_messages.append({"role": "assistant", "content": greeting})
    state.sender, state.receiver = AGENT, USER


def resume_conversation(state: EpisodeState, messages: list[dict]) -> None:
    """Go on from a stored conversation (tau2's messages before an agent turn, e.g. a pivot's prefix): the agent
    speaks next. The user's own view of it is rebuilt as :func:`play_until_agent` would have built it (the agent's
    texts as ``user``, the user's texts as ``assistant``, the user's device calls and their answers; never the
    agent's calls), and tau2's counters (steps, tool errors) resume where the prefix left them, so ``max_steps`` and
    ``max_errors`` bound the whole episode. ``max_turns`` counts this episode's policy turns. No list, or a message
    whose content is not text, is the row's :class:`RowError`; the rest is checked where the prefix is replayed."""
    if not isinstance(messages, list):
        raise RowError("tau2_messages (the conversation before the turn) must be a list of tau2 messages")
    previous = None
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content") or "", str):
            raise RowError(f"tau2_messages[{index}] is not a tau2 message with text content")
        role, calls = message.get("role"), message.get("tool_calls") or []
        if role == "tool":
            state.errors += bool(message.get("error"))
            state.steps += previous != "tool"  # one hop answers all calls of a message
            if message.get("requestor") == "user":
                output = message.get("content") or ""
                answer = {"type": "function_call_output", "call_id": message.get("id"), "output": output}
                state.user_history.append(answer)
        else:
            state.steps += previous is not None  # the greeting opens the episode; every later message is a hop
            text = message.get("content") or ""
            if role == "user" and calls:
                state.user_history.extend(_call_item(call) for call in calls)
            elif role == "user":
                state.user_history.append(message_item("assistant", text))
            elif not calls:
                state.user_history.append(message_item("user", text))
        previous = role
    state.tau2_messages = list(messages)
    state.sender, state.receiver = (USER if previous == "user" else ENV if previous == "tool" else AGENT), AGENT


def _call_item(call: dict) -> dict:
    """A recorded tau2 call as the Responses ``function_call`` item the user model saw."""
    return {"type": "function_call", "call_id": call.get("id"), "name": call.get("name"),
            "arguments": json.dumps(call.get("arguments") or {}, ensure_ascii=False)}  # fmt: skip


def agent_said(state: EpisodeState, turn: Turn | None, settings: EpisodeSettings) -> None:
    """Route the agent's turn (already in ``state.outputs``; None if it was empty), then apply the limits."""
    if _route(state, turn, AGENT, "agent_error"):
        state.user_history.append(message_item("user", turn.text))
        state.receiver = USER
    _end_of_hop(state, settings)


async def play_until_agent(
    state: EpisodeState, user_turn: UserTurn, session: Tau2Session, settings: EpisodeSettings
) -> None:
    """Hops (user messages, tool calls) until the agent must speak or the episode ends."""
    while state.termination_reason is None and state.receiver != AGENT:
        if state.receiver == USER:
            turn = await user_turn(state)
            if _route(state, turn, USER, "user_error"):
                state.outputs.append(message_item("user", turn.text))
                state.receiver = AGENT
                if is_user_stop(turn.text):
                    state.termination_reason = "user_stop"
        else:
            await run_calls(state, session, state.pending_calls, requestor=state.sender)
            state.sender, state.receiver = ENV, state.sender
        _end_of_hop(state, settings)


def _route(state: EpisodeState, turn: Turn | None, sender: str, error_reason: str) -> bool:
    """The one routing rule for both parties: no turn ends the episode with ``error_reason``, tool calls go to the
    environment; True when the turn is text for the other party (the caller delivers it)."""
    state.sender = sender
    if turn is None:
        state.termination_reason = error_reason
        return False
    _record_message(state, turn, "assistant" if sender == AGENT else "user")
    if turn.calls:
        state.pending_calls, state.receiver = turn.calls, ENV
        return False
    return True


def _record_message(state: EpisodeState, turn: Turn, role: str) -> None:
    """The turn as the message tau2's orchestrator records (text and calls in one message, as tau2 keeps them)."""
    if not turn.calls:
        state.tau2_messages.append({"role": role, "content": turn.text})
        return
    calls = [
        {"id": call_id, "name": call.name, "arguments": call.arguments or {}, "requestor": role}
        for call_id, call in turn.calls
    ]
    state.tau2_messages.append({"role": role, "content": turn.text or None, "tool_calls": calls})


def _end_of_hop(state: EpisodeState, settings: EpisodeSettings) -> None:
    state.steps += 1
    if state.receiver == ENV:
        return
    if state.steps >= settings.max_steps:
        state.termination_reason, state.truncated_by = "max_steps", "max_steps"
    if state.errors >= settings.max_errors:
        state.termination_reason, state.truncated_by = "too_many_errors", None
    if (
        state.termination_reason is None
        and state.receiver == AGENT
        and settings.max_turns is not None
        and state.policy_turns >= settings.max_turns
    ):
        state.termination_reason, state.truncated_by = "max_steps", "max_turns"


async def run_calls(
    state: EpisodeState, session: Tau2Session, calls: list[tuple[str, ParsedCall]], requestor: str
) -> None:
    """Execute one message's calls in order; each answer goes to the caller's history, each error counts."""
    history = state.outputs if requestor == AGENT else state.user_history
    started = time.perf_counter()
    for call_id, call in calls:
        if call.error is not None:
            output, failed = f"{MALFORMED_CALL_ANSWER}: {call.error}", True
        elif not _TOOL_NAME.match(call.name) or call.name in _RESERVED_ROUTES:
            output, failed = f"Error: Tool '{call.name}' not found.", True  # tau2's wording
        else:
            side = "assistant" if requestor == AGENT else "user"
            output, failed = await session.call_tool(state, call.name, call.arguments, side, call_id)
        state.errors += failed
        if requestor == AGENT:
            _count_agent_call(state.agent_calls, call, output, failed)
        history.append({"type": "function_call_output", "call_id": call_id, "output": output})
        side = "assistant" if requestor == AGENT else "user"
        state.tau2_messages.append(
            {"role": "tool", "id": call_id, "content": output, "requestor": side, "error": failed}
        )
    state.seconds["tools"] += time.perf_counter() - started


def _count_agent_call(counts: AgentToolCalls, call: ParsedCall, output: str, failed: bool) -> None:
    counts.total += 1
    counts.malformed += call.error is not None
    counts.hallucinated += call.error is None and failed and bool(_NOT_FOUND.match(output))
    counts.transfer_to_human_agents |= call.error is None and call.name == TRANSFER_TOOL


async def verify(state: EpisodeState, session: Tau2Session) -> dict:
    started = time.perf_counter()
    result = await session.verify(state)
    state.verified = True
    state.seconds["verify"] += time.perf_counter() - started
    return result


def final_response(state: EpisodeState) -> dict:
    """The episode as one Responses object: the policy's whole output, the last policy answer's settings."""
    base = dict(state.last_policy_response or {})
    params = state.row["responses_create_params"]
    return {
        "id": base.get("id") or f"resp_{uuid.uuid4().hex}",
        "created_at": base.get("created_at") or int(time.time()),
        "model": base.get("model") or "",
        "object": "response",
        "output": state.outputs,
        "parallel_tool_calls": base.get("parallel_tool_calls", params.get("parallel_tool_calls", True)),
        "tool_choice": base.get("tool_choice") or "auto",
        "tools": base.get("tools") or params.get("tools") or [],
        "temperature": base.get("temperature"),
        "top_p": base.get("top_p"),
        "usage": {
            "input_tokens": state.usage["input_tokens"],
            "output_tokens": state.usage["output_tokens"],
            "total_tokens": state.usage["input_tokens"] + state.usage["output_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }
