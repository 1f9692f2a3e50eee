"""Test helpers: drive the resources server over HTTP the way an agent would, and rebuild tau2 trajectories."""

from dataclasses import dataclass, field

import requests
from tau2.data_model.message import AssistantMessage, Message, ToolCall, ToolMessage, UserMessage
from tau2.data_model.simulation import SimulationRun
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

from nemo_tau2.gym.resources_server.bodies import verify_body
from nemo_tau2.tau2_env import prompts

TOOL_ERROR_HEADER = "X-Tau2-Tool-Error"


@dataclass
class HttpEpisode:
    """One episode against the server, remembering everything as tau2 messages."""

    base_url: str
    domain: str
    task_id: str
    session: requests.Session = field(default_factory=requests.Session)
    messages: list[Message] = field(default_factory=list)
    seed_response: dict | None = None

    def seed(self) -> dict:
        response = self.session.post(
            f"{self.base_url}/seed_session", json={"domain": self.domain, "task_id": self.task_id}
        )
        response.raise_for_status()
        self.seed_response = response.json()
        self.messages.append(AssistantMessage(role="assistant", content=prompts.greeting()))
        return self.seed_response

    def call(self, name: str, arguments: dict, requestor: str = "assistant") -> ToolMessage:
        call_id = f"call_{len(self.messages)}"
        route = f"/{name}" if requestor == "assistant" else f"/user_tools/{name}"
        response = self.session.post(self.base_url + route, json=arguments, headers={"X-Tool-Call-Id": call_id})
        assert response.status_code == 200, response.text
        call = ToolCall(id=call_id, name=name, arguments=arguments, requestor=requestor)
        sender = AssistantMessage if requestor == "assistant" else UserMessage
        result = ToolMessage(
            id=call_id,
            role="tool",
            content=response.text,
            requestor=requestor,
            error=response.headers[TOOL_ERROR_HEADER] == "1",
        )
        self.messages += [sender(role=requestor, tool_calls=[call]), result]
        return result

    def say(self, text: str) -> None:
        self.messages.append(AssistantMessage(role="assistant", content=text))

    def verify(self, termination_reason: str = "user_stop") -> dict:
        texts = [m.content for m in self.messages if isinstance(m, AssistantMessage) and m.content]
        greeting = [{"role": "assistant", "content": texts[0]}]  # in the row's input, as the agent sends it
        body = verify_body(texts[1:], termination_reason, input_items=greeting)
        response = self.session.post(f"{self.base_url}/verify", json=body)
        assert response.status_code == 200, response.text
        return response.json()

    def tau2_reward(self, task, termination_reason: str = "user_stop") -> float:
        """What tau2's own evaluator gives this trajectory (the reference)."""
        return tau2_reward(self.domain, task, self.messages, termination_reason)


def tau2_reward(domain: str, task, messages: list[Message], termination_reason: str = "user_stop") -> float:
    """tau2's own ``evaluate_simulation`` of an episode's messages, the user's stop appended (a module function so
    that a process pool can run it: the tau2 side is what parity tests spend their time on)."""
    simulation = SimulationRun(
        id="test",
        task_id=task.id,
        start_time="",
        end_time="",
        duration=0.0,
        termination_reason=termination_reason,
        messages=messages + [UserMessage(role="user", content="###STOP###")],
    )
    return evaluate_simulation(simulation, task, EvaluationType.ALL, solo_mode=False, domain=domain).reward


def play_gold(episode: HttpEpisode, task, corrupt: "callable | None" = None) -> None:
    """Replay the task's gold actions (user-side ones through the user routes), then say the communicate info."""
    for index, action in enumerate(task.evaluation_criteria.actions or []):
        arguments = dict(action.arguments)
        if corrupt is not None:
            arguments = corrupt(index, action, arguments)
        episode.call(action.name, arguments, action.requestor)
    episode.say(" ".join(task.evaluation_criteria.communicate_info or []) or "Is there anything else?")
