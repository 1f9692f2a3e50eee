"""A tau2 trajectory as JSON, message by message, in the shape tau2's orchestrator records it.

What a release's evaluator reads (``SimulationRun.messages``): texts of the assistant and the user, each tool call
as a message of its requestor carrying ``tool_calls``, followed by the tool's answer (``role: tool``, same ``id``).
The NL-assertion judge of tau2 v1.0.1 reads every message's ``role: content``, so order and shape are part of the
reward, and the worker replays the calls strictly (a recorded answer that differs from the replay is an error).
"""

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["assistant", "user"]


@dataclass
class Trajectory:
    """Messages appended as they happen; :attr:`messages` is what ``Tau2Worker.verify`` takes."""

    messages: list[dict[str, Any]] = field(default_factory=list)

    def text(self, role: Role, content: str) -> None:
        self.messages.append({"role": role, "content": content})

    def tool_call(self, requestor: Role, call_id: str, name: str, arguments: dict, answer: dict) -> None:
        """One call and its answer (``{"content", "error"}``, as ``call_tool`` gives it)."""
        call = {"id": call_id, "name": name, "arguments": arguments, "requestor": requestor}
        self.messages.append({"role": requestor, "content": None, "tool_calls": [call]})
        self.messages.append(
            {
                "role": "tool",
                "id": call_id,
                "content": answer["content"],
                "requestor": requestor,
                "error": answer["error"],
            }
        )
