"""Scripts for tau2 episodes: an oracle policy that plays a task's gold actions and a scripted user.

Keys have the form ``tau2|<domain>|<task_id>|<episode_id>|<role>`` (:func:`tau2_key`), role ``policy``, ``user``,
``user_check`` or ``user_reflect``; task ids may contain ``|`` (telecom's do), so the key is split two fields from
the left and two from the right.

- **Oracle policy**: per gold action in order, an assistant action becomes a tool call turn and a user action a
  text turn asking for it with a machine-readable marker (:func:`device_action_request`); then a closing text with
  every ``communicate_info`` string verbatim that asks whether there is anything else.
- **Scripted user**: states the request from the scenario, performs a marked device action as a tool call (one its
  request offers), says "Done." after the tool result, and ends (``###STOP###`` by default) when the agent closes
  or after an unrecognised request.
- **User strategies**: react-formatted messages when the user's system prompt asks for them, ``user_check`` and
  ``user_reflect`` calls answered in their formats (:class:`UserScriptConfig` ``failed_checks``, ``unformatted``).
- **Variants** (:class:`PolicyScriptConfig`): ``do_nothing`` closes at once, ``wrong_argument`` corrupts one
  argument of the first write action, ``transfer`` transfers to a human agent (the user answers ``###TRANSFER###``),
  ``search_first`` (banking_knowledge) searches the knowledge base for the first required document first.
  ``variant_every = n`` plays the variant only for samples whose index ``i`` has ``i % n == n - 1`` (``n = 2``:
  every other sample, indexes 1, 3, 5, ...) and the oracle for the others; the sample index is the trailing integer
  of the key's episode id (``"7"``, ``"ep-7"``, ``"rollout_7"`` -> 7).

tau2 is imported on first use (it takes seconds), so servers that never see a tau2 key never pay for it.
"""

import functools
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

import nemo_tau2.testing.chat_tokens as chat_tokens
from nemo_tau2.gym.agent import user_strategies as strategies
from nemo_tau2.testing.release_tasks import release_task, required_documents
from nemo_tau2.testing.scripts import (
    DEFAULT_CLOSING_TEXT,
    ScriptError,
    ScriptRequest,
    Turn,
    WhenExhausted,
    count_assistant_messages,
)

if TYPE_CHECKING:
    from tau2.data_model.tasks import Task

TAU2_KEY_PREFIX = "tau2"
Role = Literal["policy", "user", "user_check", "user_reflect"]
ROLES = ("policy", "user", "user_check", "user_reflect")
# tau2's user stop tokens (tau2.user.base STOP / TRANSFER / OUT_OF_SCOPE); a test checks they still match.
STOP = "###STOP###"
TRANSFER = "###TRANSFER###"
OUT_OF_SCOPE = "###OUT-OF-SCOPE###"

DEVICE_ACTION_PREFIX = "Please perform this action on your device: "
_ACTION_PATTERN = re.compile(r"<action>(.*?)</action>", re.DOTALL)
_TRANSFER_PATTERN = re.compile(r"\btransferr?(ing|ed)? you\b", re.IGNORECASE)
_CLOSING_PATTERN = re.compile(r"\banything else\b", re.IGNORECASE)
_TRAILING_INT = re.compile(r"(\d+)$")
TRANSFER_TEXT = "I am transferring you to a human agent now. Please hold on."
UNRECOGNISED_PREFIX = "Sorry, I don't understand what you need from me."


@dataclass(frozen=True)
class Tau2Key:
    """A parsed tau2 conversation key."""

    domain: str
    task_id: str
    episode_id: str
    role: Role

    @classmethod
    def parse(cls, key: str) -> "Tau2Key | None":
        """None if ``key`` is not a tau2 key; :class:`ScriptError` if it is one but malformed."""
        if not key.startswith(TAU2_KEY_PREFIX + "|"):
            return None
        head = key.split("|", 2)
        tail = head[-1].rsplit("|", 2) if len(head) == 3 else []
        if len(tail) != 3 or not all((head[1], *tail)):
            raise ScriptError(f"malformed tau2 key {key!r}; expected 'tau2|<domain>|<task_id>|<episode_id>|<role>'")
        task_id, episode_id, role = tail
        if role not in ROLES:
            raise ScriptError(f"tau2 key {key!r} has role {role!r}; expected one of {', '.join(ROLES)}")
        return cls(head[1], task_id, episode_id, role)

    @property
    def sample_index(self) -> int | None:
        """The trailing integer of the episode id, if any."""
        match = _TRAILING_INT.search(self.episode_id)
        return int(match.group(1)) if match else None

    def __str__(self) -> str:
        return "|".join((TAU2_KEY_PREFIX, self.domain, self.task_id, self.episode_id, self.role))


def tau2_key(domain: str, task_id: str, episode_id: str | int, role: Role) -> str:
    """The conversation key for one side of one tau2 episode (what the agent puts in the request's ``user``)."""
    for name, value in (("domain", domain), ("episode_id", str(episode_id))):
        if "|" in value or not value:
            raise ValueError(f"{name} {value!r} must be non-empty and must not contain '|'")
    if role not in ROLES:
        raise ValueError(f"role {role!r} must be one of {', '.join(ROLES)}")
    return str(Tau2Key(domain, str(task_id), str(episode_id), role))


class PolicyScriptConfig(BaseModel):
    """How the scripted policy plays tau2 keys with role ``policy``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    variant: Literal["oracle", "do_nothing", "wrong_argument", "transfer", "search_first"] = Field(
        "oracle",
        description="oracle plays the gold actions; do_nothing closes at once; wrong_argument corrupts one argument "
        "of the first write action; transfer hands the customer to a human agent; search_first (a knowledge "
        "domain's) searches for the first required document, then plays the oracle",
    )
    variant_every: int = Field(
        1,
        ge=1,
        description="play the variant for samples with index % variant_every == variant_every - 1 and the oracle "
        "for the others (1: every sample, 2: every other sample); the index is the episode id's trailing integer",
    )
    token_consistent: bool = Field(True, description="false makes the policy's generations token-inconsistent")
    when_exhausted: WhenExhausted = "repeat_closing"


class UserScriptConfig(BaseModel):
    """How the scripted user plays tau2 keys with role ``user``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ending: Literal["###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"] = Field(
        STOP, description="what the user says to end the conversation (after the agent's closing message)"
    )
    max_unrecognised: int = Field(
        1, ge=0, description="agent messages answered with 'I don't understand' before the user ends the conversation"
    )
    unformatted: tuple[Literal["react", "check", "reflection"], ...] = Field(
        (),
        description="user-strategy outputs written without their format (a user model that cannot follow it): "
        "react (the message without thought and label), check (no yes/no verdict), reflection (no rewritten "
        "message); the others follow nemo_tau2.gym.agent.user_strategies' formats",
    )
    failed_checks: int = Field(0, ge=0, description="checks answered 'no' in each episode (its first ones)")


class Tau2ScriptsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: PolicyScriptConfig = PolicyScriptConfig()
    user: UserScriptConfig = UserScriptConfig()
    release_tasks: str | None = Field(None, description="a later release's tasks, played instead (release_tasks.py)")


# ======================================================================================================== oracle


def device_action_request(name: str, arguments: dict[str, Any]) -> str:
    """The oracle's request for a user-side action, with the marker the scripted user parses."""
    return f"{DEVICE_ACTION_PREFIX}<action>{json.dumps({'name': name, 'arguments': arguments})}</action>"


def parse_device_action(text: str) -> tuple[str, dict[str, Any]] | str | None:
    """The ``(name, arguments)`` marked in an agent message, None if unmarked, or a string saying why the marker
    is malformed."""
    match = _ACTION_PATTERN.search(text)
    if match is None:
        return None
    try:
        action = json.loads(match.group(1))
    except json.JSONDecodeError as e:
        return f"the action marker is not JSON ({e})"
    if not isinstance(action, dict) or not isinstance(action.get("name"), str):
        return "the action marker has no name"
    arguments = action.get("arguments", {})
    if not isinstance(arguments, dict):
        return "the action marker's arguments are not an object"
    return action["name"], arguments


def closing_text(task: "Task") -> str:
    """The oracle's last message: every ``communicate_info`` string verbatim, then the closing question."""
    infos = (task.evaluation_criteria.communicate_info or []) if task.evaluation_criteria else []
    said = "".join(f" {info}." for info in infos)
    return f"Thank you for your patience.{said} {DEFAULT_CLOSING_TEXT}"


def _gold_actions(task: "Task") -> list:
    return list(task.evaluation_criteria.actions or []) if task.evaluation_criteria else []


def _action_turn(name: str, arguments: dict[str, Any], requestor: str) -> Turn:
    return Turn.say(device_action_request(name, arguments)) if requestor == "user" else Turn.call(name, arguments)


def oracle_turns(task: "Task") -> list[Turn]:
    turns = [_action_turn(action.name, action.arguments, action.requestor) for action in _gold_actions(task)]
    return [*turns, Turn.say(closing_text(task))]


def corrupt_arguments(value: Any) -> tuple[Any, bool]:
    """``value`` with its first scalar changed, and whether anything changed."""
    if isinstance(value, bool):
        return not value, True
    if isinstance(value, int | float):
        return value + 1, True
    if isinstance(value, str):
        return value + "_wrong", True
    if isinstance(value, list):
        for index, item in enumerate(value):
            new, changed = corrupt_arguments(item)
            if changed:
                return [*value[:index], new, *value[index + 1 :]], True
    if isinstance(value, dict):
        for name, item in value.items():
            new, changed = corrupt_arguments(item)
            if changed:
                return {**value, name: new}, True
    return value, False


@functools.cache
def _write_tools(domain: str) -> frozenset[tuple[str, str]]:
    from tau2.environment.toolkit import ToolType

    from nemo_tau2.tau2_env import domains

    env = domains.new_environment(domain)
    pairs = set()
    for requestor, toolkit in (("assistant", env.tools), ("user", env.user_tools)):
        for name in toolkit.get_tools() if toolkit is not None else ():
            if toolkit.tool_type(name) == ToolType.WRITE:
                pairs.add((requestor, name))
    return frozenset(pairs)


def wrong_argument_turns(domain: str, task: "Task") -> list[Turn]:
    """The oracle's turns with one argument of the first write action (that has arguments) corrupted."""
    actions = _gold_actions(task)
    write_tools = _write_tools(domain)
    for index, action in enumerate(actions):
        if (action.requestor, action.name) not in write_tools:
            continue
        arguments, changed = corrupt_arguments(dict(action.arguments))
        if changed:
            turns = oracle_turns(task)
            turns[index] = _action_turn(action.name, arguments, action.requestor)
            return turns
    raise ScriptError(f"{domain} task {task.id!r} has no write action with an argument to get wrong")


def search_first_turns(domain: str, task: "Task") -> list[Turn]:
    """The oracle after a ``KB_search`` by the words of the first required document's id (``doc_a_b_001``: "a b")."""
    words = re.sub(r"^doc_|_\d+$", "", (required_documents(domain, task.id) or ["doc_fees"])[0]).replace("_", " ")
    return [Turn.call("KB_search", {"query": words}), *oracle_turns(task)]


def transfer_turns(domain: str) -> list[Turn]:
    from nemo_tau2.tau2_env import domains

    if "transfer_to_human_agents" not in domains.agent_tool_names(domain):
        raise ScriptError(f"domain {domain!r} has no transfer_to_human_agents tool for the transfer variant")
    summary = {"summary": "The customer needs help that I cannot give; transferring to a human agent."}
    return [Turn.call("transfer_to_human_agents", summary), Turn.say(TRANSFER_TEXT)]


@functools.lru_cache(maxsize=4096)
def policy_turns(domain: str, task_id: str, variant: str) -> tuple[Turn, ...]:
    """What the scripted policy says in an episode of the task (a :class:`PolicyScriptConfig` variant)."""
    task = task_of(domain, task_id)
    if variant in ("do_nothing", "transfer"):
        return (Turn.say(DEFAULT_CLOSING_TEXT),) if variant == "do_nothing" else tuple(transfer_turns(domain))
    if variant == "wrong_argument":
        return tuple(wrong_argument_turns(domain, task))
    return tuple(search_first_turns(domain, task) if variant == "search_first" else oracle_turns(task))


def task_of(domain: str, task_id: str) -> "Task":
    from nemo_tau2.tau2_env import domains

    if (task := release_task(domain, task_id)) is not None:
        return task
    try:
        return domains.get_task(domain, task_id)
    except ValueError as e:  # UnknownDomainError, UnknownTaskError
        raise ScriptError(str(e)) from e


# ================================================================================================ scripted user


class ScriptedUser:
    """A deterministic tau2 user: reacts to the last message of the (role-flipped) conversation."""

    token_consistent = True

    def __init__(self, domain: str, task: "Task", config: UserScriptConfig) -> None:
        self.config = config
        self.opening = opening_text(task)
        self.known_info = _instruction_field(task, "known_info")

    def respond(self, request: ScriptRequest) -> Turn:
        turn = self._respond(request)
        system = _text(request.messages[0]) if request.messages and request.messages[0].get("role") == "system" else ""
        if turn.tool_calls or strategies.REACT_INSTRUCTIONS not in system:
            return turn
        if "react" in self.config.unformatted:
            return turn
        thought = "The agent is waiting for my answer; I follow my instructions."
        return Turn.say(f"{strategies.THOUGHT_LABEL}\n{thought}\n{strategies.MESSAGE_LABEL}\n{turn.text}")

    def _respond(self, request: ScriptRequest) -> Turn:
        opening = request.turn_index == 0 and not count_assistant_messages(request.messages)  # said nothing yet
        if opening or not request.messages:  # (a conversation played on from a stored one has: it reacts)
            return Turn.say(self.opening)
        last = request.messages[-1]
        if last.get("role") == "tool":
            result = _text(last)
            if result.startswith("Error"):
                return Turn.say(f"I tried, but my device says: {result}")
            return Turn.say("Done.")
        agent_text = _text(last) if last.get("role") == "user" else ""
        action = parse_device_action(agent_text)
        if isinstance(action, tuple):
            name, arguments = action
            if name in _offered_tools(request):
                return Turn.call(name, arguments)
            return Turn.say(f"I can't do {name!r} on my phone. {self.config.ending}")
        if isinstance(action, str):
            return Turn.say(f"I can't follow that request: {action}. {self.config.ending}")
        if _TRANSFER_PATTERN.search(agent_text):
            return Turn.say(TRANSFER)
        if _CLOSING_PATTERN.search(agent_text):
            return Turn.say(self.config.ending)
        return self._unrecognised(request)

    def _unrecognised(self, request: ScriptRequest) -> Turn:
        said = sum(
            1
            for message in request.messages
            if message.get("role") == "assistant" and _own_message(_text(message)).startswith(UNRECOGNISED_PREFIX)
        )
        if said >= self.config.max_unrecognised:
            return Turn.say(self.config.ending)
        known = f" What I know: {self.known_info}" if self.known_info else ""
        return Turn.say(f"{UNRECOGNISED_PREFIX}{known}")


def _offered_tools(request: ScriptRequest) -> set[str]:
    """The user's device tools: those its request offers (the episode's, as the resources server seeded them)."""
    return {(tool.get("function") or tool).get("name") for tool in request.tools or ()}


def _own_message(text: str) -> str:
    """The user's own earlier message without its react thought."""
    return strategies.react_message(text) or text


class ScriptedReviewer:
    """Answers the user simulator's check (``user_check``) and reflection (``user_reflect``) calls of one episode:
    the first ``failed_checks`` checks say no, later ones yes; a reflection rewrites the message as it was."""

    token_consistent = True

    def __init__(self, role: Role, config: UserScriptConfig) -> None:
        self.role = role
        self.config = config
        self.checks = 0

    def respond(self, request: ScriptRequest) -> Turn:
        prompt = _text(request.messages[-1]) if request.messages else ""
        if self.role == "user_check":
            self.checks += 1
            if "check" in self.config.unformatted:
                return Turn.say("It reads well to me.")
            return Turn.say("no" if self.checks <= self.config.failed_checks else "yes")
        if "reflection" in self.config.unformatted:
            return Turn.say("The customer should be clearer.")
        candidate = strategies.quoted_candidate(prompt) or "Could you say that again?"
        reflection = "The message could be clearer."
        return Turn.say(f"{strategies.REFLECTION_LABEL}\n{reflection}\n{strategies.REWRITE_LABEL}\n{candidate}")


def _text(message: dict[str, Any]) -> str:
    """A message's text (content parts joined); a message the template could not render reads as empty."""
    try:
        return chat_tokens.content_text(message)
    except chat_tokens.TemplateError:
        return ""


def _instruction_field(task: "Task", name: str) -> str | None:
    instructions = task.user_scenario.instructions
    value = getattr(instructions, name, None) if not isinstance(instructions, str) else None
    return " ".join(value.split()) if value else None


def opening_text(task: "Task") -> str:
    """The user's first message: the scenario's reason for calling (and what the user knows)."""
    instructions = task.user_scenario.instructions
    if isinstance(instructions, str):
        return f"Hi! {' '.join(instructions.split())}"
    known = _instruction_field(task, "known_info")
    reason = _instruction_field(task, "reason_for_call")
    return f"Hi! {reason}" + (f" {known}" if known else "")
