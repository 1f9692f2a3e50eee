"""One tau2 episode's environment: the task's initial state applied, every tool call executed and logged.

Tool calls go through tau2's own ``Environment.get_response`` (the boundary where tau2 turns any exception into
an ``Error: ...`` tool message), in the order they happen. That is exactly the replay tau2's evaluator performs
on a finished trajectory, so the live environment *is* tau2's "predicted environment" and needs no replay.
"""

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from tau2.data_model.message import AssistantMessage, Message, ToolCall, ToolMessage, UserMessage
from tau2.data_model.tasks import Task
from tau2.environment.environment import Environment

from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.session_db import CopyOnAccessDict

Requestor = Literal["assistant", "user"]


@dataclass
class ToolCallRecord:
    """One executed tool call and tau2's answer to it."""

    call: ToolCall
    result: ToolMessage


def apply_initial_state(env: Environment, task: Task) -> None:
    """Apply the task's initialization data, initialization actions and message history, as tau2 does."""
    state = task.initial_state
    env.set_state(
        initialization_data=state.initialization_data if state else None,
        initialization_actions=state.initialization_actions if state else None,
        message_history=history_messages(task),
    )
    env.sync_tools()  # the orchestrator syncs once more after initialising


def history_messages(task: Task) -> list[Message]:
    """The task's pre-written message history (tau2 starts the conversation from it instead of the greeting)."""
    if task.initial_state is None or not task.initial_state.message_history:
        return []
    return list(task.initial_state.message_history)


@dataclass
class Episode:
    """The environment of one episode of one task, private to that episode."""

    domain: str
    task: Task
    env: Environment
    tool_log: list[ToolCallRecord] = field(default_factory=list)
    num_tool_errors: int = 0
    last_used: float = field(default_factory=time.monotonic)

    @classmethod
    def start(cls, domain: str, task_id: str) -> "Episode":
        task = domains.get_task(domain, task_id)
        env = domains.new_environment(domain)
        apply_initial_state(env, task)
        return cls(domain=domain, task=task, env=env)

    def fork(self, n: int) -> list["Episode"]:
        """``n`` independent episodes in this one's state: each its environment deep-copied, which for a DB's
        collections copies only the entries this episode holds of its own (the rest stay the domain snapshot's,
        shared and never written): copy-on-write over this episode's state, never its objects. Each gets the tool
        log so far."""
        return [Episode(self.domain, self.task, copy.deepcopy(self.env), list(self.tool_log), self.num_tool_errors)
                for _ in range(n)]  # fmt: skip

    def branch(self) -> "Episode":
        """A fork that reads this episode's state in place: each DB collection a copy-on-access layer over this
        episode's (an entry is copied from it the first time the branch looks it up), the rest deep-copied. Forking
        costs what the branch touches, not what this episode owns; this episode must not change while the branch
        lives (a pivot's rebuilt state, which only ever answers through branches)."""
        memo: dict[int, Any] = {}
        for tools in (self.env.tools, self.env.user_tools):
            db = getattr(tools, "db", None)
            for name in type(db).model_fields if db is not None else ():
                if isinstance(value := getattr(db, name), CopyOnAccessDict):
                    memo[id(value)] = CopyOnAccessDict(value)
        return Episode(
            self.domain, self.task, copy.deepcopy(self.env, memo), list(self.tool_log), self.num_tool_errors
        )

    def call_tool(
        self, name: str, arguments: dict, requestor: Requestor = "assistant", call_id: str = ""
    ) -> ToolMessage:
        """Run one tool call through tau2's boundary; errors come back as ``Error: ...`` tool messages."""
        call = ToolCall(id=call_id, name=name, arguments=arguments, requestor=requestor)
        result = self.env.get_response(call)
        self.tool_log.append(ToolCallRecord(call=call, result=result))
        if result.error:
            self.num_tool_errors += 1
        self.last_used = time.monotonic()
        return result

    def record_failed_call(self, name: str, requestor: Requestor, message: str) -> ToolMessage:
        """Count a call tau2 could not even represent (arguments not a JSON object) as a tool error."""
        self.num_tool_errors += 1
        self.last_used = time.monotonic()
        return ToolMessage(id="", role="tool", content=f"Error: {message}", requestor=requestor, error=True)

    def tool_call_messages(self) -> list[Message]:
        """The executed calls as a tau2 trajectory fragment: each call message followed by its tool message."""
        messages: list[Message] = []
        for record in self.tool_log:
            sender = AssistantMessage if record.call.requestor == "assistant" else UserMessage
            messages.append(sender(role=record.call.requestor, tool_calls=[record.call]))
            messages.append(record.result)
        return messages
